"""Canonicalization: one form for each thing frontends spell several ways.

``view``/``_unsafe_view``/``unsqueeze``/``squeeze``/``flatten`` become ``reshape`` to the output
shape; ``transpose`` becomes ``permute``; chains of either compose; a binary op with a one-element
constant operand takes it as a scalar attribute (``pow(x, c)`` -> ``pow.Tensor_Scalar``, as
torch.export writes it); casts become ``_to_copy``; ``reciprocal(sqrt(x))`` becomes ``rsqrt``,
``x * sigmoid(x)`` becomes ``silu``; ``linear``, ``addmm``, ``mm`` and ``matmul`` by a weight become
``GEMM`` (the NPU op), and a bias added afterwards joins it.
"""

from __future__ import annotations

import math
from dataclasses import replace as dc_replace

from torch_ir.ir import OpNode
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import VIEWS, node, norm_dim, out, prod, shape_attr, static, temp

x, y, w, b = Var("x"), Var("y"), Var("w"), Var("b")
RESHAPE, PERMUTE = "aten.reshape.default", "aten.permute.default"
MUL, ADD = "aten.mul.Tensor", "aten.add.Tensor"
PAD, SPLIT, CAT = "aten.pad.default", "aten.split_with_sizes.default", "aten.cat.default"


# -- views ----------------------------------------------------------------------------------------

def _to_reshape(m: Match):
    root = m.node()
    if root.op_type == RESHAPE and root.attrs.get("shape") == shape_attr(out(m).shape):
        return None  # already canonical
    return [node(m, RESHAPE, [m["x"]], {"shape": shape_attr(out(m).shape)})]


def _reshape_of_reshape(m: Match):
    return [node(m, RESHAPE, [m["x"]], {"shape": shape_attr(out(m).shape)})]


def _transpose_to_permute(m: Match):
    root, rank = m.node(), len(m["x"].shape)
    dims = list(range(rank))
    if root.op_type == "aten.t.default":
        dims = dims[::-1]
    else:
        a, c = norm_dim(root.attrs["dim0"], rank), norm_dim(root.attrs["dim1"], rank)
        dims[a], dims[c] = dims[c], dims[a]
    return [node(m, PERMUTE, [m["x"]], {"dims": dims})]


def _permute_of_permute(m: Match):
    inner = [d % len(m["x"].shape) for d in m.node("inner").attrs["dims"]]
    outer = [d % len(m["x"].shape) for d in m.node().attrs["dims"]]
    return [node(m, PERMUTE, [m["x"]], {"dims": [inner[d] for d in outer]})]


def _flattened_transpose(m: Match):
    """reshape(permute(reshape(x, [N, a, b]), [0, 2, 1]), [..., b, a]) -> permute(reshape(x, [..., a, b]), swap).

    ONNX exports of ``k.transpose(-1, -2)`` on 4-D tensors take this detour through 3-D.
    """
    flat, final = m.node("flat").outputs[0].shape, out(m).shape
    if m.node("perm").attrs["dims"] != [0, 2, 1] or len(flat) != 3 or len(final) < 3:
        return None
    n, a, c = flat
    if list(final[-2:]) != [c, a] or prod(list(final[:-2])) != n or not static(list(final)):
        return None
    unflat_shape = list(final[:-2]) + [a, c]
    unflat = temp(m, m["x"], unflat_shape, "_unflat")
    rank = len(final)
    dims = list(range(rank - 2)) + [rank - 1, rank - 2]
    return [node(m, RESHAPE, [m["x"]], {"shape": shape_attr(unflat_shape)}, [unflat], suffix="_unflat"),
            node(m, PERMUTE, [unflat], {"dims": dims})]


# -- scalars and elementwise ----------------------------------------------------------------------

_BINARY = ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.pow.Tensor_Tensor")
_COMMUTATIVE = ("aten.add.Tensor", "aten.mul.Tensor")


def _scalar_operand(m: Match):
    """``op(x, c)`` with c a one-element constant -> ``op(x, other=c)`` (torch.export's form)."""
    root = m.node()
    a, c = m["x"], m["y"]
    value = m.scalar(c) if c.numel() == 1 else None
    if value is None and root.op_type in _COMMUTATIVE and a.numel() == 1:
        a, c, value = c, a, m.scalar(a)
    if value is None or isinstance(value, bool) or list(a.shape) != list(out(m).shape):
        return None  # not a scalar operand, or the constant broadcasts the result to a larger shape
    if a.dtype != out(m).dtype:
        return None  # type promotion depends on the operand: leave it as it is
    if root.op_type == "aten.pow.Tensor_Tensor":
        return [node(m, "aten.pow.Tensor_Scalar", [a], {"exponent": value})]
    attrs = {k: v for k, v in root.attrs.items() if k != "other"}
    return [node(m, root.op_type, [a], {**attrs, "other": value})]


