"""Reductions, arg-reductions, cumulative ops and TopK.

The axes of ``ReduceX`` moved from an attribute to an input in opset 13 (ReduceSum) and 18 (the
others): one table entry per form, one shared body.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate (Conv, MatMul, ...)

from __future__ import annotations

from ..context import Ctx, UnsupportedNode
from . import converter


def _dims(ctx: Ctx, x, axes, noop_with_empty_axes: int):
    """The axes to reduce, or None when the node is a no-op (empty axes with the noop flag)."""
    rank = ctx.rank(x)
    if axes is None or len(axes) == 0:
        return None if noop_with_empty_axes else list(range(rank))
    return sorted(a + rank if a < 0 else a for a in axes)


def _float(ctx: Ctx, x):
    return x if ctx.dtype(x).startswith(("float", "bfloat")) else ctx.cast(x, "float32")


_BODIES = {
    "ReduceSum": lambda ctx, x, d, k: ctx.aten("sum.dim_IntList", x, d, k),
    "ReduceMean": lambda ctx, x, d, k: ctx.aten("mean.dim", _float(ctx, x), d, k),
    "ReduceMax": lambda ctx, x, d, k: ctx.aten("amax", x, d, k),
    "ReduceMin": lambda ctx, x, d, k: ctx.aten("amin", x, d, k),
    "ReduceProd": lambda ctx, x, d, k: _prod(ctx, x, d, k),
    "ReduceL1": lambda ctx, x, d, k: ctx.aten("sum.dim_IntList", ctx.aten("abs", x), d, k),
    "ReduceL2": lambda ctx, x, d, k: ctx.aten("sqrt", _float(ctx, _sum_square(ctx, x, d, k))),
    "ReduceSumSquare": lambda ctx, x, d, k: _sum_square(ctx, x, d, k),
    "ReduceLogSum": lambda ctx, x, d, k: ctx.aten("log", ctx.aten("sum.dim_IntList", x, d, k)),
    "ReduceLogSumExp": lambda ctx, x, d, k: ctx.aten("logsumexp", x, d, k),
}
# the opset in which each op's axes became an input
_AXES_INPUT_SINCE = {op: 18 for op in _BODIES} | {"ReduceSum": 13}


def _sum_square(ctx: Ctx, x, dims, keep):
    return ctx.aten("sum.dim_IntList", ctx.aten("mul.Tensor", x, x), dims, keep)


def _prod(ctx: Ctx, x, dims, keep):
    for d in sorted(dims, reverse=True):  # aten.prod reduces one axis at a time
        x = ctx.aten("prod.dim_int", x, d, keep)
    return x


def _reduce(op: str, body):
    def attr_form(ctx: Ctx, x, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        return _apply(ctx, x, axes, keepdims, noop_with_empty_axes)

    def input_form(ctx: Ctx, x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        listed = None if axes is None else ctx.ints(axes, f"{op}'s axes")
        return _apply(ctx, x, listed, keepdims, noop_with_empty_axes)

    def _apply(ctx, x, axes, keepdims, noop):
        dims = _dims(ctx, x, axes, noop)
        if dims is None:
            return x
        if any(ctx.shape(x)[d] == 0 for d in dims):
            raise UnsupportedNode("a reduction over an empty axis (ATen refuses some of them)")
        out = body(ctx, x, dims, bool(keepdims))
        return ctx.cast(out, ctx.dtype(x))

    attr_form.__name__, input_form.__name__ = f"{op}_1", op
    attr_form.__doc__ = input_form.__doc__ = f"{op}: reduce over axes (keepdims, noop_with_empty_axes)"
    return attr_form, input_form


for _op, _body in _BODIES.items():
    _attr, _input = _reduce(_op, _body)
    converter(_op, since=1)(_attr)
    converter(_op, since=_AXES_INPUT_SINCE[_op])(_input)


def _arg(aten_op: str):
    def convert(ctx: Ctx, x, *, axis=0, keepdims=1, select_last_index=0):
        rank = ctx.rank(x)
        axis = axis + rank if axis < 0 else axis
        if not select_last_index:
            return ctx.aten(aten_op, x, axis, bool(keepdims))
        # the last occurrence: search the flipped tensor, then mirror the index
        idx = ctx.aten(aten_op, ctx.aten("flip", x, [axis]), axis, bool(keepdims))
        return ctx.aten("rsub.Scalar", idx, ctx.shape(x)[axis] - 1)
    return convert


ArgMax, ArgMin = _arg("argmax"), _arg("argmin")
ArgMax.__name__, ArgMin.__name__ = "ArgMax", "ArgMin"
converter("ArgMax")(ArgMax)
converter("ArgMin")(ArgMin)


def _cumulative(ctx: Ctx, x, axis, exclusive, reverse, aten_op, identity_op):
    dim = ctx.ints(axis, "the axis")[0]
    dim = dim + ctx.rank(x) if dim < 0 else dim
    y = ctx.aten("flip", x, [dim]) if reverse else x
    if exclusive:
        # shift by one along dim, filling with the identity (0 for sums, 1 for products)
        size = ctx.shape(y)[dim]
        head = ctx.aten(identity_op, ctx.aten("slice.Tensor", y, dim, 0, 1))
        y = ctx.aten("cat", [head, ctx.aten("slice.Tensor", y, dim, 0, size - 1)], dim)
    y = ctx.aten(aten_op, y, dim)
    return ctx.aten("flip", y, [dim]) if reverse else y


@converter("CumSum", since=11)
def CumSum(ctx: Ctx, x, axis, *, exclusive=0, reverse=0):
    return _cumulative(ctx, x, axis, exclusive, reverse, "cumsum", "zeros_like")


@converter("CumProd", since=26)
def CumProd(ctx: Ctx, x, axis, *, exclusive=0, reverse=0):
    return _cumulative(ctx, x, axis, exclusive, reverse, "cumprod", "ones_like")


@converter("TopK", since=11)
def TopK(ctx: Ctx, x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - the ONNX attribute's name
    count = ctx.ints(k, "TopK's k")[0]
    # a stable sort keeps equal values in index order, as ONNX requires; aten.topk does not promise it
    values, indices = ctx.aten("sort.stable", x, stable=True, dim=axis, descending=bool(largest))
    return ctx.aten("slice.Tensor", values, axis, 0, count), ctx.aten("slice.Tensor", indices, axis, 0, count)
