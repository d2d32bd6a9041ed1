"""Weight quantization: round to nearest with a clipping search, per tensor, output channel or group along K.

For each channel (or group) the range is shrunk by each candidate ratio (1.0, 0.95, ...) and the one whose
quantize-dequantize error (MSE) is least is kept: an outlier weight then costs its own clipping error instead of
coarsening every other weight's step. The codes themselves are computed by ``torch_ir.quant.numerics.quantize``,
the same arithmetic ``DEQUANTIZE`` inverts, so the stored codes are exactly what the IR computes with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_ir.quant import numerics as qn
from torch_ir.quant.spec import QTYPES

from .presets import QuantConfig


@dataclass
class QuantizedWeight:
    """A weight's codes (4-bit ones packed), scale, zero point (None: symmetric) and where the scales run."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    dtype: str
    axis: int | None
    group_size: int | None
    granularity: str

    def dequantized(self) -> torch.Tensor:
        return qn.dequantize(self.codes, self.scale, self.zero_point, dtype=self.dtype, axis=self.axis,
                             group_size=self.group_size)


def _row_params(rows: torch.Tensor, ratio: float, dtype: str, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point (float, 0 when symmetric) of each row for the range shrunk by ``ratio``."""
    lo_q, hi_q, _ = QTYPES[dtype]
    if symmetric or dtype.startswith("float8"):
        amax = rows.abs().amax(dim=1) * ratio
        scale = amax / hi_q
        zp = torch.zeros_like(scale)
    else:
        lo = rows.amin(dim=1).clamp(max=0) * ratio
        hi = rows.amax(dim=1).clamp(min=0) * ratio
        scale = (hi - lo) / (hi_q - lo_q)
        zp = torch.round(lo_q - lo / torch.where(scale > 0, scale, 1.0)).clamp(lo_q, hi_q)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale gives codes 0
    return scale.to(torch.float32), zp


def _fake_quant(rows: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor, dtype: str) -> torch.Tensor:
    lo_q, hi_q, _ = QTYPES[dtype]
    s, z = scale[:, None], zp[:, None]
    if dtype.startswith("float8"):
        return (rows / s).clamp(lo_q, hi_q).to(getattr(torch, dtype)).to(torch.float32) * s
    return (torch.round(rows / s) + z).clamp(lo_q, hi_q).sub(z).mul(s)


def search_rows(rows: torch.Tensor, dtype: str, symmetric: bool,
                ratios: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero point) of least quantization MSE over the clip ``ratios``."""
    rows = rows.to(torch.float32)
    best_scale, best_zp = _row_params(rows, 1.0, dtype, symmetric)
    best_err = (_fake_quant(rows, best_scale, best_zp, dtype) - rows).pow(2).mean(dim=1)
    for ratio in ratios:
        if ratio == 1.0:
            continue
        scale, zp = _row_params(rows, ratio, dtype, symmetric)
        err = (_fake_quant(rows, scale, zp, dtype) - rows).pow(2).mean(dim=1)
        better = err < best_err
        best_scale = torch.where(better, scale, best_scale)
        best_zp = torch.where(better, zp, best_zp)
        best_err = torch.where(better, err, best_err)
    return best_scale, best_zp


def group_fits(w_shape: list[int], k_axis: int, config: QuantConfig) -> bool:
    return config.weight_granularity == "group" and w_shape[k_axis] % int(config.group_size) == 0


def quantize_weight(w: torch.Tensor, config: QuantConfig, channel_axis: int, k_axis: int) -> QuantizedWeight:
    """``w`` quantized as ``config`` says: per tensor, per output channel (``channel_axis``) or per group of
    ``config.group_size`` along ``k_axis`` (w must then be 2-D; a K the group does not divide: per channel)."""
    dtype = str(config.weight_dtype)
    symmetric = config.weight_symmetric or dtype.startswith("float8")
    granularity = config.weight_granularity
    if granularity == "group" and not group_fits(list(w.shape), k_axis, config):
        granularity = "channel"
    wf = w.detach().to(torch.float32)
    if granularity == "tensor":
        scale, zp = search_rows(wf.reshape(1, -1), dtype, symmetric, config.clip_ratios)
        scale, zp, axis, group = scale.reshape(()), zp.reshape(()), None, None
    elif granularity == "channel":
        moved = wf.movedim(channel_axis, 0)
        scale, zp = search_rows(moved.reshape(moved.shape[0], -1), dtype, symmetric, config.clip_ratios)
        axis, group = channel_axis % w.dim(), None
    else:
        g = int(config.group_size)
        moved = wf.movedim(channel_axis, 0)  # [C, K]
        c, k = moved.shape
        scale, zp = search_rows(moved.reshape(c * k // g, g), dtype, symmetric, config.clip_ratios)
        # the spec's layout: w's shape with K divided by g ([C, K/g] for [C, K]; [K/g, C] for [K, C])
        scale = scale.reshape(c, k // g).movedim(0, channel_axis).contiguous()
        zp = zp.reshape(c, k // g).movedim(0, channel_axis).contiguous()
        axis, group = k_axis % w.dim(), g
    zero_point = None if symmetric else zp.to(qn.storage_dtype("uint8" if dtype in ("uint4", "uint8") else "int8"))
    codes = qn.quantize(wf, scale, zero_point, dtype=dtype, axis=axis, group_size=group)
    return QuantizedWeight(codes, scale, zero_point, dtype, axis, group, granularity)


def fold_batch_norm(w: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor,
                    mean: torch.Tensor, var: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A convolution's weight and bias with its inference batch norm folded in: ``bn(conv(x, w) + b)`` =
    ``conv(x, w·k) + (b - mean)·k + beta`` with ``k = gamma / sqrt(var + eps)`` per output channel."""
    k = gamma.to(torch.float32) / torch.sqrt(var.to(torch.float32) + eps)
    w_folded = w.to(torch.float32) * k.reshape(-1, *([1] * (w.dim() - 1)))
    b = bias.to(torch.float32) if bias is not None else torch.zeros_like(k)
    return w_folded.to(w.dtype), ((b - mean.to(torch.float32)) * k + beta.to(torch.float32)).to(w.dtype)
