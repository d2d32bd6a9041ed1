"""The reference arithmetic of quantized tensors, in torch, bit-exact with the formats it follows.

* quantize: ``q = saturate(round_half_even(x / scale) + zero_point)`` (ONNX QuantizeLinear, ``method="divide"``)
  or ``x * (1 / scale)`` (PyTorch's quantized_decomposed ops, ``method="multiply_inverse"``, the inverse taken
  in float64 and rounded to float32 as a Python-float scale is); fp8 types: ``x / scale`` saturated and rounded
  to nearest even by the cast.
* dequantize: ``(q - zero_point) * scale`` in float32, cast to the output type.
* integer accumulation: exact (products summed in float64, exact below 2**53, checked), then a bias in int32.
* requantize: ``round_half_even(float32(acc) * m) + zero_point`` saturated, with ``m = x_scale * w_scale / y_scale``
  computed in float32 in that order: onnxruntime's QLinearConv/QLinearMatMul (MLAS ``RequantizeOutput``).

4-bit tensors are stored packed, two per byte along the last dim, low nibble first (ONNX, MatMulNBits).
"""

from __future__ import annotations

import torch

from .spec import PACKED, QTYPES

_STORAGE = {"int4": torch.int8, "uint4": torch.uint8}


def storage_dtype(dtype: str) -> torch.dtype:
    """The torch dtype that holds the codes of ``dtype`` once unpacked."""
    return _STORAGE.get(dtype) or getattr(torch, dtype)


