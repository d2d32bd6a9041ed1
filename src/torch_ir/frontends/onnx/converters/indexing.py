"""Indexing ONNX ops: Gather, GatherElements, GatherND and the Scatter family.

ONNX indices may be negative (counting from the end); ATen's index ops want them in range, so
constant indices are wrapped here and computed ones at run time.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

import numpy as np

from ..context import Ctx, UnsupportedNode
from . import converter


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _wrap_indices(ctx: Ctx, indices, size):
    """Negative indices count from the end in ONNX; ATen's index ops want them in [0, size)."""
    const = ctx.const(indices)
    if const is not None and (isinstance(size, int) or (const >= 0).all()):
        return np.where(const < 0, const + size, const).astype(np.int64) if isinstance(size, int) else const
    if not isinstance(size, int):
        raise UnsupportedNode("negative indices along a symbolic axis")
    return ctx.aten("remainder.Scalar", ctx.cast(indices, "int64"), size)


@converter("Gather")
def Gather(ctx: Ctx, data, indices, *, axis=0):
    shape = ctx.shape(data)
    axis = _axis(axis, len(shape))
    idx = _wrap_indices(ctx, indices, shape[axis])
    flat = ctx.aten("index_select", data, axis, ctx.aten("reshape", ctx.tensor(idx), [-1]))
    return ctx.aten("reshape", flat, [*shape[:axis], *ctx.shape(indices), *shape[axis + 1:]])


@converter("GatherElements")
def GatherElements(ctx: Ctx, data, indices, *, axis=0):
    axis = _axis(axis, ctx.rank(data))
    return ctx.aten("gather", data, axis, _wrap_indices(ctx, indices, ctx.shape(data)[axis]))


@converter("ScatterElements", since=11)
def ScatterElements(ctx: Ctx, data, indices, updates, *, axis=0, reduction="none"):
    axis = _axis(axis, ctx.rank(data))
    idx = _wrap_indices(ctx, indices, ctx.shape(data)[axis])
    if reduction == "none":
        return ctx.aten("scatter.src", data, axis, idx, updates)
    reduce = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction]
    return ctx.aten("scatter_reduce.two", data, axis, idx, updates, reduce, include_self=True)


@converter("Scatter", since=9)
def Scatter(ctx: Ctx, data, indices, updates, *, axis=0):
    """The deprecated Scatter (opsets 9-10) is ScatterElements without a reduction."""
    return ScatterElements(ctx, data, indices, updates, axis=axis)


def _index_list(ctx: Ctx, indices) -> list:
    """indices[..., k] -> k index tensors, one per leading data axis (as ``data[i0, i1, ...]`` takes them)."""
    k = ctx.shape(indices)[-1]
    return [ctx.aten("select.int", ctx.tensor(indices), -1, j) for j in range(k)]


@converter("GatherND", since=11)
def GatherND(ctx: Ctx, data, indices, *, batch_dims=0):
    if batch_dims:
        raise UnsupportedNode("GatherND with batch_dims")
    return ctx.aten("index.Tensor", data, _index_list(ctx, indices))


@converter("ScatterND", since=11)
def ScatterND(ctx: Ctx, data, indices, updates, *, reduction="none"):
    if reduction not in ("none", "add"):
        raise UnsupportedNode(f"ScatterND with reduction {reduction!r}")
    return ctx.aten("index_put", data, _index_list(ctx, indices), updates, reduction == "add")
