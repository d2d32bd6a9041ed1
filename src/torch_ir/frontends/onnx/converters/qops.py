"""ONNX's QOperator ops -> the NPU's integer ops, quantization kept.

QLinearConv -> QCONV, QLinearMatMul -> QGEMM (``trans_b=False``, batched), ConvInteger -> QCONV and
MatMulInteger -> QGEMM with ``out_dtype="int32"`` (the accumulators), com.microsoft MatMulNBits (4-bit weights in
blocks along K) -> DQGEMM. The ops take every zero point as an input: an absent ONNX one becomes a zero constant of
the type. Their arithmetic (``torch_ir.ops.npu_quant``) is onnxruntime's: exact integer accumulation, then
``round_half_even(acc * x_scale * w_scale / y_scale) + y_zero_point``, saturated.
"""

# ruff: noqa: N802, N803 - converters and their arguments are named after the ONNX op they translate

from __future__ import annotations

import math

import numpy as np
import torch

from ....ir import TensorMeta
from ....quant.numerics import unpack4
from ....quant.spec import QuantSpec
from ..context import Ctx, UnsupportedNode, Value
from . import converter
from .nn import _spatial_pads
from .quant import attach, make_spec, npu, zero_point_of, zeros_of

_INT8 = ("int8", "uint8")
_ONE = np.array(1.0, np.float32)


def _per_tensor(ctx: Ctx, where: str, **params: Value) -> None:
    """Activation scales and zero points are one per tensor: the ops requantize with scalars."""
    for name, value in params.items():
        if value is not None and math.prod(d if isinstance(d, int) else 2 for d in ctx.shape(value)) != 1:
            raise UnsupportedNode(f"{where}: {name} has shape {ctx.shape(value)}; the NPU's integer ops take a "
                                  f"per-tensor {name} (one value); only the weight's may be per channel")


def _codes(ctx: Ctx, value: Value, where: str, what: str, types: tuple[str, ...] = _INT8) -> TensorMeta:
    t = ctx.tensor(value)
    if t.dtype not in types:
        raise UnsupportedNode(f"{where}: {what} is {t.dtype}; this op takes {', '.join(types)} codes")
    return t


def _zp(ctx: Ctx, zero_point: Value, dtype: str, where: str) -> TensorMeta:
    zp = zero_point_of(ctx, zero_point, dtype, where)
    return ctx.tensor(zeros_of(dtype) if zp is None else zp)


def _weight_axis(ctx: Ctx, w_scale: Value, channels: int | str, axis: int, where: str) -> int | None:
    """None for a per-tensor weight scale, ``axis`` for one per output channel (``channels`` of them)."""
    shape = ctx.shape(w_scale)
    if math.prod(d if isinstance(d, int) else 2 for d in shape) == 1:
        return None
    if shape != [channels]:
        raise UnsupportedNode(f"{where}: the weight scale has shape {shape}; it is one value or one per output "
                              f"channel ({channels})")
    return axis


def _conv_args(ctx: Ctx, x: TensorMeta, w: TensorMeta, x_zp: Value, auto_pad, dilations, group, kernel_shape,
               pads, strides) -> tuple[TensorMeta, dict]:
    """QCONV's attributes; asymmetric padding is applied to the codes first, with x's zero point (a real 0)."""
    kernel = kernel_shape or ctx.shape(w)[2:]
    n = len(kernel)
    strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
    pads = _spatial_pads(ctx, x, kernel, strides, dilations, pads, auto_pad)
    if pads[:n] != pads[n:]:
        value = ctx.const(x_zp)
        if value is None:
            raise UnsupportedNode(f"{ctx.name}: asymmetric padding {pads} needs x's zero point at import time")
        flat = [p for b, e in zip(pads[:n][::-1], pads[n:][::-1]) for p in (b, e)]
        x = ctx.aten("constant_pad_nd", x, flat, int(np.asarray(value).reshape(-1)[0]))
        pads = [0] * (2 * n)
    return x, {"stride": strides, "padding": pads[:n], "dilation": dilations, "groups": group}