def pack4(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes (int8 or uint8 tensor, last dim even) packed two per byte: [..., K] -> uint8 [..., K/2]."""
    if q.shape[-1] % 2:
        raise ValueError(f"4-bit packing needs an even last dim, got shape {list(q.shape)}")
    nib = q.to(torch.int16) & 0xF
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)


def unpack4(packed: torch.Tensor, signed: bool) -> torch.Tensor:
    """uint8 [..., K/2] -> codes [..., K] (int8 for int4, sign-extended; uint8 for uint4)."""
    p = packed.to(torch.int16)
    codes = torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)
    if signed:
        return torch.where(codes > 7, codes - 16, codes).to(torch.int8)
    return codes.to(torch.uint8)


def codes(q: torch.Tensor, dtype: str) -> torch.Tensor:
    """A quantized tensor's codes as stored (4-bit ones unpacked)."""
    return unpack4(q, dtype == "int4") if dtype in PACKED else q


def expand(param: torch.Tensor | None, shape: torch.Size, axis: int | None,
           group_size: int | None) -> torch.Tensor | None:
    """A scale or zero point broadcast to a tensor of ``shape``: a 1-element one as it is (per tensor, whatever
    ``axis`` says, as ONNX reads it), a per-channel one along ``axis``, a per-group one repeated ``group_size``
    times along ``axis``. Its shape is checked first: the attributes and the tensors may come from a file, and a
    group size that does not match would otherwise size the repeat."""
    if param is None:
        return None
    if param.numel() == 1 and group_size is None:
        return param.reshape(())
    rank = len(shape)
    if axis is None or not -rank <= axis < rank:
        raise ValueError(f"a scale or zero point of shape {list(param.shape)} needs an axis of the rank-{rank} tensor "
                         f"{list(shape)} to run along, got axis={axis}")
    axis %= rank
    if group_size is None:
        if param.numel() != shape[axis]:
            raise ValueError(f"a per-channel scale or zero point along axis {axis} of {list(shape)} needs "
                             f"{shape[axis]} values, got shape {list(param.shape)}")
        view = [1] * rank
        view[axis] = param.numel()
        return param.reshape(view)
    want = list(shape)
    want[axis] = shape[axis] // group_size if group_size > 0 and shape[axis] % group_size == 0 else -1
    if want[axis] < 0 or list(param.shape) != want:
        need = want if want[axis] >= 0 else f"a group size that divides {shape[axis]}"
        raise ValueError(f"a per-group scale or zero point (group_size={group_size} along axis {axis}) of "
                         f"{list(shape)} needs {need}, got shape {list(param.shape)}")
    return param.repeat_interleave(group_size, dim=axis)


def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, dtype: str,
             axis: int | None = None, group_size: int | None = None, method: str = "divide",
             qmin: int | None = None, qmax: int | None = None) -> torch.Tensor:
    """Float ``x`` to codes of ``dtype`` (4-bit ones packed), saturated to ``[qmin, qmax]`` (default: the type's
    range; a narrower one for e.g. PyTorch's symmetric int8 weights, [-127, 127])."""
    s = expand(scale, x.shape, axis, group_size)
    xf = x.to(torch.float32)
    if method == "divide":
        y = xf / s.to(torch.float32)
    else:
        y = xf * (1.0 / s.to(torch.float64)).to(torch.float32)
    if dtype.startswith("float8"):
        lo, hi, _ = QTYPES[dtype]
        return y.clamp(lo, hi).to(getattr(torch, dtype))
    y = torch.round(y)
    zp = expand(zero_point, x.shape, axis, group_size)
    if zp is not None:
        y = y + zp.to(torch.float32)
    lo, hi, _ = QTYPES[dtype]
    lo, hi = max(lo, qmin) if qmin is not None else lo, min(hi, qmax) if qmax is not None else hi
    q = y.clamp(lo, hi).to(storage_dtype(dtype))
    return pack4(q) if dtype in PACKED else q


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, *, dtype: str,
               axis: int | None = None, group_size: int | None = None,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Codes of ``dtype`` (4-bit ones packed) to floats of ``out_dtype``."""
    c = codes(q, dtype)
    s = expand(scale, c.shape, axis, group_size).to(torch.float32)
    if dtype.startswith("float8"):
        return (c.to(torch.float32) * s).to(out_dtype)
    v = c.to(torch.int32)
    zp = expand(zero_point, c.shape, axis, group_size)
    if zp is not None:
        v = v - zp.to(torch.int32)
    return (v.to(torch.float32) * s).to(out_dtype)


def centered(q: torch.Tensor, zero_point: torch.Tensor | None, dtype: str, axis: int | None = None) -> torch.Tensor:
    """``q - zero_point`` as float64 (exact), for integer accumulation."""
    c = codes(q, dtype).to(torch.float64)
    zp = expand(zero_point, c.shape, axis, None)
    return c if zp is None else c - zp.to(torch.float64)


def exact_int(acc: torch.Tensor, reduction: int, what: str) -> torch.Tensor:
    """A float64 sum of integer products as int64, refusing sums float64 could not hold exactly."""
    bound = acc.abs().max().item() if acc.numel() else 0.0
    if bound >= 2.0 ** 53:
        raise ValueError(f"{what}: an integer accumulation over {reduction} products reached {bound:.3g}, past "
                         "float64's exact range (2**53); split the reduction")
    return acc.to(torch.int64)


def requantize(acc: torch.Tensor, multiplier: torch.Tensor, zero_point: torch.Tensor | None, dtype: str, *,
               relu: bool = False) -> torch.Tensor:
    """Integer accumulators to codes of ``dtype``: ``round_half_even(float32(acc) * multiplier) + zero_point``,
    saturated; with ``relu`` the codes below the zero point are raised to it (a ReLU before quantizing)."""
    y = torch.round(acc.to(torch.float32) * multiplier.to(torch.float32))  # int32 or int64 (16-bit activations)
    lo, hi, _ = QTYPES[dtype]
    if zero_point is not None:
        y = y + zero_point.to(torch.float32)
    if relu:
        lo = max(lo, float(zero_point.reshape(-1)[0]) if zero_point is not None else 0.0)
    return y.clamp(lo, hi).to(storage_dtype(dtype))


def requant_multiplier(x_scale: torch.Tensor, w_scale: torch.Tensor, y_scale: torch.Tensor) -> torch.Tensor:
    """``x_scale * w_scale / y_scale`` in float32, in that order (onnxruntime's)."""
    f = torch.float32
    return (x_scale.to(f) * w_scale.to(f)) / y_scale.to(f)


def int8_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` rounded to int8 in groups of ``group`` along its last dim, as llama.cpp quantizes the activations of
    its quantized dot products (its Q8_0 / Q8_K ``x``): per group ``dx = max|x| / 127`` and ``dx · round(x / dx)``
    in x's float type, ties to even; a group of zeros (``dx = 0``) or a non-finite quotient gives 0. The value a
    dot product with int8 activations computes, to within the float rounding of its sums."""
    if group < 1 or x.shape[-1] % group:
        raise ValueError(f"int8 groups of {group} do not divide the last dim of a {list(x.shape)} tensor")
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    dx = g.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(dx > 0, g / dx, torch.zeros_like(g))
    q = torch.where(q.abs() < 127.5, q, torch.zeros_like(q)).round()
    return (q * dx).reshape(x.shape)


def dtype_name(t: torch.Tensor) -> str:
    """The table name of a tensor's dtype (``int8``, ``uint8``, ...)."""
    return str(t.dtype).removeprefix("torch.")
