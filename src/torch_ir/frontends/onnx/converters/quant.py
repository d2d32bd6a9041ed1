"""QuantizeLinear / DequantizeLinear, per tensor or per axis, as ATen arithmetic.

The IR records integer tensors as they are; (de)quantization is the arithmetic ONNX defines:
``y = saturate(round_half_even(x / scale) + zero_point)`` and ``x = (q - zero_point) * scale``.
Blocked quantization and float8 or 4-bit types are left to the ONNX op.
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

import torch

from ..context import Ctx, UnsupportedNode
from ..dtypes import ONNX_TO_IR
from . import converter

_INT_TYPES = ("int8", "uint8", "int16", "uint16", "int32")


def _per_axis(ctx: Ctx, param, x, axis: int):
    """A 1-D per-channel parameter reshaped to broadcast along ``axis`` of ``x``."""
    if param is None or ctx.rank(param) == 0 or ctx.shape(param) == [1]:
        return param
    rank = ctx.rank(x)
    axis = axis + rank if axis < 0 else axis
    shape = [1] * rank
    shape[axis] = ctx.shape(param)[0]
    return ctx.aten("reshape", ctx.tensor(param), shape)


@converter("DequantizeLinear", since=10)
def DequantizeLinear(ctx: Ctx, x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    if block_size or ctx.dtype(x) not in _INT_TYPES:
        raise UnsupportedNode(f"DequantizeLinear of {ctx.dtype(x)} (block_size={block_size})")
    wide = ctx.cast(x, "int32")
    if zero_point is not None:
        wide = ctx.aten("sub.Tensor", wide, ctx.cast(_per_axis(ctx, zero_point, x, axis), "int32"))
    # the arithmetic in float32, as ONNX specifies; the output takes the scale's type
    out = ctx.aten("mul.Tensor", ctx.cast(wide, "float32"), ctx.cast(_per_axis(ctx, scale, x, axis), "float32"))
    return ctx.cast(out, ctx.dtype(scale))


@converter("QuantizeLinear", since=10)
def QuantizeLinear(ctx: Ctx, x, scale, zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0,
                   precision=0):
    target = ctx.dtype(zero_point) if zero_point is not None else ONNX_TO_IR.get(output_dtype or 2)
    if block_size or target not in _INT_TYPES:
        raise UnsupportedNode(f"QuantizeLinear to {target} (block_size={block_size})")
    y = ctx.aten("round", ctx.aten("div.Tensor", ctx.cast(x, "float32"),
                                   ctx.cast(_per_axis(ctx, scale, x, axis), "float32")))
    if zero_point is not None:
        y = ctx.aten("add.Tensor", y, ctx.cast(_per_axis(ctx, zero_point, x, axis), "float32"))
    info = torch.iinfo(getattr(torch, target))
    return ctx.cast(ctx.aten("clamp", y, float(info.min), float(info.max)), target)