def _div_to_mul(m: Match):
    other = m.node().attrs.get("other")
    if not isinstance(other, (int, float)) or isinstance(other, bool) or other == 0 or "float" not in out(m).dtype:
        return None
    return [node(m, "aten.mul.Tensor", [m["x"]], {"other": 1.0 / other})]


def _cast(m: Match):
    root = m.node()
    if root.op_type == "aten._to_copy.default" and set(root.attrs) == {"dtype"}:
        return None  # already canonical
    if m["x"].dtype == out(m).dtype:
        return None  # an identity: the clean-up rules drop it
    return [node(m, "aten._to_copy.default", [m["x"]], {"dtype": {"dtype": out(m).dtype}})]


def _global_avg_pool(m: Match):
    if m.node().attrs.get("output_size") not in ([1, 1], 1):
        return None
    return [node(m, "aten.mean.dim", [m["x"]], {"dim": [-2, -1], "keepdim": True})]


def _mean_dims(m: Match):
    attrs = m.node().attrs
    dims, rank = attrs.get("dim"), len(m["x"].shape)
    if not isinstance(dims, list):
        return None
    canon = sorted(d - rank if d >= 0 else d for d in dims)
    if canon == dims:
        return None
    return [node(m, "aten.mean.dim", [m["x"]], {**attrs, "dim": canon})]


# -- the tanh approximation of GELU, written out ------------------------------------------------------

_GELU_TANH = {"half": 0.5, "one": 1.0, "cube": 3.0, "coef": 0.044715, "scale": math.sqrt(2.0 / math.pi)}


def _close(value: object, want: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value - want) <= 1e-6 * max(1, want)


