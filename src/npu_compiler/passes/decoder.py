"""Decoder-layer fusions: QKV_PROJ, RMS_NORM, SILU_GATE, ROPE, KV_UPDATE (the ``llm`` rule family), the fused
decode layer (GATE_UP, ROPE_QK, head-major QKV_PROJ) and the residual GEMM (the ``residual`` family).

A decoder layer takes, per token, RMS_NORM; QKV_PROJ writing q, k and v head-major (the head
split's permute done by its store, ``heads_first``); ROPE_QK (the rotation of q and k, one kernel);
KV_UPDATE of the key and the value cache; ATTENTION over the cache (``attention.py``); GEMM(o_proj) with
the residual add folded in (``has_residual``); RMS_NORM; GATE_UP (gate and up projections and SILU_GATE,
one contraction over both weights); GEMM(down_proj) with its residual add: ten kernels.
"""

from __future__ import annotations

from torch_ir.ir import OpNode, TensorMeta
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node, out, residual_problem, shape_attr

x, a, bb = Var("x"), Var("a"), Var("b")
RESHAPE, PERMUTE, MUL = "aten.reshape.default", "aten.permute.default", "aten.mul.Tensor"


def _walk(m: Match, t: TensorMeta, op_type: str) -> OpNode | None:
    """The producer of ``t`` if it is an ``op_type`` node read only here; it joins the match."""
    producer = m.producer(t)
    if producer is None or producer.op_type != op_type or len(m.users(t)) != 1:
        return None
    m.include(producer)
    return producer


# -- QKV_PROJ ------------------------------------------------------------------------------------------

def _heads(m: Match, t: TensorMeta) -> tuple[int | None, int | None]:
    """(heads, head dim) from the reshape that splits a projection into heads, if there is one."""
    for user in m.users(t):
        shape = user.outputs[0].shape
        if user.op_type == RESHAPE and len(shape) == 4 and shape[:2] == list(t.shape[:2]):
            return shape[2], shape[3]
    return None, None


def _siblings_check(m: Match) -> str | None:
    root = m.node()
    if root.attrs.get("activation") or root.attrs.get("trans_a"):
        return None
    gemms = [n for n in m.users(m["x"]) if n.op_type == "GEMM" and n.inputs[0].name == m["x"].name]
    if len(gemms) != 3 or gemms[0] is not root:
        return None  # three projections of one input, found at the first of them
    if any(n.attrs != root.attrs or not all(m.is_param(t) for t in n.inputs[1:]) for n in gemms):
        return "the three projections differ in transposition or activation, or a weight is computed"
    if any(_heads(m, n.outputs[0])[0] is None for n in gemms):
        return "the projections are not split into attention heads"
    for n in gemms[1:]:
        m.absorb(n)
    m.data["gemms"] = gemms
    return None


def _qkv_proj(m: Match):
    if "gemms" not in m.data:
        return None
    gemms = m.data["gemms"]
    outs = [n.outputs[0] for n in gemms]
    heads = [_heads(m, t) for t in outs]
    flags = [len(n.inputs) == 3 for n in gemms]
    params = [n.inputs[1] for n in gemms] + [n.inputs[2] for n in gemms if len(n.inputs) == 3]
    # one flag for all when they agree (the usual case); per projection when not (Whisper's k has no bias)
    has_bias: bool | list[bool] = flags[0] if len(set(flags)) == 1 else flags
    return [node(m, "QKV_PROJ", [m["x"], *params], {
        "splits": [t.shape[-1] for t in outs], "packed": False, "has_bias": has_bias,
        "trans_b": gemms[0].attrs.get("trans_b", True), "num_heads": heads[0][0], "num_kv_heads": heads[1][0],
        "head_dim": heads[0][1]}, outputs=outs)]


def _packed_qkv(m: Match):
    """split(GEMM(x, w_qkv), 3 parts, last dim) -> QKV_PROJ(x, w_qkv, packed) (GPT-2's c_attn)."""
    root, gemm = m.node(), m.node("gemm")
    rank = len(out(m, "gemm").shape)
    if len(root.outputs) != 3 or root.attrs.get("dim") not in (-1, rank - 1) or gemm.attrs.get("activation"):
        return None
    if not m.is_param(gemm.inputs[1]):
        return None
    heads = [_heads(m, t) for t in root.outputs]
    if any(h[0] is None for h in heads):
        return None
    has_bias = len(gemm.inputs) == 3
    return [node(m, "QKV_PROJ", [m["x"], *gemm.inputs[1:]], {
        "splits": [t.shape[-1] for t in root.outputs], "packed": True, "has_bias": has_bias,
        "trans_b": gemm.attrs.get("trans_b", True), "num_heads": heads[0][0], "num_kv_heads": heads[1][0],
        "head_dim": heads[0][1]})]


