"""The ``idiom`` and ``stack`` rule families: tinygrad's spellings of common ops -> the ATen op.

tinygrad has few primitives, so ``x.exp()`` arrives as ``exp2(x * log2(e))``, ``sigmoid`` as
``1 / (1 + exp2(x * -log2(e)))``, ``x / y`` as ``x * (1 / y)``, ``-x`` as ``x * -1``, ``x - y``
as ``x + y * -1``, ``rsqrt`` as ``1 / sqrt(x)``, ``mean`` as ``sum(x) * (1 / n)``, ``square`` as
``x * x``, ``relu`` as ``where(0 < x, x, 0)`` and ``cat`` as a STACK on a new leading axis, permuted
and reshaped. Each rule undoes one spelling; they chain (``x * sigmoid(x)`` then becomes ``silu``,
and RMSNorm's ``x * rsqrt(mean(x * x) + eps)`` reads as torch.export writes it, so the normalization
passes find RMS_NORM in it). Rules that test a constant's value read the IR's ``constant_values``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch_ir.rewrite import Match, Op, Rule, Var

from ...ir import OpNode, TensorMeta

LOG2E, LN2 = 1 / math.log(2), math.log(2)
STACK = "aten.stack.default"


def _node(m: Match, op_type: str, inputs: list[TensorMeta], attrs: dict[str, Any] | None = None) -> list[OpNode]:
    root = m.node()
    return [OpNode(root.name, op_type, inputs, list(root.outputs), attrs or {})]


def idiom_rules(values: Mapping[str, Any]) -> list[Rule]:
    """Rules whose check reads constants: ``is_const(t, 1.0)`` is true for a 0-d constant equal to 1."""
    x, y, c = Var("x"), Var("y"), Var("c")

    def is_const(t: TensorMeta, value: float) -> bool:
        v = values.get(t.name)
        return t.shape == [] and isinstance(v, (int, float)) and math.isclose(v, value, rel_tol=1e-6)

    def unary(op_type: str, const: float, bind: str = "c"):
        return lambda m: _node(m, op_type, [m["x"]]) if is_const(m[bind], const) else None

    def is_float(t: TensorMeta) -> bool:
        return t.dtype.startswith(("float", "bfloat"))

    def where_true(m: Match) -> TensorMeta | None:
        return m["x"] if values.get(m["c"].name) is True and m["x"].shape == m.node().outputs[0].shape else None

    def sigmoid(m: Match) -> list[OpNode] | None:
        return _node(m, "aten.sigmoid.default", [m["x"]]) if is_const(m["one"], 1.0) and is_const(m["c"], -LOG2E) \
            else None

    def sub(m: Match) -> list[OpNode] | None:
        if m.node().outputs[0].dtype == "bool":
            return None
        return _node(m, "aten.sub.Tensor", [m["x"], m["y"]])

    def neg(m: Match) -> list[OpNode] | None:
        x, out = m["x"], m.node().outputs[0]
        if not is_const(m["c"], -1.0) or out.dtype == "bool" or x.dtype != out.dtype or x.shape != out.shape:
            return None
        return _node(m, "aten.neg.default", [x])

    def mean(m: Match) -> list[OpNode] | None:
        """sum(x, dims) * (1 / n), n the number of elements summed -> mean(x, dims)."""
        red, x = m.node("sum"), m["x"]
        dims = red.attrs.get("dim")
        if "dtype" in red.attrs or not isinstance(dims, list) or not dims or not is_float(m.node().outputs[0]):
            return None
        if len(m.users(red.outputs[0])) != 1:
            return None  # the sum is read elsewhere too: keep it, rather than computing it twice
        if not is_const(m["c"], float(math.prod(x.shape[d] for d in dims))):
            return None
        return _node(m, "aten.mean.dim", [x], {"dim": list(dims), "keepdim": bool(red.attrs.get("keepdim"))})

    def square_summed(m: Match) -> list[OpNode] | None:
        """x * x read only by sums or means -> pow(x, 2): the squares of a variance or an RMS norm.

        Found once the reduction reads the product directly (after ``reduce_axes``, in a later sweep)."""
        out = m.node().outputs[0]
        if not is_float(out) or out.shape != m["x"].shape or not m.users(out) or \
                any(u.op_type not in ("aten.sum.dim_IntList", "aten.mean.dim") for u in m.users(out)):
            return None
        return _node(m, "aten.pow.Tensor_Scalar", [m["x"]], {"exponent": 2})

    return [
        Rule("relu", "idiom", Op("aten.where.self", Op("aten.lt.Tensor", Var("zero"), x), x, Var("zero")),
             lambda m: _node(m, "aten.relu.default", [m["x"]]) if is_const(m["zero"], 0.0) else None,
             doc="where(0 < x, x, 0) -> relu(x)"),
        Rule("exp", "idiom", Op("aten.exp2.default", Op("aten.mul.Tensor", x, c)), unary("aten.exp.default", LOG2E),
             doc="exp2(x * log2(e)) -> exp(x)"),
        Rule("log", "idiom", Op("aten.mul.Tensor", Op("aten.log2.default", x), c), unary("aten.log.default", LN2),
             doc="log2(x) * ln(2) -> log(x)"),
        Rule("sigmoid", "idiom", Op("aten.reciprocal.default", Op("aten.add.Tensor", Var("one"), Op(
            "aten.exp2.default", Op("aten.mul.Tensor", x, c)))), sigmoid,
             doc="1 / (1 + exp2(x * -log2(e))) -> sigmoid(x)"),
        Rule("silu", "idiom", Op("aten.mul.Tensor", x, Op("aten.sigmoid.default", x)),
             lambda m: _node(m, "aten.silu.default", [m["x"]]), doc="x * sigmoid(x) -> silu(x)"),
        Rule("neg", "idiom", Op("aten.mul.Tensor", x, c), neg, doc="x * -1 -> neg(x)"),
        Rule("sub", "idiom", Op("aten.add.Tensor", x, Op("aten.neg.default", y)), sub, doc="x + neg(y) -> x - y"),
        Rule("rsqrt", "idiom", Op("aten.reciprocal.default", Op("aten.sqrt.default", x)),
             lambda m: _node(m, "aten.rsqrt.default", [m["x"]]), doc="1 / sqrt(x) -> rsqrt(x) (tinygrad's rsqrt)"),
        Rule("mean", "idiom", Op("aten.mul.Tensor", Op("aten.sum.dim_IntList", x, name="sum"),
                                 Op("aten.reciprocal.default", c)), mean,
             doc="sum(x, dims) * (1 / n), n the elements summed -> mean(x, dims)", shared_interior=True),
        Rule("square_summed", "idiom", Op("aten.mul.Tensor", x, x), square_summed,
             doc="x * x read only by sums or means -> pow(x, 2) (squares summed, as torch.export writes them)"),
        Rule("div", "idiom", Op("aten.mul.Tensor", x, Op("aten.reciprocal.default", y)),
             lambda m: _node(m, "aten.div.Tensor", [m["x"], m["y"]]) if m["x"].dtype.startswith(("float", "bfloat"))
             else None, doc="x * (1 / y) -> x / y"),
        Rule("where_true", "idiom", Op("aten.where.self", Op("aten.expand.default", c), x, y), where_true,
             doc="where(True, x, y) -> x (tinygrad's pooling masks)", shared_interior=True),
    ] + reduce_rules() + stack_rules()


# -- reduce family: REDUCE's permute-to-front and reshape-back, folded into the ATen reduction -------

REDUCES = ("aten.sum.dim_IntList", "aten.amax.default")


def _reduce_of_permute(m: Match) -> list[OpNode] | None:
    root, dims = m.node(), m.node("perm").attrs["dims"]
    k = len(root.attrs["dim"])
    if root.attrs["dim"] != list(range(k)) or dims[k:] != sorted(dims[k:]):
        return None  # the kept axes would come out in another order
    return _node(m, root.op_type, [m["x"]], {**root.attrs, "dim": sorted(dims[:k])})


def _keepdim(m: Match) -> list[OpNode] | None:
    red, x, out = m.node("red"), m["x"], m.node().outputs[0].shape
    dims = red.attrs["dim"]
    if red.attrs.get("keepdim") or out != [1 if i in dims else d for i, d in enumerate(x.shape)]:
        return None
    return _node(m, red.op_type, [x], {**red.attrs, "keepdim": True})


def _softmax(m: Match) -> list[OpNode] | None:
    """e / sum(e, d, keepdim) with e = exp(x - amax(x, d, keepdim)) -> softmax(x, d)."""
    exp = m.producer(m["e"])
    sub = m.producer(exp.inputs[0]) if exp is not None and exp.op_type == "aten.exp.default" else None
    mx = m.producer(sub.inputs[1]) if sub is not None and sub.op_type == "aten.sub.Tensor" else None
    if mx is None or mx.op_type != "aten.amax.default" or mx.inputs[0].name != sub.inputs[0].name:
        return None
    dims, sum_dims = mx.attrs["dim"], m.node("sum").attrs["dim"]
    if len(dims) != 1 or dims != sum_dims or not mx.attrs.get("keepdim") or not m.node("sum").attrs.get("keepdim"):
        return None
    return _node(m, "aten._softmax.default", [sub.inputs[0]], {"dim": dims[0], "half_to_float": False})


def reduce_rules() -> list[Rule]:
    x = Var("x")
    return [
        Rule("reduce_axes", "reduce", Op(REDUCES, Op("aten.permute.default", x, name="perm")), _reduce_of_permute,
             doc="reduce(permute(x), leading axes) -> reduce(x, the axes they came from)", shared_interior=True),
        Rule("keepdim", "reduce", Op("aten.reshape.default", Op(REDUCES, x, name="red")), _keepdim,
             doc="reshape(reduce(x)) restoring the reduced axes as 1 -> reduce(x, keepdim=True)"),
        Rule("softmax", "reduce", Op("aten.div.Tensor", Var("e"), Op("aten.sum.dim_IntList", Var("e"), name="sum")),
             _softmax, doc="exp(x - max(x)) / sum(exp(x - max(x))) -> softmax(x)"),
    ]


# -- stack family: Tensor.stack and Tensor.cat ---------------------------------------------------

def _moves_axis_zero_to(dims: list[int]) -> int | None:
    """The axis d such that ``dims`` moves axis 0 to position d, keeping the others in order."""
    if 0 not in dims:
        return None
    d = dims.index(0)
    return d if [a for a in dims if a != 0] == list(range(1, len(dims))) else None


def stack_rules() -> list[Rule]:
    def stack_at(m: Match) -> list[OpNode] | None:
        d = _moves_axis_zero_to(m.node().attrs["dims"])
        return None if not d else _node(m, STACK, list(m.node("stack").inputs), {**m.node("stack").attrs, "dim": d})

    def cat(m: Match) -> list[OpNode] | None:
        st, out = m.node("stack"), m.node().outputs[0].shape
        d, parts = st.attrs.get("dim", 0), st.inputs
        shape = list(parts[0].shape)
        if any(list(p.shape) != shape for p in parts) or d >= len(shape):
            return None
        if out != shape[:d] + [shape[d] * len(parts)] + shape[d + 1:]:
            return None  # the reshape does not merge the new axis with the one after it
        return _node(m, "aten.cat.default", list(parts), {"tensors": list(range(len(parts))), "dim": d})

    stack = Op(STACK, exact_arity=False, name="stack")
    return [
        Rule("stack_axis", "stack", Op("aten.permute.default", stack), stack_at,
             doc="permute(stack(xs), axis 0 -> d) -> stack(xs, dim=d)"),
        Rule("cat", "stack", Op("aten.reshape.default", stack), cat,
             doc="reshape(stack(xs, dim=d)) merging axes d, d+1 -> cat(xs, dim=d)"),
    ]