def _gelu_tanh(m: Match):
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) -> gelu(x, approximate="tanh") (GPT-2's NewGELU, BLOOM, ...)."""
    values = {"half": m.node("half").attrs.get("other"), "one": m.node("one").attrs.get("other"),
              "cube": m.node("cube").attrs.get("exponent"), "coef": m.node("coef").attrs.get("other"),
              "scale": m.node("scale").attrs.get("other")}
    if not all(_close(values[k], want) for k, want in _GELU_TANH.items()):
        return None
    return [node(m, "aten.gelu.default", [m["x"]], {"approximate": "tanh"})]


def _gelu_tanh_patterns() -> list[Op]:
    """The formula's two products and one sum in either operand order."""
    cubic = Op(MUL, Op("aten.pow.Tensor_Scalar", x, name="cube"), name="coef")
    patterns = []
    for inner in (Op(ADD, x, cubic, name="inner"), Op(ADD, cubic, x, name="inner")):
        one = Op(ADD, Op("aten.tanh.default", Op(MUL, inner, name="scale")), name="one")
        half = Op(MUL, x, name="half")
        patterns += [Op(MUL, half, one), Op(MUL, one, half)]
    return patterns


# -- one form for padding, splitting, stacking and constructors ------------------------------------

def _constant_pad(m: Match):
    """constant_pad_nd(x, pad, value) -> pad(x, pad, "constant", value): one padding kernel, every mode."""
    attrs = m.node().attrs
    return [node(m, PAD, [m["x"]], {"pad": list(attrs["pad"]), "mode": "constant",
                                    "value": attrs.get("value", 0.0)})]


def _split_dim(m: Match) -> int | None:
    root = m.node()
    rank = len(m["x"].shape)
    dim = norm_dim(root.attrs.get("dim", 0), rank)
    if not static(list(m["x"].shape)) or not all(static(list(t.shape)) for t in root.outputs):
        return None
    return dim


def _split(m: Match):
    """split(x, size, dim), chunk(x, n, dim) -> split_with_sizes(x, the pieces' sizes, dim)."""
    dim = _split_dim(m)
    if dim is None:
        return None
    sizes = [int(t.shape[dim]) for t in m.node().outputs]
    return [node(m, SPLIT, [m["x"]], {"split_sizes": sizes, "dim": dim})]


def _renamed(m: Match, n: OpNode, suffix: str) -> OpNode:
    """``n`` named after the root plus ``suffix``, or the next free variant: a model's own ``stack_part0`` must
    not meet the ``stack`` + ``_part0`` a rule makes (node names are unique in the graph)."""
    base = m.node().name + suffix
    return dc_replace(n, name=m.ctx.fresh(base, nodes_only=True) if m.ctx is not None else base)


def _stack(m: Match):
    """stack(xs, dim) -> cat(reshape(x) with a 1 inserted at dim, ...): views and one concatenation."""
    root, result = m.node(), out(m)
    dim = norm_dim(root.attrs.get("dim", 0), len(result.shape))
    inputs = root.inputs
    if not static(list(result.shape)) or list(root.attrs.get("tensors", [])) != list(range(len(inputs))):
        return None
    parts = [temp(m, t, [*t.shape[:dim], 1, *t.shape[dim:]], f"_part{i}") for i, t in enumerate(inputs)]
    nodes = [_renamed(m, node(m, RESHAPE, [t], {"shape": shape_attr(list(p.shape))}, [p]), f"_part{i}")
             for i, (t, p) in enumerate(zip(inputs, parts))]
    return nodes + [node(m, CAT, parts, {"tensors": list(range(len(parts))), "dim": dim})]


def _concat(m: Match):
    return [node(m, CAT, list(m.node().inputs), dict(m.node().attrs))]


def _as_other(m: Match):
    """reshape_as(x, y), expand_as(x, y) -> reshape, expand to y's shape (y's values are not read)."""
    shape = list(out(m).shape)
    if m.node().op_type == "aten.reshape_as.default":
        return [node(m, RESHAPE, [m["x"]], {"shape": shape_attr(shape)})]
    return [node(m, "aten.expand.default", [m["x"]], {"size": shape_attr(shape)})]


_EXTREMES = {"aten.max.other": "aten.maximum.default", "aten.min.other": "aten.minimum.default"}


def _extreme(m: Match):
    return [node(m, _EXTREMES[m.node().op_type], [m["x"], m["y"]])]


# -- one form for what the ONNX exporter spells otherwise (masks, a row picked by index) ------------------

_BOOL_OPS = {"aten.__and__.Tensor": "aten.logical_and.default", "aten.bitwise_and.Tensor": "aten.logical_and.default",
             "aten.__or__.Tensor": "aten.logical_or.default", "aten.bitwise_or.Tensor": "aten.logical_or.default"}


def _logical(m: Match):
    """a & b, a | b of booleans -> logical_and, logical_or (ONNX has And/Or only for booleans)."""
    if not (m["x"].dtype == m["y"].dtype == out(m).dtype == "bool"):
        return None
    return [node(m, _BOOL_OPS[m.node().op_type], [m["x"], m["y"]])]


def _where_scalar(m: Match):
    """where(c, a, k) with k a one-element constant -> where.ScalarOther(c, a, other=k) (torch.export's form
    of a mask made additive; the ONNX exporter gives both values as constants)."""
    cond, a, k = m.node().inputs
    value = m.scalar(k) if k.numel() == 1 else None
    if value is None or isinstance(value, bool) or len(k.shape) > len(out(m).shape) or a.dtype != out(m).dtype:
        return None
    return [node(m, "aten.where.ScalarOther", [cond, a], {"other": value})]


def _picked_row(m: Match):
    """reshape(index_select(x, d, [i]), shape without d) -> select(x, d, i) (ONNX's Gather of one index)."""
    picked, index = m.node("pick"), m["i"]
    value = m.scalar(index) if index.numel() == 1 else None
    rank = len(m["x"].shape)
    dim = norm_dim(picked.attrs.get("dim", 0), rank)
    expected = [s for j, s in enumerate(m["x"].shape) if j != dim]
    if not isinstance(value, int) or isinstance(value, bool) or list(out(m).shape) != expected:
        return None
    return [node(m, "aten.select.int", [m["x"]], {"dim": dim, "index": value})]


# -- GEMM -----------------------------------------------------------------------------------------

def _linear(m: Match):
    inputs = [m["x"], m["w"]] + ([m.node().inputs[2]] if len(m.node().inputs) > 2 else [])
    return [node(m, "GEMM", inputs, {"trans_b": True})]


def _addmm(m: Match):
    attrs = m.node().attrs
    if attrs.get("beta", 1) != 1 or attrs.get("alpha", 1) != 1:
        return None
    return [node(m, "GEMM", [m["x"], m["w"], m["b"]], {"trans_b": False})]


def _matmul_weight_check(m: Match) -> str | None:
    if not m.is_param(m["w"]):
        return None  # a product of two activations: attention, handled there
    if len(m["w"].shape) != 2:
        return f"weight {m['w'].name!r} has rank {len(m['w'].shape)}; GEMM takes a 2-D weight"
    return None


def _matmul_weight(m: Match):
    if not m.is_param(m["w"]) or len(m["x"].shape) < 2:  # the check rejected weights of another rank
        return None
    return [node(m, "GEMM", [m["x"], m["w"]], {"trans_b": False})]


def _gemm_bias(m: Match):
    """GEMM(x, w) + b with b a weight of shape [N] -> GEMM(x, w, b)."""
    gemm = m.node("gemm")
    bias = m["b"]
    if not m.is_param(bias) or gemm.attrs.get("activation") or len(gemm.inputs) != 2:
        return None
    if list(bias.shape) != [out(m, "gemm").shape[-1]] or out(m).shape != out(m, "gemm").shape:
        return None  # not a per-output-feature bias of the GEMM's own shape
    return [node(m, "GEMM", [*gemm.inputs[:2], bias], dict(gemm.attrs))]


def _gemm_flattened(m: Match):
    """reshape(GEMM(reshape(x, [M, K])), [..., N]) -> GEMM(x): the 2-D detour of addmm/ONNX Gemm."""
    gemm = m.node("gemm")
    src, result = m["x"], out(m)
    if gemm.attrs.get("trans_a") or list(src.shape[:-1]) != list(result.shape[:-1]) or len(src.shape) < 2:
        return None
    if src.shape[-1] != out(m, "flat").shape[-1]:
        return None
    return [node(m, "GEMM", [src, *gemm.inputs[1:]], dict(gemm.attrs))]


def _permuted_weight(m: Match):
    if not m.is_param(m["w"]) or m.node("t").attrs["dims"] != [1, 0]:
        return None
    gemm = m.node()
    attrs = {**gemm.attrs, "trans_b": not gemm.attrs.get("trans_b", True)}
    return [node(m, "GEMM", [gemm.inputs[0], m["w"], *gemm.inputs[2:]], attrs)]


RULES = [
    Rule("view_to_reshape", "canonical", Op(VIEWS, x), _to_reshape,
         doc="view, _unsafe_view, unsqueeze, squeeze, flatten, reshape -> reshape to the output shape"),
    Rule("reshape_of_reshape", "canonical", Op(RESHAPE, Op(RESHAPE, x)), _reshape_of_reshape,
         shared_interior=True, doc="reshape(reshape(x)) -> reshape(x)"),
    Rule("transpose_to_permute", "canonical", Op(("aten.transpose.int", "aten.t.default"), x),
         _transpose_to_permute, doc="transpose(x, a, b), t(x) -> permute(x, dims)"),
    Rule("permute_of_permute", "canonical", Op(PERMUTE, Op(PERMUTE, x, name="inner")), _permute_of_permute,
         shared_interior=True, doc="permute(permute(x)) -> one permute"),
    Rule("flattened_transpose", "canonical",
         Op(RESHAPE, Op(PERMUTE, Op(RESHAPE, x, name="flat"), name="perm")), _flattened_transpose,
         doc="reshape(permute(reshape(x, [N,a,b]), [0,2,1]), [...,b,a]) -> a transpose of the last two dims"),
    Rule("scalar_operand", "canonical", Op(_BINARY, x, y), _scalar_operand,
         doc="add/sub/mul/div/pow with a one-element constant -> the scalar form (other=c, exponent=c)"),
    Rule("div_to_mul", "canonical", Op("aten.div.Tensor", x), _div_to_mul, doc="x / c -> x * (1/c) (floats)"),
    Rule("cast", "canonical", Op(("aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
                                  "aten._to_copy.default", "aten.type_as.default"), x, exact_arity=False), _cast,
         doc="to/type_as/_to_copy that changes the dtype -> _to_copy(x, dtype)"),
    Rule("rsqrt", "canonical", Op("aten.reciprocal.default", Op("aten.sqrt.default", x)),
         lambda m: [node(m, "aten.rsqrt.default", [m["x"]])], doc="reciprocal(sqrt(x)) -> rsqrt(x)"),
    Rule("silu", "canonical", Op("aten.mul.Tensor", x, Op("aten.sigmoid.default", x)),
         lambda m: [node(m, "aten.silu.default", [m["x"]])], doc="x * sigmoid(x) -> silu(x)"),
    Rule("silu_swapped", "canonical", Op("aten.mul.Tensor", Op("aten.sigmoid.default", x), x),
         lambda m: [node(m, "aten.silu.default", [m["x"]])], doc="sigmoid(x) * x -> silu(x)"),
    Rule("global_avg_pool", "canonical", Op("aten.adaptive_avg_pool2d.default", x), _global_avg_pool,
         doc="adaptive_avg_pool2d(x, 1) -> mean(x, [-2, -1], keepdim) (ONNX's GlobalAveragePool reads so)"),
    Rule("mean_dims", "canonical", Op("aten.mean.dim", x), _mean_dims, doc="mean over dims written negative, sorted"),
    *(Rule("gelu_tanh", "canonical", pattern, _gelu_tanh,
           doc="0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) -> gelu(x, approximate=tanh)")
      for pattern in _gelu_tanh_patterns()),
    Rule("logical", "canonical", Op(tuple(_BOOL_OPS), x, y), _logical,
         doc="a & b, a | b of booleans -> logical_and, logical_or"),
    Rule("where_scalar", "canonical", Op("aten.where.self", exact_arity=False), _where_scalar,
         doc="where(c, a, k) with k a one-element constant -> where.ScalarOther(c, a, other=k)"),
    Rule("picked_row", "canonical",
         Op(RESHAPE, Op("aten.index_select.default", x, Var("i"), name="pick")), _picked_row,
         doc="reshape(index_select(x, d, [i])) without dim d -> select(x, d, i)"),
    Rule("constant_pad", "canonical", Op("aten.constant_pad_nd.default", x), _constant_pad,
         doc="constant_pad_nd(x, pad, value) -> pad(x, pad, mode=constant, value)"),
    Rule("split", "canonical", Op(("aten.split.Tensor", "aten.chunk.default"), x), _split,
         doc="split(x, size, dim), chunk(x, n, dim) -> split_with_sizes(x, sizes, dim)"),
    Rule("stack", "canonical", Op("aten.stack.default", exact_arity=False), _stack,
         doc="stack(xs, dim) -> cat of the inputs reshaped with a 1 at dim"),
    Rule("concat", "canonical", Op(("aten.concat.default", "aten.concatenate.default"), exact_arity=False), _concat,
         doc="concat, concatenate -> cat"),
    Rule("as_other", "canonical", Op(("aten.reshape_as.default", "aten.expand_as.default"), x, y), _as_other,
         doc="reshape_as(x, y), expand_as(x, y) -> reshape(x, y's shape), expand(x, y's shape)"),
    Rule("extreme", "canonical", Op(tuple(_EXTREMES), x, y), _extreme,
         doc="max(x, y), min(x, y) of two tensors -> maximum, minimum"),
    Rule("linear", "gemm", Op("aten.linear.default", x, w, exact_arity=False), _linear,
         doc="linear(x, w, b) -> GEMM(x, w, b, trans_b)"),
    Rule("addmm", "gemm", Op("aten.addmm.default", b, x, w), _addmm, doc="addmm(b, x, w) -> GEMM(x, w, b)"),
    Rule("matmul_weight", "gemm", Op(("aten.mm.default", "aten.matmul.default"), x, w), _matmul_weight,
         check=_matmul_weight_check, doc="mm/matmul(x, w) with w a 2-D weight -> GEMM(x, w)"),
    Rule("gemm_bias", "gemm", Op("aten.add.Tensor", Op("GEMM", x, w, name="gemm"), b), _gemm_bias,
         doc="GEMM(x, w) + b -> GEMM(x, w, b) (ONNX MatMul + Add)"),
    Rule("gemm_bias_first", "gemm", Op("aten.add.Tensor", b, Op("GEMM", x, w, name="gemm")), _gemm_bias,
         doc="b + GEMM(x, w) -> GEMM(x, w, b)"),
    Rule("gemm_flattened", "gemm",
         Op(RESHAPE, Op("GEMM", Op(RESHAPE, x, name="flat"), exact_arity=False, name="gemm")), _gemm_flattened,
         doc="reshape(GEMM(reshape(x, [M, K])), [..., N]) -> GEMM(x) on the original rank"),
    Rule("gemm_transposed_weight", "gemm", Op("GEMM", x, Op(PERMUTE, w, name="t"), exact_arity=False),
         _permuted_weight, doc="GEMM(x, permute(w, [1, 0])) -> GEMM(x, w) with trans_b flipped"),
]