# -- RMS_NORM, SILU_GATE, ROPE, KV_UPDATE ------------------------------------------------------------

def _rms_check(m: Match) -> str | None:
    """weight · cast(x · rsqrt(mean(x², -1) + eps)): parse into m's x0, eps."""
    weight, normed = m["a"], m["b"]
    if not m.is_param(weight):
        weight, normed = normed, weight
    if not m.is_param(weight) or len(weight.shape) != 1:
        return None
    cast = m.producer(normed)
    if cast is not None and cast.op_type == "aten._to_copy.default" and len(m.users(normed)) == 1:
        m.include(cast)
        normed = cast.inputs[0]
    mul = _walk(m, normed, MUL)
    if mul is None or len(mul.inputs) != 2:
        return None
    for xx, r in (mul.inputs, mul.inputs[::-1]):
        rsqrt = m.producer(r)
        if rsqrt is None or rsqrt.op_type != "aten.rsqrt.default":
            continue
        add = m.producer(rsqrt.inputs[0])
        mean = m.producer(add.inputs[0]) if add is not None and add.op_type == "aten.add.Tensor" else None
        sq = m.producer(mean.inputs[0]) if mean is not None and mean.op_type == "aten.mean.dim" else None
        if sq is None or sq.op_type != "aten.pow.Tensor_Scalar" or sq.attrs.get("exponent") != 2:
            continue
        if sq.inputs[0].name != xx.name or mean.attrs.get("dim") != [-1] or not mean.attrs.get("keepdim"):
            continue
        eps = add.attrs.get("other")
        if not isinstance(eps, (int, float)) or len(add.inputs) != 1:
            continue
        for n in (rsqrt, add, mean, sq):
            m.include(n)
        m.tensors.update(x0=_uncast(m, xx), w=weight)
        m.data["eps"] = float(eps)
        return None
    return None


def _uncast(m: Match, t: TensorMeta) -> TensorMeta:
    """x when t = float32(x) (RMSNorm upcasts half-precision input and casts back)."""
    cast = m.producer(t)
    if cast is not None and cast.op_type == "aten._to_copy.default" and t.dtype == "float32":
        src = cast.inputs[0]
        if src.dtype in ("float16", "bfloat16") and src.dtype == out(m).dtype:
            return src
    return t


def _rms_norm(m: Match):
    if "x0" not in m.tensors:
        return None
    return [node(m, "RMS_NORM", [m["x0"], m["w"]], {"eps": m.data["eps"]})]


def _silu_gate(m: Match):
    return [node(m, "SILU_GATE", [m["a"], m["b"]])]


def _rope_check(m: Match) -> str | None:
    """x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])."""
    for first, second in ((m["a"], m["b"]), (m["b"], m["a"])):
        direct, rotated = m.producer(first), m.producer(second)
        if direct is None or rotated is None or direct.op_type != MUL or rotated.op_type != MUL \
                or len(direct.inputs) != 2 or len(rotated.inputs) != 2:  # x · scalar is not x · cos
            continue
        for xx, cos in (direct.inputs, direct.inputs[::-1]):
            for rot, sin in (rotated.inputs, rotated.inputs[::-1]):
                if _is_rotate_half(m, rot, xx):
                    m.include(direct)
                    m.include(rotated)
                    m.tensors.update(x0=xx, cos=cos, sin=sin)
                    return None
    return None


def _is_rotate_half(m: Match, rot: TensorMeta, xx: TensorMeta) -> bool:
    cat = m.producer(rot)
    if cat is None or cat.op_type != "aten.cat.default" or len(cat.inputs) != 2 or len(m.users(rot)) != 1:
        return False
    neg, low = m.producer(cat.inputs[0]), m.producer(cat.inputs[1])
    high = m.producer(neg.inputs[0]) if neg is not None and neg.op_type == "aten.neg.default" else None
    half = xx.shape[-1] // 2 if isinstance(xx.shape[-1], int) else None
    rank = len(xx.shape)
    if half is None or cat.attrs.get("dim") not in (-1, rank - 1):
        return False
    for s, lo, hi in ((low, 0, half), (high, half, None)):
        if s is None or s.op_type != "aten.slice.Tensor" or s.inputs[0].name != xx.name:
            return False
        end = s.attrs.get("end")
        if s.attrs.get("dim") not in (-1, rank - 1) or s.attrs.get("start", 0) != lo or s.attrs.get("step", 1) != 1:
            return False
        if hi is not None and end != hi:
            return False
        if hi is None and (not isinstance(end, int) or end < 2 * half):
            return False
    for n in (cat, neg, low, high):
        m.include(n)
    return True


