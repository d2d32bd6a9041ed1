"""Transformer fusions: attention (ATTN_SCORE, ATTN_OUTPUT, ATTENTION), QKV_PROJ, RMS_NORM, SILU_GATE, ROPE,
KV_UPDATE, and the fused decode layer (GATE_UP, ROPE_QK, head-major QKV_PROJ, residual GEMM).

Attention arrives in three spellings: ``scaled_dot_product_attention`` (torch.export of SDPA
models), ``softmax(q @ kᵀ * scale + mask) @ v`` (eager attention: BERT, ViT) and the ONNX
exporter's ``softmax((q·√s) @ (kᵀ·√s) + mask)`` with a NaN guard. All become
``ATTN_SCORE(q, k, mask)`` then ``ATTN_OUTPUT(p, v)``; grouped-query ``repeat_kv`` (unsqueeze,
expand, reshape) is absorbed, since both ops take k and v with fewer heads than q. ATTN_SCORE whose
probabilities only ATTN_OUTPUT reads then becomes one ``ATTENTION(q, k, v, mask)``.

A decoder layer then takes, per token, RMS_NORM; QKV_PROJ writing q, k and v head-major (the head
split's permute done by its store, ``heads_first``); ROPE_QK (the rotation of q and k, one kernel);
KV_UPDATE of the key and the value cache; ATTENTION over the cache; GEMM(o_proj) with the residual add
folded in (``has_residual``); RMS_NORM; GATE_UP (gate and up projections and SILU_GATE, one contraction
over both weights); GEMM(down_proj) with its residual add: ten kernels.
"""

from __future__ import annotations

import math

from torch_ir.ir import OpNode, TensorMeta
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node, out, residual_problem, shape_attr, temp

x, q, k, v, mask, p = Var("x"), Var("q"), Var("k"), Var("v"), Var("mask"), Var("p")
RESHAPE, PERMUTE, MUL = "aten.reshape.default", "aten.permute.default", "aten.mul.Tensor"


def _walk(m: Match, t: TensorMeta, op_type: str) -> OpNode | None:
    """The producer of ``t`` if it is an ``op_type`` node read only here; it joins the match."""
    producer = m.producer(t)
    if producer is None or producer.op_type != op_type or len(m.users(t)) != 1:
        return None
    m.include(producer)
    return producer


def _unrepeat(m: Match, t: TensorMeta) -> TensorMeta:
    """``repeat_kv(kv)`` = reshape(expand(reshape(kv, [B,Hk,1,T,D]), [B,Hk,g,T,D]), [B,Hk·g,T,D]) -> kv."""
    top = m.producer(t)
    if top is None or top.op_type != RESHAPE or len(m.users(t)) != 1:
        return t
    expand = m.producer(top.inputs[0])
    if expand is None or expand.op_type != "aten.expand.default" or len(m.users(top.inputs[0])) != 1:
        return t
    unsq = m.producer(expand.inputs[0])
    if unsq is None or unsq.op_type != RESHAPE or len(m.users(expand.inputs[0])) != 1:
        return t
    base = unsq.inputs[0]
    five = expand.outputs[0].shape
    if len(base.shape) != 4 or len(five) != 5 or not isinstance(five[2], int) or not isinstance(base.shape[1], int):
        return t
    b, hk, tt, d = base.shape
    if list(unsq.outputs[0].shape) != [b, hk, 1, tt, d] or list(t.shape) != [b, hk * five[2], tt, d]:
        return t
    for n in (top, expand, unsq):
        m.include(n)
    return base


def _is_last_two_swap(dims: list[int], rank: int) -> bool:
    return [d % rank for d in dims] == list(range(rank - 2)) + [rank - 1, rank - 2]


def _scaled(m: Match, t: TensorMeta) -> tuple[TensorMeta, float]:
    """t = mul(a, c) with a scalar c read only here -> (a, c); else (t, 1)."""
    mul = m.producer(t)
    c = mul.attrs.get("other") if mul is not None and mul.op_type == MUL and len(mul.inputs) == 1 else None
    if not isinstance(c, (int, float)) or isinstance(c, bool) or len(m.users(t)) != 1:
        return t, 1.0
    m.include(mul)
    return mul.inputs[0], float(c)