def _conv(ctx: Ctx, where: str, x, w, x_scale, x_zp, w_scale, w_zp, y, bias, out_dtype: str, attrs: dict):
    x_t, w_t = _codes(ctx, x, where, "x"), _codes(ctx, w, where, "w")
    x_zp_v = zero_point_of(ctx, x_zp, x_t.dtype, where)
    x_zp_v = zeros_of(x_t.dtype) if x_zp_v is None else x_zp_v
    w_axis = _weight_axis(ctx, w_scale, ctx.shape(w_t)[0], 0, where)
    xs, ws, wz = ctx.tensor(x_scale), ctx.tensor(w_scale), _zp(ctx, w_zp, w_t.dtype, where)
    xz = ctx.tensor(x_zp_v)
    padded, conv_attrs = _conv_args(ctx, x_t, w_t, x_zp_v, **attrs)
    if x_scale is not _ONE:  # ConvInteger has no scales: its codes get no spec
        attach(x_t, make_spec(x_t.dtype, xs, xz))
        attach(w_t, make_spec(w_t.dtype, ws, wz, w_axis))
    y_spec = None if y is None else make_spec(out_dtype, y[0], y[1])
    op_attrs = {**conv_attrs, "w_dtype": w_t.dtype, "has_bias": bias is not None, "out_dtype": out_dtype}
    ins = [padded, w_t, xs, xz, ws, wz, bias, *(y or ())]
    return npu(ctx, "QCONV", ins, op_attrs, out_dtype, quant=y_spec)


