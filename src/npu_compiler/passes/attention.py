"""Attention fusions: ATTN_SCORE, ATTN_OUTPUT and ATTENTION (the ``attention`` rule family).

Attention arrives in three spellings: ``scaled_dot_product_attention`` (torch.export of SDPA
models), ``softmax(q @ kᵀ * scale + mask) @ v`` (eager attention: BERT, ViT) and the ONNX
exporter's ``softmax((q·√s) @ (kᵀ·√s) + mask)`` with a NaN guard. All become
``ATTN_SCORE(q, k, mask)`` then ``ATTN_OUTPUT(p, v)``; grouped-query ``repeat_kv`` (unsqueeze,
expand, reshape) is absorbed, since both ops take k and v with fewer heads than q. ATTN_SCORE whose
probabilities only ATTN_OUTPUT reads then becomes one ``ATTENTION(q, k, v, mask)``.
"""

from __future__ import annotations

import math

from torch_ir.ir import TensorMeta
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node, out, temp

x, q, k, v, p, z = Var("x"), Var("q"), Var("k"), Var("v"), Var("p"), Var("z")
RESHAPE, PERMUTE, MUL = "aten.reshape.default", "aten.permute.default", "aten.mul.Tensor"


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