def _masked_fill(m: Match, t: TensorMeta) -> tuple[TensorMeta, TensorMeta | None]:
    """masked_fill(s, not(keep), -inf) -> (s, keep): the boolean form ATTN_SCORE takes (True keeps)."""
    fill = m.producer(t)
    if fill is None or fill.op_type != "aten.masked_fill.Scalar" or len(m.users(t)) != 1:
        return t, None
    if fill.attrs.get("value") not in ({"float": "-inf"}, float("-inf")):
        return t, None
    negated = m.producer(fill.inputs[1])
    if negated is None or negated.op_type not in ("aten.bitwise_not.default", "aten.logical_not.default"):
        return t, None
    m.include(fill)
    if len(m.users(fill.inputs[1])) == 1:
        m.include(negated)
    return fill.inputs[0], negated.inputs[0]


def _score_check(m: Match) -> str | None:
    """softmax(scale · q @ kᵀ [+ mask], -1): parse it into m's q, k, mask and scale."""
    root = m.node()
    if root.attrs.get("dim") not in (-1, len(out(m).shape) - 1) or len(out(m).shape) != 4:
        return "softmax over a dim other than the last of a 4-D score"
    logits, bias = m["x"], None
    add = m.producer(logits)
    if add is not None and add.op_type == "aten.add.Tensor" and len(add.inputs) == 2 and len(m.users(logits)) == 1:
        m.include(add)
        logits, bias = add.inputs
        if m.producer(logits) is None or m.producer(logits).op_type not in (MUL, "aten.matmul.default"):
            logits, bias = bias, logits
    if bias is None:
        logits, bias = _masked_fill(m, logits)
    logits, scale = _scaled(m, logits)
    matmul = m.producer(logits)
    if matmul is None or matmul.op_type != "aten.matmul.default" or len(m.users(logits)) != 1:
        return None  # not attention: a plain softmax (the SOFTMAX rule takes it)
    m.include(matmul)
    query, key_t = matmul.inputs
    query, q_scale = _scaled(m, query)
    key_t, k_scale = _scaled(m, key_t)
    perm = m.producer(key_t)
    if perm is None or perm.op_type != PERMUTE or len(key_t.shape) != 4:
        return "the second operand of q @ kᵀ is not a permuted key"
    if len(m.users(key_t)) == 1:
        m.include(perm)
    dims = list(perm.attrs["dims"])
    if not _is_last_two_swap(dims, 4):  # kᵀ = permute(k_bthd, [0,2,3,1]): k itself is a permute of it
        m.data["k_from"] = (perm.inputs[0], dims[:2] + [dims[3], dims[2]])
    m.tensors.update(q=query, k=_unrepeat(m, perm.inputs[0]))
    if bias is not None:
        m.tensors["mask"] = bias
    m.data["scale"] = scale * q_scale * k_scale
    return None


def _attn_score(m: Match):
    if "q" not in m.tensors:
        return None
    key, pre = m["k"], []
    if "k_from" in m.data:
        src, dims = m.data["k_from"]
        key = temp(m, src, [src.shape[d] for d in dims], "_k")
        pre = [node(m, PERMUTE, [src], {"dims": dims}, [key], suffix="_k")]
    inputs = [m["q"], key] + ([m["mask"]] if "mask" in m.tensors else [])
    return pre + [node(m, "ATTN_SCORE", inputs, {"scale": m.data["scale"], "causal": False})]


def _scaled_query(m: Match):
    """ATTN_SCORE(heads(q · c), k) -> ATTN_SCORE(heads(q), k, scale · c), heads = permute(reshape(.)).

    Whisper and BART scale the query projection before splitting it into heads; as a scale of the score
    it costs nothing, and the projection is again read by a head split only (so QKV_PROJ can take it)."""
    c = m.node("scale").attrs.get("other")
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        return None
    score, split, perm = m.node(), m.node("split"), m.node("perm")
    src = m["x"]
    split_out = temp(m, src, list(split.outputs[0].shape), "_q")
    perm_out = temp(m, src, list(perm.outputs[0].shape), "_qh")
    return [node(m, RESHAPE, [src], dict(split.attrs), [split_out], suffix="_q"),
            node(m, PERMUTE, [split_out], dict(perm.attrs), [perm_out], suffix="_qh"),
            node(m, score.op_type, [perm_out, *score.inputs[1:]], {**score.attrs,
                                                                    "scale": score.attrs["scale"] * float(c)})]


def _sdpa_check(m: Match) -> str | None:
    attrs = m.node().attrs
    if attrs.get("dropout_p", 0.0) not in (0, 0.0):
        return "dropout inside attention (training mode)"
    if len(m.node().inputs) > 4:
        return "an attention with extra inputs"
    return None


