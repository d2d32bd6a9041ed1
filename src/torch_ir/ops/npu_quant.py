"""The quantized NPU ops: (de)quantize, CONV/GEMM computed in integers or with quantized weights, the quantized
residual add (QADD) and product (QMUL), max pool (QMAXPOOL) and elementwise chains as tables (QLUT).

Their reference implementations are ``torch_ir.quant.numerics``, bit-exact with the formats they follow
(ONNX's QuantizeLinear/DequantizeLinear and onnxruntime's QLinearConv/QLinearMatMul requantize; QADD, QMUL
and QMAXPOOL are the QDQ chains they replace, step for step; QLUT is a table of its chain's results,
``torch_ir.quant.lut``). A quantized tensor's codes have the tensor's dtype; 4-bit ones travel packed two per byte
(uint8), so the ops that read them are told the type (``dtype``, ``w_dtype``). Every zero point is an input (zeros
when symmetric).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from ..ir import TensorMeta
from ..quant import lut
from ..quant import numerics as qn
from .npu import Shape, _conv_shape, _gemm_shape, _same_as_first, npu_op

_GRAN = {"axis": "the dimension a per-channel or per-group scale runs along (null: one scale for the tensor)",
         "group_size": "elements per scale along ``axis`` (null: per channel)"}
_OUT = ("what y is: a quantized dtype (int8, uint8, int16, uint16: requantized with y_scale and y_zero_point), "
        "int32 (the accumulators, as ConvInteger/MatMulInteger) or float32 (accumulators times x_scale·w_scale, "
        "dynamic quantization)")
_BIAS = ("a bias follows w_zero_point: int32 at scale x_scale·w_scale (ONNX), or float (PyTorch PT2E), quantized "
         "inside to int32 as round_half_even(bias / (x_scale·w_scale)) in float32")
_ACT = "null or relu (fused: codes below y's zero point are raised to it)"


def _dtype_of(name: str) -> torch.dtype:
    return qn.storage_dtype(name)


@npu_op("QUANTIZE", inputs="x scale zero_point?", outputs="q", shape=_same_as_first, attrs={
    "dtype": "the codes' type (int8, uint8, int16, uint16, int4, uint4: packed, float8_e4m3fn, float8_e5m2)",
    **_GRAN, "method": "divide (x / scale: ONNX) or multiply_inverse (x · (1/scale): PyTorch)",
    "qmin": "smallest code (null: the type's)", "qmax": "largest code (null: the type's)"})
def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None, *, dtype: str,
             axis: int | None = None, group_size: int | None = None, method: str = "divide",
             qmin: int | None = None, qmax: int | None = None) -> torch.Tensor:
    """q = saturate(round_half_even(x / scale) + zero_point): a float tensor to codes, per tensor, channel or
    group."""
    return qn.quantize(x, scale, zero_point, dtype=dtype, axis=axis, group_size=group_size, method=method,
                       qmin=qmin, qmax=qmax)


@npu_op("DEQUANTIZE", inputs="q scale zero_point?", outputs="x", shape=_same_as_first, attrs={
    "dtype": "the codes' type (as QUANTIZE's)", **_GRAN, "out_dtype": "the float type of x (the scale's)"})
def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None, *, dtype: str,
               axis: int | None = None, group_size: int | None = None, out_dtype: str = "float32") -> torch.Tensor:
    """x = (q - zero_point) · scale, computed in float32: codes to a float tensor."""
    return qn.dequantize(q, scale, zero_point, dtype=dtype, axis=axis, group_size=group_size,
                         out_dtype=_dtype_of(out_dtype))


def _split(rest: Sequence[torch.Tensor | None], has_bias: bool, out_dtype: str) -> tuple:
    rest = [t for t in rest if t is not None]
    bias = rest.pop(0) if has_bias else None
    quantized = out_dtype not in ("int32", "float32")
    if len(rest) != (2 if quantized else 0):
        raise ValueError(f"out_dtype={out_dtype} takes {'y_scale and y_zero_point' if quantized else 'no y_scale'}"
                         f" after the bias, got {len(rest)} input(s)")
    return bias, (rest[0], rest[1]) if quantized else None


def int_bias(bias: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """A bias as int32 codes at scale x_scale·w_scale: an integer one as it is (ONNX), a float one (PT2E, the toolkit's
    quantizer) as ``round_half_even(bias / (x_scale·w_scale))`` in float32, saturated to int32."""
    if not bias.is_floating_point():
        return bias.to(torch.int64)
    f = torch.float32
    scale = x_scale.reshape(()).to(f) * w_scale.reshape(-1).to(f)
    q = torch.round(bias.to(f).reshape(-1) / scale).clamp(-(2 ** 31), 2 ** 31 - 1)
    return q.to(torch.int64)


def _wide(x: torch.Tensor) -> bool:
    return x.dtype in (torch.int16, torch.uint16)


def _finish(acc: torch.Tensor, bias: torch.Tensor | None, channel_dim: int, x_scale: torch.Tensor,
            w_scale: torch.Tensor, y: tuple | None, out_dtype: str, activation: str | None,
            wide: bool = False) -> torch.Tensor:
    """Add the bias (``int_bias``) along ``channel_dim``, then requantize, scale to float or keep the accumulators.
    8-bit activations accumulate in int32 (an overflow is an error, as the hardware's would be); 16-bit ones
    (``wide``) in int64, as TFLite's 16x8 kernels and NPUs' wide accumulators do."""
    view = [1] * acc.dim()
    view[channel_dim] = -1
    if bias is not None:
        acc = acc + int_bias(bias, x_scale, w_scale).reshape(view)
    if (not wide or out_dtype == "int32") and acc.numel() and (acc.max() > 2 ** 31 - 1 or acc.min() < -(2 ** 31)):
        raise ValueError("an int32 accumulator overflowed (the sum of products and bias is outside int32)")
    if activation not in (None, "relu"):
        raise ValueError(f"a quantized op fuses only relu, got activation={activation!r}")
    w_scale = w_scale.reshape(view) if w_scale.numel() > 1 else w_scale.reshape(())
    if out_dtype == "int32":
        return acc.to(torch.int32)
    if out_dtype == "float32":
        out = acc.to(torch.float32) * (x_scale.reshape(()).to(torch.float32) * w_scale.to(torch.float32))
        return out.clamp_min(0) if activation == "relu" else out
    m = qn.requant_multiplier(x_scale.reshape(()), w_scale, y[0].reshape(()))
    return qn.requantize(acc, m, y[1].reshape(()), out_dtype, relu=activation == "relu")


@npu_op("QCONV", inputs="x w x_scale x_zero_point w_scale w_zero_point bias? y_scale? y_zero_point?", outputs="y",
        shape=_conv_shape, layouts={"x": "NCHW", "y": "NCHW", "w": "OIHW"}, attrs={
            "stride": "per spatial dim", "padding": "per spatial dim (symmetric)", "dilation": "per spatial dim",
            "groups": "channel groups", "w_dtype": "the weight codes' type (int8, uint8, int4, uint4)",
            "has_bias": _BIAS, "out_dtype": _OUT, "activation": _ACT})
def qconv(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor,
          w_scale: torch.Tensor, w_zero_point: torch.Tensor, *rest: torch.Tensor | None, stride: list[int],
          padding: list[int], dilation: list[int], groups: int = 1, w_dtype: str = "int8", has_bias: bool = False,
          out_dtype: str = "int8", activation: str | None = None) -> torch.Tensor:
    """y = requantize(Σ (x - x_zp)(w - w_zp) + bias): a convolution of integer codes with int32 accumulation and a
    per-tensor or per-output-channel weight scale (ONNX QLinearConv, ConvInteger)."""
    bias, y = _split(rest, has_bias, out_dtype)
    xc = qn.centered(x, x_zero_point, qn.dtype_name(x))
    wc = qn.centered(w, w_zero_point, w_dtype, axis=0)
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    acc = qn.exact_int(fn(xc, wc, None, stride, padding, dilation, groups), wc[0].numel(), "QCONV")
    return _finish(acc, bias, 1, x_scale, w_scale, y, out_dtype, activation, _wide(x))


def _qgemm_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    x, w = inputs[0].shape, inputs[1].shape
    if attrs.get("trans_b", True) or len(w) <= 2:
        return _gemm_shape(inputs, {"trans_b": attrs.get("trans_b", True)})
    # a batched second operand (attention's matmul of two activations): batch dims broadcast as torch.matmul's
    lead_x, lead_w = list(x[:-2]), list(w[:-2])
    width = max(len(lead_x), len(lead_w))
    lead_x, lead_w = [1] * (width - len(lead_x)) + lead_x, [1] * (width - len(lead_w)) + lead_w
    return [[a if b == 1 else b for a, b in zip(lead_x, lead_w)] + [x[-2], w[-1]]]


@npu_op("QGEMM", inputs="x w x_scale x_zero_point w_scale w_zero_point bias? y_scale? y_zero_point?", outputs="y",
        shape=_qgemm_shape, layouts={"w": "[N,K]"}, attrs={
            "trans_b": "w is [N,K] (a linear layer) rather than [...,K,N] (a matmul)",
            "w_dtype": "the second operand's codes' type (int8, uint8, int4, uint4)",
            "has_bias": _BIAS, "out_dtype": _OUT, "activation": _ACT})
def qgemm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor,
          w_scale: torch.Tensor, w_zero_point: torch.Tensor, *rest: torch.Tensor | None, trans_b: bool = True,
          w_dtype: str = "int8", has_bias: bool = False, out_dtype: str = "int8",
          activation: str | None = None) -> torch.Tensor:
    """y = requantize(Σ (x - x_zp)(w - w_zp) + bias): a matrix product of integer codes with int32 accumulation and
    a per-tensor or per-output-column scale of the second operand (ONNX QLinearMatMul, MatMulInteger, QGemm)."""
    bias, y = _split(rest, has_bias, out_dtype)
    xc = qn.centered(x, x_zero_point, qn.dtype_name(x))
    wc = qn.centered(w, w_zero_point, w_dtype, axis=0 if trans_b else -1)
    acc = qn.exact_int(xc @ (wc.transpose(-1, -2) if trans_b else wc), xc.shape[-1], "QGEMM")
    return _finish(acc, bias, -1, x_scale, w_scale, y, out_dtype, activation, _wide(x))


@npu_op("DQGEMM", inputs="x w w_scale w_zero_point? bias?", outputs="y", shape=_qgemm_shape,
        layouts={"w": "[N,K]"}, attrs={
            "trans_b": "w is [N,K] (a linear layer) rather than [K,N]",
            "w_dtype": "the weight codes' type (int8, uint8, int4, uint4: packed, float8_e4m3fn)",
            "axis": "the weight dim its scales run along (0: per output channel; 1 with group_size: per group of K)",
            "group_size": _GRAN["group_size"], "has_zero_point": "a weight zero point follows w_scale",
            "has_bias": "a float bias comes last", "activation": "applied to the result (torch_ir.activations)"})
def dqgemm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, *rest: torch.Tensor | None,
           trans_b: bool = True, w_dtype: str = "int8", axis: int | None = 0, group_size: int | None = None,
           has_zero_point: bool = False, has_bias: bool = False, activation: str | None = None) -> torch.Tensor:
    """y = act(x · dequantize(w)ᵀ + bias): a weight-only quantized linear layer (w8a16, w4a16 g128, ONNX
    MatMulNBits); the weight is dequantized to x's float type inside, the activations stay float."""
    from ..activations import apply_activation

    rest = [t for t in rest if t is not None]
    zp = rest.pop(0) if has_zero_point else None
    bias = rest.pop(0) if has_bias else None
    wf = qn.dequantize(w, w_scale, zp, dtype=w_dtype, axis=axis, group_size=group_size, out_dtype=x.dtype)
    y = x @ (wf.t() if trans_b else wf)
    return apply_activation(activation, y if bias is None else y + bias)


def _broadcast_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    a, b = list(inputs[0].shape), list(inputs[3].shape)
    width = max(len(a), len(b))
    a, b = [1] * (width - len(a)) + a, [1] * (width - len(b)) + b
    return [[y if x == 1 else x for x, y in zip(a, b)]]


@npu_op("QADD", inputs="a a_scale a_zero_point b b_scale b_zero_point y_scale y_zero_point", outputs="y",
        shape=_broadcast_shape, attrs={
            "out_dtype": "y's code type (int8 or uint8)", "activation": "null or relu (applied to the float sum)",
            "method": "how the sum is quantized: divide (by y_scale: ONNX) or multiply_inverse (PyTorch)"})
def qadd(a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor, b: torch.Tensor,
         b_scale: torch.Tensor, b_zero_point: torch.Tensor, y_scale: torch.Tensor, y_zero_point: torch.Tensor, *,
         out_dtype: str = "int8", activation: str | None = None, method: str = "divide") -> torch.Tensor:
    """y = quantize(act(dequantize(a) + dequantize(b))): a quantized elementwise add with its own requantize
    (onnxruntime's QLinearAdd), computed as the QDQ chain it replaces computes it: each input dequantized to
    float32, the float32 sum (broadcast as aten.add), relu if any, quantized with the QUANTIZE's method and
    saturated. Scales and zero points are per tensor."""
    if activation not in (None, "relu"):
        raise ValueError(f"QADD fuses only relu, got activation={activation!r}")
    s = qn.dequantize(a, a_scale, a_zero_point, dtype=qn.dtype_name(a)) \
        + qn.dequantize(b, b_scale, b_zero_point, dtype=qn.dtype_name(b))
    if activation == "relu":
        s = torch.relu(s)
    return qn.quantize(s, y_scale, y_zero_point, dtype=out_dtype, method=method)


@npu_op("QMUL", inputs="a a_scale a_zero_point b b_scale b_zero_point y_scale y_zero_point", outputs="y",
        shape=_broadcast_shape, attrs={
            "out_dtype": "y's code type (int8 or uint8)",
            "method": "how the product is quantized: divide (by y_scale: ONNX) or multiply_inverse (PyTorch)"})
def qmul(a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor, b: torch.Tensor,
         b_scale: torch.Tensor, b_zero_point: torch.Tensor, y_scale: torch.Tensor, y_zero_point: torch.Tensor, *,
         out_dtype: str = "int8", method: str = "divide") -> torch.Tensor:
    """y = quantize(dequantize(a) · dequantize(b)): a quantized elementwise product with its own requantize
    (onnxruntime's QLinearMul; a QDQ BERT's GELU, ``x · (1 + erf(x/√2))``), computed as the QDQ chain it replaces
    computes it: each input dequantized to float32, the float32 product (broadcast as aten.mul), quantized with the
    QUANTIZE's method and saturated. Scales and zero points are per tensor."""
    p = qn.dequantize(a, a_scale, a_zero_point, dtype=qn.dtype_name(a)) \
        * qn.dequantize(b, b_scale, b_zero_point, dtype=qn.dtype_name(b))
    return qn.quantize(p, y_scale, y_zero_point, dtype=out_dtype, method=method)


def _pool_out(size: int | str, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int | str:
    """torch's pooled size (``pooling_output_shape``): with ceil_mode a last window that would start past the
    padded input is dropped."""
    if isinstance(size, str):
        if ceil_mode:
            raise ValueError(f"QMAXPOOL: ceil_mode over the symbolic size {size!r} is not supported")
        return f"(({size})+{2 * p - d * (k - 1) - 1})//{s}+1"
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + p else out


def _qmaxpool_shape(inputs: Sequence[TensorMeta], attrs: dict[str, Any]) -> list[Shape]:
    x = list(inputs[0].shape)
    ceil = bool(attrs.get("ceil_mode", False))
    spatial = [_pool_out(size, k, s, p, d, ceil) for size, k, s, p, d in
               zip(x[-2:], attrs["kernel_size"], attrs["stride"], attrs["padding"], attrs["dilation"])]
    return [x[:-2] + spatial]


@npu_op("QMAXPOOL", inputs="x x_scale x_zero_point y_scale y_zero_point", outputs="y", shape=_qmaxpool_shape,
        layouts={"x": "NCHW", "y": "NCHW"}, attrs={
            "kernel_size": "[kh, kw]", "stride": "[sh, sw]", "padding": "[ph, pw] (implicit -inf)",
            "dilation": "[dh, dw]", "ceil_mode": "torch's ceil_mode (partial last windows)",
            "out_dtype": "y's code type (int8 or uint8)",
            "method": "how the pooled value is quantized: divide (by y_scale: ONNX) or multiply_inverse (PyTorch)"})
def qmaxpool(x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor, y_scale: torch.Tensor,
             y_zero_point: torch.Tensor, *, kernel_size: Sequence[int], stride: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool = False, out_dtype: str = "int8",
             method: str = "divide") -> torch.Tensor:
    """y = quantize(max_pool2d(dequantize(x))): a max pool of codes with its own requantize (onnxruntime's QDQ
    MaxPool), computed as the QDQ chain it replaces computes it: x dequantized to float32, torch's max_pool2d,
    quantized with the QUANTIZE's method and saturated. Scales and zero points are per tensor. For a finite x_scale
    the result depends on each window's largest code only (its smallest for a negative scale), which is how the
    backends compute it."""
    v = qn.dequantize(x, x_scale, x_zero_point, dtype=qn.dtype_name(x))
    pooled = F.max_pool2d(v, list(kernel_size), list(stride), list(padding), list(dilation), bool(ceil_mode))
    return qn.quantize(pooled, y_scale, y_zero_point, dtype=out_dtype, method=method)


@npu_op("QLUT", inputs="x x_scale x_zero_point y_scale y_zero_point", outputs="y", shape=_same_as_first, attrs={
    "functions": f"the chain's float32 steps in order, names separated by spaces ({', '.join(lut.STEPS)})",
    "numbers": "the numbers of the steps that take one (mul, add, sub, div), in order",
    "out_dtype": "y's code type (int8 or uint8)",
    "method": "how the chain's result is quantized: divide (by y_scale: ONNX) or multiply_inverse (PyTorch)"})
def qlut(x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor, y_scale: torch.Tensor,
         y_zero_point: torch.Tensor, *, functions: str, numbers: Sequence[float], out_dtype: str = "int8",
         method: str = "divide") -> torch.Tensor:
    """y = table[x], table[c] = quantize(steps(dequantize(c))) for the 256 codes c: a quantized elementwise chain
    (DEQUANTIZE, float32 steps such as GELU's erf or an attention scale, QUANTIZE) as an NPU's lookup table. The
    table holds the chain's float32 results computed over all codes at once (``torch_ir.quant.lut``); scales and
    zero points are per tensor, the codes int8 or uint8."""
    codes = lut.table(qn.dtype_name(x), x_scale, x_zero_point, y_scale, y_zero_point, functions=functions,
                      numbers=list(numbers), out_dtype=out_dtype, method=method)
    return lut.lookup(x, codes)
