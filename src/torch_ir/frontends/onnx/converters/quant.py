"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear -> the NPU ops QUANTIZE and DEQUANTIZE.

The quantization is kept, not decomposed into float arithmetic: the quantized tensor (QUANTIZE's output,
DEQUANTIZE's input) carries a ``QuantSpec`` (``TensorMeta.quant``) whose scale and zero point name the IR tensors
of the node's scale and zero-point inputs. Granularity follows ONNX: a one-element scale is per tensor, a 1-D one
per axis (``axis``), a blocked one (``block_size``) per group of ``block_size`` along ``axis``. Types: int8, uint8,
int16, uint16, int4, uint4 (packed two per byte along the last dim; held one per byte in int8/uint8 where the last
dim is odd, ``dtypes.WIDE``), float8 e4m3fn and e5m2 (no zero point: ONNX requires it to be 0), int32 (a bias, to
dequantize). The arithmetic is ``torch_ir.quant.numerics`` (ONNX's, bit-exact).
"""

# ruff: noqa: N802 - converters are named after the ONNX op they translate

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ....ir import TensorMeta
from ....ops.npu import NPU_OPS
from ....quant.spec import QTYPES, SCALE_DTYPES, QuantSpec
from ..context import Ctx, UnsupportedNode, Value
from ..dtypes import ONNX_TO_IR, WIDE, held_dtype
from . import converter

FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
#: The types QUANTIZE makes (DEQUANTIZE also reads int32, a bias at scale x_scale * w_scale).
QUANTIZE_TYPES = ("int8", "uint8", "int16", "uint16", "int4", "uint4", *FLOAT8)
_FLOATS = ("float32", "float16", "bfloat16")


def npu(ctx: Ctx, op: str, inputs: Sequence[Value], attrs: dict[str, Any], dtype: str,
        shape: list | None = None, quant: QuantSpec | None = None) -> TensorMeta:
    """Emit the NPU op ``op`` (absent inputs and None attributes left out); its output has ``dtype``, ``shape``
    (default: the op's shape rule) and the quantization spec ``quant``."""
    tensors = [ctx.tensor(v) for v in inputs if v is not None]
    attrs = {k: v for k, v in attrs.items() if v is not None}
    if shape is None:
        shape = NPU_OPS[op].shape(tensors, attrs)[0]
    out = ctx.custom(op, tensors, attrs, [TensorMeta("", list(shape), dtype)])[0]
    out.quant = quant
    return out


def attach(t: TensorMeta, spec: QuantSpec) -> None:
    """Give ``t`` the spec ``spec`` unless it has one (a tensor quantized by the QUANTIZE that made it)."""
    if t.quant is None:
        t.quant = spec


def scale_dtype(ctx: Ctx, scale: Value, where: str) -> str:
    dtype = ctx.dtype(scale)
    if dtype not in SCALE_DTYPES:
        raise UnsupportedNode(f"{where}: the scale is {dtype}; a quantization scale is one of "
                              f"{', '.join(SCALE_DTYPES)}")
    return dtype


def make_spec(dtype: str, scale: TensorMeta, zero_point: TensorMeta | None, axis: int | None = None,
              group_size: int | None = None) -> QuantSpec:
    return QuantSpec(dtype, scale=scale.name, zero_point=None if zero_point is None else zero_point.name,
                     axis=axis, group_size=group_size, scale_dtype=scale.dtype)


def granularity(ctx: Ctx, x: Value, scale: Value, axis: int, block_size: int, where: str
                ) -> tuple[int | None, int | None]:
    """(axis, group_size) of ONNX's rules: one scale per tensor, per index along ``axis`` (1-D), or per block."""
    shape, sshape = ctx.shape(x), ctx.shape(scale)
    rank = len(shape)
    if not block_size and all(d == 1 for d in sshape):
        return None, None
    if not -rank <= axis < rank:
        raise UnsupportedNode(f"{where}: axis {axis} is out of range for a rank-{rank} input {shape}")
    axis %= rank
    if not block_size:
        if len(sshape) != 1:
            raise UnsupportedNode(f"{where}: a per-axis scale is 1-D, got shape {sshape} (set block_size for "
                                  "blocked quantization)")
        return axis, None
    if block_size < 0 or len(sshape) != rank:
        raise UnsupportedNode(f"{where}: blocked quantization (block_size={block_size}) needs a positive block "
                              f"size and a scale of the input's rank {rank}, got scale shape {sshape}")
    if isinstance(shape[axis], int) and shape[axis] % block_size:
        raise UnsupportedNode(f"{where}: block_size {block_size} does not divide dim {axis} ({shape[axis]}) of "
                              f"{shape}; QUANTIZE/DEQUANTIZE groups are whole (pad the tensor to a multiple)")
    return axis, block_size


def zero_point_of(ctx: Ctx, zero_point: Value, qtype: str, where: str) -> Value:
    """The zero point as the ops read it: None for float8 (ONNX requires it to be 0; a known non-zero one is
    refused), 4-bit codes one per byte (int8/uint8)."""
    if zero_point is None:
        return None
    known = ctx.const(zero_point)
    if qtype in FLOAT8:
        if known is not None and np.any(known.astype(np.float32) != 0):
            raise UnsupportedNode(f"{where}: a {qtype} zero point must be 0 (ONNX's rule; float8 types have none), "
                                  f"got {known.reshape(-1)[:4].astype(np.float32).tolist()}; drop it")
        return None  # a run-time one is 0 by ONNX's rule: the ops take none
    if known is not None and ctx.dtype(known) in WIDE:
        return _wide_constant(ctx, known)
    if isinstance(zero_point, TensorMeta) and zero_point.dtype in WIDE:
        raise UnsupportedNode(f"{where}: a packed {zero_point.dtype} zero point computed at run time; the ops read "
                              "zero points one per byte (make it an initializer)")
    return zero_point


def onnx_type(ctx: Ctx, value: Value) -> str:
    """The ONNX type of ``value``: its IR dtype, or the 4-bit type a tensor held unpacked has (``dtypes.WIDE``)."""
    if isinstance(value, TensorMeta):
        return ctx.graph.held_as.get(value.name, value.dtype)
    return ctx.dtype(value)


def _wide_constant(ctx: Ctx, value: np.ndarray) -> TensorMeta:
    """4-bit codes one per byte, as a constant named after the initializer they come from (made once)."""
    graph = ctx.graph
    source = graph._initializer_of.get(id(value))
    if source is None:
        return graph.add_constant(value.astype(WIDE[ctx.dtype(value)]), f"{ctx.name}_zero_point")
    if source not in graph.wide_constants:
        wide = value.astype(WIDE[ctx.dtype(value)])
        graph._initializer_of[id(wide)] = source  # keeps the initializer's name (the array is kept alive below)
        graph.wide_constants[source] = (graph.add_constant(wide, source), wide)
    return graph.wide_constants[source][0]


def zeros_of(dtype: str) -> np.ndarray:
    """A zero zero point of ``dtype`` (an absent ONNX one: the ops take zero points as inputs)."""
    return np.zeros((), dtype=WIDE.get(dtype, dtype))


@converter("QuantizeLinear", since=10)
def QuantizeLinear(ctx: Ctx, x, scale, zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0,
                   precision=0):
    where = f"QuantizeLinear {ctx.name!r}"
    default = ONNX_TO_IR.get(output_dtype or 2, str(output_dtype))  # ONNX's default: uint8
    qtype = onnx_type(ctx, zero_point) if zero_point is not None else default
    if qtype not in QUANTIZE_TYPES:
        raise UnsupportedNode(f"{where}: quantizing to {qtype}; QUANTIZE makes {', '.join(QUANTIZE_TYPES)}")
    if qtype in FLOAT8 and not saturate:
        raise UnsupportedNode(f"{where}: saturate=0 (out-of-range values to inf/NaN) to {qtype}; QUANTIZE saturates "
                              "to the type's largest finite value: set saturate=1")
    if precision not in (0, 1) or ctx.dtype(x) not in _FLOATS:
        raise UnsupportedNode(f"{where}: quantizing {ctx.dtype(x)} at precision {precision}; QUANTIZE divides in "
                              "float32 (x float32, float16 or bfloat16; precision unset or FLOAT)")
    scale_dtype(ctx, scale, where)
    q_axis, group = granularity(ctx, x, scale, axis, block_size, where)
    zp = zero_point_of(ctx, zero_point, qtype, where)
    scale_t, zp_t = ctx.tensor(scale), None if zp is None else ctx.tensor(zp)
    held = held_dtype(qtype, ctx.shape(x))
    narrow = {"qmin": int(QTYPES[qtype][0]), "qmax": int(QTYPES[qtype][1])} if held != qtype else {}
    attrs = {"dtype": held, "axis": q_axis, "group_size": group, **narrow}
    return npu(ctx, "QUANTIZE", [x, scale_t, zp_t], attrs, held, quant=make_spec(held, scale_t, zp_t, q_axis, group))


@converter("DequantizeLinear", since=10)
def DequantizeLinear(ctx: Ctx, x, scale, zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    where = f"DequantizeLinear {ctx.name!r}"
    x_t = ctx.tensor(x)
    qtype = x_t.dtype
    if qtype not in (*QUANTIZE_TYPES, "int32"):
        raise UnsupportedNode(f"{where}: dequantizing {qtype}; DEQUANTIZE reads {', '.join(QUANTIZE_TYPES)}, int32")
    out_dtype = ONNX_TO_IR.get(output_dtype, str(output_dtype)) if output_dtype else scale_dtype(ctx, scale, where)
    if out_dtype not in _FLOATS:
        raise UnsupportedNode(f"{where}: output_dtype {out_dtype}; DEQUANTIZE makes {', '.join(_FLOATS)}")
    scale_dtype(ctx, scale, where)
    q_axis, group = granularity(ctx, x_t, scale, axis, block_size, where)
    zp = zero_point_of(ctx, zero_point, qtype, where)
    scale_t, zp_t = ctx.tensor(scale), None if zp is None else ctx.tensor(zp)
    attach(x_t, make_spec(qtype, scale_t, zp_t, q_axis, group))
    attrs = {"dtype": qtype, "axis": q_axis, "group_size": group, "out_dtype": out_dtype}
    return npu(ctx, "DEQUANTIZE", [x_t, scale_t, zp_t], attrs, out_dtype)


@converter("DynamicQuantizeLinear", since=11)
def DynamicQuantizeLinear(ctx: Ctx, x):
    """ONNX's formula in ATen ops: the range of x widened to hold 0, ``scale = (max - min) / 255`` (1 where the
    range is empty, as onnxruntime; ONNX's reference would divide by 0), ``zero_point = saturate(round(0 - min /
    scale))``; then QUANTIZE to uint8."""
    if ctx.dtype(x) != "float32":
        raise UnsupportedNode(f"DynamicQuantizeLinear {ctx.name!r}: input is {ctx.dtype(x)}; ONNX defines it on "
                              "float32")
    zero = np.array(0.0, np.float32)
    lo = ctx.aten("minimum", ctx.aten("min", x), zero)
    hi = ctx.aten("maximum", ctx.aten("max", x), zero)
    span = ctx.aten("sub.Tensor", hi, lo)
    scale = ctx.aten("where.self", ctx.aten("eq.Scalar", span, 0.0), np.array(1.0, np.float32),
                     ctx.aten("div.Tensor", span, np.array(255.0, np.float32)))
    zp_float = ctx.aten("sub.Tensor", zero, ctx.aten("div.Tensor", lo, scale))
    zp = ctx.cast(ctx.aten("round", ctx.aten("clamp", zp_float, 0.0, 255.0)), "uint8")
    y = npu(ctx, "QUANTIZE", [x, scale, zp], {"dtype": "uint8"}, "uint8", quant=make_spec("uint8", scale, zp))
    return y, scale, zp