def _sdpa(m: Match):
    root = m.node()
    query, key, value = root.inputs[:3]
    attrs = root.attrs
    scale = attrs.get("scale") or 1.0 / math.sqrt(query.shape[-1])
    key, value = _unrepeat(m, key), _unrepeat(m, value)
    probs = temp(m, query, [*query.shape[:-1], root.inputs[1].shape[-2]], "_p")
    return [node(m, "ATTN_SCORE", [query, key, *root.inputs[3:4]],
                 {"scale": scale, "causal": bool(attrs.get("is_causal", False))}, [probs], suffix="_score"),
            node(m, "ATTN_OUTPUT", [probs, value], {"merge_heads": False})]


def _nan_guard(m: Match):
    """where(isnan(p), 0, p) after ATTN_SCORE -> p: ATTN_SCORE already gives 0 for fully masked rows."""
    producer = m.producer(m["p"])
    if producer is None or producer.op_type != "ATTN_SCORE" or m.scalar(m["z"]) != 0:
        return None
    return m["p"]


def _attn_output(m: Match):
    producer = m.producer(m["p"])
    if producer is None or producer.op_type != "ATTN_SCORE":
        return None
    return [node(m, "ATTN_OUTPUT", [m["p"], _unrepeat(m, m["v"])], {"merge_heads": False})]


def _merge_heads(m: Match):
    """reshape(permute(ATTN_OUTPUT(p, v), [0, 2, 1, 3]), [B, T, H·D]) -> ATTN_OUTPUT(p, v, merge_heads);
    the same for ATTENTION."""
    attn, perm = m.node("attn"), m.node("perm")
    if attn.attrs.get("merge_heads") or perm.attrs["dims"] != [0, 2, 1, 3]:
        return None
    b, h, t, d = out(m, "attn").shape
    if list(out(m).shape) != [b, t, h * d if isinstance(h, int) and isinstance(d, int) else None]:
        return None
    return [node(m, attn.op_type, list(attn.inputs), {**attn.attrs, "merge_heads": True})]


def _attention(m: Match):
    """ATTN_OUTPUT(ATTN_SCORE(q, k, mask), v) -> ATTENTION(q, k, v, mask): the probabilities stay in the kernel."""
    score = m.node("score")
    q_, k_, *mask_ = score.inputs
    return [node(m, "ATTENTION", [q_, k_, m["v"], *mask_], {
        "scale": score.attrs["scale"], "causal": bool(score.attrs.get("causal", False)),
        "merge_heads": bool(m.node().attrs.get("merge_heads", True))})]


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


a, bb, z = Var("a"), Var("b"), Var("z")

ATTENTION_RULES = [
    Rule("sdpa", "attention", Op("aten.scaled_dot_product_attention.default", q, k, v, exact_arity=False),
         _sdpa, check=_sdpa_check, doc="scaled_dot_product_attention -> ATTN_SCORE + ATTN_OUTPUT"),
    Rule("attention_score", "attention", Op(("aten.softmax.int", "aten._softmax.default"), x), _attn_score,
         check=_score_check, doc="softmax(q @ kᵀ · scale [+ mask]) -> ATTN_SCORE(q, k, mask)"),
    Rule("attention_nan_guard", "attention",
         Op("aten.where.self", Op("aten.isnan.default", p), z, p), _nan_guard,
         doc="where(isnan(p), 0, p) of an ATTN_SCORE -> p (ONNX's guard for fully masked rows)"),
    Rule("attention_scaled_query", "attention",
         Op(("ATTN_SCORE", "ATTENTION"), Op(PERMUTE, Op(RESHAPE, Op(MUL, x, name="scale"), name="split"),
                                            name="perm"), exact_arity=False), _scaled_query,
         doc="ATTN_SCORE or ATTENTION(heads(q · c), k, ...) -> the same of heads(q), scale · c "
             "(Whisper's scaled query)"),
    Rule("attention_output", "attention", Op("aten.matmul.default", p, v), _attn_output,
         doc="ATTN_SCORE(...) @ v -> ATTN_OUTPUT(p, v)"),
    Rule("attention_merge_heads", "attention",
         Op(RESHAPE, Op(PERMUTE, Op(("ATTN_OUTPUT", "ATTENTION"), exact_arity=False, name="attn"), name="perm")),
         _merge_heads, doc="reshape(permute(ATTN_OUTPUT or ATTENTION, [0,2,1,3]), [B,T,H·D]) -> the same op with "
                           "merge_heads"),
    Rule("attention_fused", "attention",
         Op("ATTN_OUTPUT", Op("ATTN_SCORE", q, k, exact_arity=False, name="score"), v), _attention,
         doc="ATTN_OUTPUT(ATTN_SCORE(q, k, mask), v) -> ATTENTION(q, k, v, mask) (probabilities read nowhere else)"),
]

LLM_RULES = [
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