@converter("QLinearConv", since=10)
def QLinearConv(ctx: Ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    where = f"QLinearConv {ctx.name!r}"
    _per_tensor(ctx, where, x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale, y_zero_point=y_zero_point)
    y_type = ctx.dtype(y_zero_point)
    y = (ctx.tensor(y_scale), _zp(ctx, y_zero_point, y_type, where))
    bias = None if B is None else _codes(ctx, B, where, "the bias", ("int32",))
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    return _conv(ctx, where, x, w, x_scale, x_zero_point, w_scale, w_zero_point, y, bias, y_type, attrs)


@converter("ConvInteger", since=10)
def ConvInteger(ctx: Ctx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                kernel_shape=None, pads=None, strides=None):
    where = f"ConvInteger {ctx.name!r}"
    _per_tensor(ctx, where, x_zero_point=x_zero_point)
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    return _conv(ctx, where, x, w, _ONE, x_zero_point, _ONE, w_zero_point, None, None, "int32", attrs)


def _matmul(ctx: Ctx, where: str, a, b, a_scale, a_zp, b_scale, b_zp, y, out_dtype: str) -> TensorMeta:
    a_t, b_t = _codes(ctx, a, where, "A"), _codes(ctx, b, where, "B")
    if ctx.rank(a_t) < 2 or ctx.rank(b_t) < 2:
        raise UnsupportedNode(f"{where}: A {ctx.shape(a_t)} and B {ctx.shape(b_t)} must be at least 2-D (QGEMM has "
                              "no vector form); reshape the 1-D operand")
    n = ctx.shape(b_t)[-1]
    b_axis = _weight_axis(ctx, b_scale, n, ctx.rank(b_t) - 1, where) if b_scale is not _ONE else None
    if b_zp is not None and b_scale is _ONE and math.prod(ctx.shape(b_zp)) not in (1, n):
        raise UnsupportedNode(f"{where}: b_zero_point has shape {ctx.shape(b_zp)}; it is one value or one per column")
    az, bz = _zp(ctx, a_zp, a_t.dtype, where), _zp(ctx, b_zp, b_t.dtype, where)
    a_s, b_s = ctx.tensor(a_scale), ctx.tensor(b_scale)
    if a_scale is not _ONE:
        attach(a_t, make_spec(a_t.dtype, a_s, az))
        attach(b_t, make_spec(b_t.dtype, b_s, bz, b_axis))
    rows = torch.broadcast_shapes(tuple(_hint(ctx, d) for d in ctx.shape(a_t)[:-2]),
                                  tuple(_hint(ctx, d) for d in ctx.shape(b_t)[:-2]))
    batch = [ctx.graph.unhint(d) for d in rows]
    shape = [*batch, ctx.shape(a_t)[-2], n]
    attrs = {"trans_b": False, "w_dtype": b_t.dtype, "has_bias": False, "out_dtype": out_dtype}
    spec = None if y is None else make_spec(out_dtype, y[0], y[1])
    return npu(ctx, "QGEMM", [a_t, b_t, a_s, az, b_s, bz, *(y or ())], attrs, out_dtype, shape=shape, quant=spec)


def _hint(ctx: Ctx, d: int | str) -> int:
    return ctx.graph.hint(d)


@converter("QLinearMatMul", since=10)
def QLinearMatMul(ctx: Ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    where = f"QLinearMatMul {ctx.name!r}"
    _per_tensor(ctx, where, a_scale=a_scale, a_zero_point=a_zero_point, y_scale=y_scale, y_zero_point=y_zero_point)
    y_type = ctx.dtype(y_zero_point)
    y = (ctx.tensor(y_scale), _zp(ctx, y_zero_point, y_type, where))
    return _matmul(ctx, where, a, b, a_scale, a_zero_point, b_scale, b_zero_point, y, y_type)


@converter("MatMulInteger", since=10)
def MatMulInteger(ctx: Ctx, A, B, a_zero_point=None, b_zero_point=None):
    where = f"MatMulInteger {ctx.name!r}"
    _per_tensor(ctx, where, a_zero_point=a_zero_point)
    return _matmul(ctx, where, A, B, _ONE, a_zero_point, _ONE, b_zero_point, None, "int32")


@converter("MatMulNBits", domain="com.microsoft")
def MatMulNBits(ctx: Ctx, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                accuracy_level=0):
    """4-bit weights ``B`` [N, K/block, block/2] (packed along K, low nibble first) are the packed [N, K] uint4
    weight DQGEMM reads; scales [N * K/block] become [N, K/block]; zero points (packed uint8, default 8) likewise."""
    where = f"MatMulNBits {ctx.name!r}"
    if bits != 4 or g_idx is not None:
        raise UnsupportedNode(f"{where}: bits={bits}{', with g_idx' if g_idx is not None else ''}; DQGEMM takes 4-bit "
                              "weights in blocks along K in order (bits=4, no g_idx): re-quantize the model so")
    if K % block_size or block_size % 2 or ctx.shape(B) != [N, K // block_size, block_size // 2]:
        raise UnsupportedNode(f"{where}: K={K}, block_size={block_size}, B {ctx.shape(B)}: DQGEMM needs whole blocks "
                              f"(K a multiple of an even block_size) and B [N, K/block_size, block_size/2]")
    if ctx.dtype(A) not in ("float32", "float16"):
        raise UnsupportedNode(f"{where}: A is {ctx.dtype(A)}; MatMulNBits computes in float32 or float16")
    blocks = K // block_size
    w = _packed_weight(ctx, B, N, K, where)
    s = ctx.const(scales)
    if s is None:
        raise UnsupportedNode(f"{where}: the scales are computed at run time; DQGEMM's are initializers")
    scale_t = ctx.tensor(s.reshape(N, blocks))
    zp = _nbits_zero_points(ctx, zero_points, N, blocks, where)
    zp_t = ctx.tensor(zp)
    w.quant = QuantSpec("uint4", scale=scale_t.name, zero_point=zp_t.name, axis=1, group_size=block_size,
                        scale_dtype=scale_t.dtype)
    attrs = {"trans_b": True, "w_dtype": "uint4", "axis": 1, "group_size": block_size, "has_zero_point": True,
             "has_bias": bias is not None}
    return npu(ctx, "DQGEMM", [A, w, scale_t, zp_t, bias], attrs, ctx.dtype(A), shape=[*ctx.shape(A)[:-1], N])


def _packed_weight(ctx: Ctx, B: Value, N: int, K: int, where: str) -> TensorMeta:
    """B's bytes as the packed [N, K] uint4 weight (a view: no copy, no unpacking)."""
    if isinstance(B, np.ndarray):
        name = ctx.graph._initializer_of.get(id(B), f"{ctx.name}_weight")
        packed = torch.from_numpy(np.array(B, dtype=np.uint8).reshape(N, K // 2))
    elif B.role == "weight" and B.name in ctx.graph.weights and B.dtype == "uint8":
        name, packed = B.name, ctx.graph.weights[B.name].reshape(N, K // 2)
        if sum(list(n.input).count(name) for n in ctx.graph.loaded.model.graph.node) == 1:  # only this node reads it:
            B.dtype, B.shape = "uint4", [N, K]  # the weight becomes the packed uint4 one, same bytes
            ctx.graph.weights[name] = packed
            return B
    else:
        raise UnsupportedNode(f"{where}: B is computed at run time; MatMulNBits' weight must be an initializer")
    return ctx.graph.add_weight(f"{name}_uint4", packed, "uint4", [N, K])


def _nbits_zero_points(ctx: Ctx, zero_points: Value, N: int, blocks: int, where: str) -> np.ndarray:
    """Zero points [N, blocks] as uint8 codes: ONNX's packed uint8 [N * ceil(blocks/2)], or 8 when absent."""
    if zero_points is None:
        return np.full((N, blocks), 8, np.uint8)
    z = ctx.const(zero_points)
    if z is None or z.dtype != np.uint8:
        got = "computed at run time" if z is None else f"{ctx.dtype(zero_points)}"
        raise UnsupportedNode(f"{where}: zero points {got}; DQGEMM takes packed uint8 4-bit zero points from an "
                              "initializer (float zero points are not integer codes)")
    per_row = (blocks + 1) // 2
    if z.size != N * per_row:
        raise UnsupportedNode(f"{where}: {z.size} zero-point bytes; packed 4-bit ones are N * ceil(K/block_size/2) "
                              f"= {N * per_row}")
    return unpack4(torch.from_numpy(z.reshape(N, per_row).copy()), signed=False).numpy()[:, :blocks].copy()