def _rope(m: Match):
    if "x0" not in m.tensors:
        return None
    return [node(m, "ROPE", [m["x0"], m["cos"], m["sin"]])]


def _kv_update(m: Match):
    root = m.node()
    dim = root.attrs.get("dim")
    if not isinstance(dim, int):
        return None
    cache, index, new = root.inputs
    return [node(m, "KV_UPDATE", [cache, new, index], {"dim": dim % len(cache.shape)})]


# -- the fused decode layer: head-major QKV_PROJ, ROPE_QK, GATE_UP, residual GEMM --------------------------

def _fresh(m: Match, base: str, *, nodes_only: bool = False) -> str:
    """A name no node (or tensor) of the graph has, drawn from the rewrite call's context."""
    return base if m.ctx is None else m.ctx.fresh(base, nodes_only=nodes_only)


def _outside(m: Match) -> set[str]:
    """Tensors read from outside the node list (graph outputs, buffers' new values): they keep their producer."""
    if m.ctx is None:
        return set()
    ir = m.ctx.ir
    return m.ctx.cached(("llm", "outside"), lambda: {t.name for t in ir.graph_outputs} | set(ir.mutations.values()))


def _head_split(m: Match, t: TensorMeta, width: int, head_dim: int) -> bool:
    """Whether ``t`` [B, T, width] is read only by reshape(t, [B, T, H, D]), read only by permute [0, 2, 1, 3],
    none of them read outside the graph (a returned key would need its own permute back)."""
    users = m.users(t)
    if len(t.shape) != 3 or len(users) != 1 or users[0].op_type != RESHAPE or width % head_dim:
        return False
    split = users[0].outputs[0]
    if list(split.shape) != [*t.shape[:2], width // head_dim, head_dim]:
        return False
    readers = m.users(split)
    if len(readers) != 1 or readers[0].op_type != PERMUTE or [d % 4 for d in readers[0].attrs["dims"]] != [0, 2, 1, 3]:
        return False
    return not {t.name, split.name, readers[0].outputs[0].name} & _outside(m)


def _heads_first_check(m: Match) -> str | None:
    attrs = m.node().attrs
    d = attrs.get("head_dim")
    if attrs.get("heads_first") or not isinstance(d, int) or isinstance(d, bool) or d <= 0:
        return None
    if all(_head_split(m, t, n, d) for t, n in zip(m.node().outputs, attrs["splits"])):
        m.data["heads_first"] = True
    return None  # not (yet) split into heads by reshape + permute: the attention rules may still make it so


def _qkv_heads_first(m: Match):
    """QKV_PROJ whose q, k and v are each split into heads by reshape + permute [0, 2, 1, 3] -> QKV_PROJ writing
    them head-major. The old outputs are given back as reshape(permute(.)) of the new ones, so their readers
    stay valid; ``heads_round_trip`` then makes each head split read the head-major output directly."""
    if "heads_first" not in m.data:
        return None
    root = m.node()
    d, heads, back = root.attrs["head_dim"], [], []
    for t, width in zip(root.outputs, root.attrs["splits"]):
        b, tt = t.shape[0], t.shape[1]
        h = TensorMeta(_fresh(m, f"{t.name}_heads"), [b, width // d, tt, d], t.dtype, role="activation")
        bthd = TensorMeta(_fresh(m, f"{t.name}_bthd"), [b, tt, width // d, d], t.dtype, role="activation")
        heads.append(h)
        back += [OpNode(_fresh(m, f"{t.name}_bthd", nodes_only=True), PERMUTE, [h], [bthd], {"dims": [0, 2, 1, 3]}),
                 OpNode(_fresh(m, f"{t.name}_flat", nodes_only=True), RESHAPE, [bthd], [t],
                        {"shape": shape_attr(list(t.shape))})]
    return [node(m, "QKV_PROJ", list(root.inputs), {**root.attrs, "heads_first": True}, outputs=heads), *back]


def _round_trip(m: Match):
    """permute(reshape(reshape(permute(x, P), S), S'), P⁻¹) -> x, when S' is the first permute's shape."""
    first, second = m.node("p1").attrs.get("dims"), m.node().attrs.get("dims")
    rank = len(m["x"].shape)
    if not isinstance(first, list) or not isinstance(second, list) or len(first) != rank or len(second) != rank:
        return None
    if [first[second[i] % rank] % rank for i in range(rank)] != list(range(rank)):
        return None
    if list(out(m, "r2").shape) != list(out(m, "p1").shape):
        return None
    return m["x"]


def _qkv_source(m: Match, t: TensorMeta) -> tuple[OpNode, int] | None:
    """(QKV_PROJ, output index) that ``t`` is, or is a head split (reshape, permute) of."""
    for _ in range(3):
        producer = m.producer(t)
        if producer is None:
            return None
        if producer.op_type == "QKV_PROJ":
            return producer, [o.name for o in producer.outputs].index(t.name)
        if producer.op_type not in (RESHAPE, PERMUTE):
            return None
        t = producer.inputs[0]
    return None


def _rope_qk(m: Match):
    """ROPE(q, cos, sin) and ROPE(k, cos, sin) of one QKV_PROJ's q and k -> ROPE_QK(q, k, cos, sin), placed at
    the first of the two (the other's inputs are defined before it)."""
    root = m.node()
    source = _qkv_source(m, m["x"])
    if source is None or source[1] not in (0, 1):
        return None
    readers = m.users(m["cos"])
    later = readers[[id(n) for n in readers].index(id(root)) + 1:]
    for other in later:
        if other.op_type != "ROPE" or len(other.inputs) != 3 or other.inputs[1].name != m["cos"].name \
                or other.inputs[2].name != m["sin"].name:
            continue
        twin = _qkv_source(m, other.inputs[0])
        if twin is None or twin[0] is not source[0] or twin[1] != 1 - source[1]:
            continue
        m.absorb(other)
        q_rope, k_rope = (root, other) if source[1] == 0 else (other, root)
        return [node(m, "ROPE_QK", [q_rope.inputs[0], k_rope.inputs[0], m["cos"], m["sin"]],
                     outputs=[q_rope.outputs[0], k_rope.outputs[0]])]
    return None


def _gate_up_check(m: Match) -> str | None:
    gate, up = m.node("gate"), m.node("up")
    if gate is up:
        return "gate and up are one GEMM"
    for g in (gate, up):
        if g.attrs.get("activation") or g.attrs.get("trans_a") or g.attrs.get("has_residual") or len(g.inputs) > 3:
            return "a GEMM with an activation, a transposed input or a residual"
        if not all(m.is_param(t) for t in g.inputs[1:]):
            return "a weight or bias is computed"
    if gate.attrs.get("trans_b", True) != up.attrs.get("trans_b", True):
        return "the two weights are laid out differently (trans_b)"
    if len(gate.inputs) != len(up.inputs):
        return "one projection has a bias and the other not"
    if list(out(m, "gate").shape) != list(out(m, "up").shape):
        return "the two projections differ in width"
    return None


def _gate_up(m: Match):
    gate, up = m.node("gate"), m.node("up")
    has_bias = len(gate.inputs) == 3
    return [node(m, "GATE_UP", [m["x"], gate.inputs[1], up.inputs[1], *gate.inputs[2:], *up.inputs[2:]],
                 {"trans_b": bool(gate.attrs.get("trans_b", True)), "has_bias": has_bias})]


def _residual_check(m: Match) -> str | None:
    gemm, add = m.node("gemm"), m.node()
    if gemm.attrs.get("activation") is not None or gemm.attrs.get("has_residual"):
        return "the GEMM already applies an activation or adds a residual"
    residual, y = m["r"], gemm.outputs[0]
    problem = residual_problem(m, y, add, residual, "GEMM")
    if problem is not None:
        return problem
    if list(out(m).shape) != list(y.shape):
        return "the add broadcasts the GEMM's output: not a residual"
    if not _reads_an_input(m, residual):
        return "the residual is computed from weights and constants alone (a bias), not an activation"
    return None


def _reads_an_input(m: Match, t: TensorMeta) -> bool:
    """Whether ``t`` depends on a graph input: an activation, not something computed from weights alone (which a
    program computes once, at bind time, and a runtime holds as it holds weights)."""
    memo: dict[str, bool] = m.ctx.cache.setdefault(("residual", "reads_an_input"), {}) if m.ctx else {}
    stack = [t]
    while stack:
        current = stack[-1]
        if current.name in memo:
            stack.pop()
            continue
        producer = m.producer(current)
        if producer is None:
            memo[current.name] = not m.is_param(current)
            stack.pop()
            continue
        pending = [i for i in producer.inputs if i.name not in memo]
        if pending:
            stack.extend(pending)
            continue
        memo[current.name] = any(memo[i.name] for i in producer.inputs)
        stack.pop()
    return memo[t.name]


def _residual(m: Match):
    gemm = m.node("gemm")
    return [node(m, "GEMM", [*gemm.inputs, m["r"]],
                 {**gemm.attrs, "has_bias": len(gemm.inputs) == 3, "has_residual": True})]


DECODER_RULES = [
    Rule("qkv_proj", "llm", Op("GEMM", x, Var("w"), exact_arity=False), _qkv_proj, check=_siblings_check,
         doc="three GEMMs of one input split into heads -> QKV_PROJ"),
    Rule("qkv_proj_packed", "llm", Op(("aten.split.Tensor", "aten.split_with_sizes.default"),
                                      Op("GEMM", x, exact_arity=False, name="gemm")), _packed_qkv,
         doc="split(GEMM(x, w_qkv)) into three head-split parts -> QKV_PROJ(packed)"),
    Rule("rms_norm", "llm", Op(MUL, a, bb), _rms_norm, check=_rms_check,
         doc="w · x · rsqrt(mean(x², -1) + eps) (casts around it allowed) -> RMS_NORM"),
    Rule("silu_gate", "llm", Op(MUL, Op("aten.silu.default", a), bb), _silu_gate,
         doc="silu(a) · b -> SILU_GATE(a, b)"),
    Rule("silu_gate_swapped", "llm", Op(MUL, bb, Op("aten.silu.default", a)), _silu_gate,
         doc="b · silu(a) -> SILU_GATE(a, b)"),
    Rule("rope", "llm", Op("aten.add.Tensor", a, bb), _rope, check=_rope_check,
         doc="x·cos + rotate_half(x)·sin -> ROPE(x, cos, sin)"),
    Rule("kv_update", "llm", Op("aten.index_copy.default", x, exact_arity=False), _kv_update,
         doc="index_copy(cache, dim, positions, new) -> KV_UPDATE (the KV-cache write)"),
    Rule("qkv_heads_first", "llm", Op("QKV_PROJ", x, exact_arity=False), _qkv_heads_first, check=_heads_first_check,
         doc="QKV_PROJ whose outputs are each split into heads (reshape, permute [0,2,1,3]) -> QKV_PROJ(heads_first)"),
    Rule("heads_round_trip", "llm",
         Op(PERMUTE, Op(RESHAPE, Op(RESHAPE, Op(PERMUTE, x, name="p1"), name="r1"), name="r2")), _round_trip,
         doc="permute(reshape(reshape(permute(x, P)), shape of permute(x, P)), P⁻¹) -> x"),
    Rule("rope_qk", "llm", Op("ROPE", x, Var("cos"), Var("sin")), _rope_qk,
         doc="ROPE(q, cos, sin) and ROPE(k, cos, sin) of one QKV_PROJ -> ROPE_QK(q, k, cos, sin)"),
    Rule("gate_up", "llm", Op("SILU_GATE", Op("GEMM", x, exact_arity=False, name="gate"),
                              Op("GEMM", x, exact_arity=False, name="up")), _gate_up, check=_gate_up_check,
         doc="SILU_GATE(GEMM(x, w_gate), GEMM(x, w_up)) -> GATE_UP(x, w_gate, w_up): one contraction, one kernel"),
    Rule("gemm_residual", "residual", Op("aten.add.Tensor", Op("GEMM", exact_arity=False, name="gemm"), Var("r")),
         _residual, check=_residual_check,
         doc="GEMM(x) + r, r an activation (it reads a graph input) of the same shape -> GEMM(x, ..., r, "
             "has_residual)"),
    Rule("gemm_residual_swapped", "residual",
         Op("aten.add.Tensor", Var("r"), Op("GEMM", exact_arity=False, name="gemm")), _residual,
         check=_residual_check, doc="r + GEMM(x) -> GEMM(x, ..., r, has_residual)"),
]
