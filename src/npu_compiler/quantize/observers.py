"""Activation observers: what calibration sees of a tensor, and the per-tensor scale and zero point from it.

``minmax`` takes the whole observed range; ``percentile`` clips at the given percentile of the values (an outlier
no longer sets the step); ``mse`` tries ranges shrunk from the observed one and keeps the one whose
quantize-dequantize error on the observed values is least. The last two keep a seeded random sample of at most
``SAMPLE`` values per tensor, so memory stays bounded whatever the calibration set's size.
"""

from __future__ import annotations

import torch

from torch_ir.quant.spec import QTYPES

SAMPLE = 1 << 16
_MSE_RATIOS = tuple(1.0 - 0.02 * i for i in range(40))


class Observer:
    """Running min/max of a tensor, and a bounded sample of its values."""

    def __init__(self, kind: str = "minmax", percentile: float = 99.99, seed: int = 0):
        self.kind, self.percentile = kind, percentile
        self.lo, self.hi = float("inf"), float("-inf")
        self.samples: list[torch.Tensor] = []
        self.kept = 0
        self.gen = torch.Generator().manual_seed(seed)

    def observe(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1)
        if not x.numel() or not x.is_floating_point():
            return
        x = x.to(torch.float32)
        self.lo, self.hi = min(self.lo, x.min().item()), max(self.hi, x.max().item())
        if self.kind != "minmax" and self.kept < 4 * SAMPLE:
            take = min(x.numel(), SAMPLE)
            pick = x if take == x.numel() else x[torch.randint(x.numel(), (take,), generator=self.gen)]
            self.samples.append(pick)
            self.kept += pick.numel()

    def range(self, dtype: str, symmetric: bool) -> tuple[float, float]:
        """The (lo, hi) range to quantize to; lo <= 0 <= hi."""
        if self.lo > self.hi:  # never observed (a branch calibration did not reach): a unit range
            return -1.0, 1.0
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
        if self.kind == "percentile" and self.samples:
            values = torch.cat(self.samples)
            q = torch.tensor([1 - self.percentile / 100, self.percentile / 100])
            plo, phi = torch.quantile(values, q).tolist()
            lo, hi = min(plo, 0.0), max(phi, 0.0)
        elif self.kind == "mse" and self.samples:
            lo, hi = _mse_range(torch.cat(self.samples), lo, hi, dtype, symmetric)
        return lo, hi


def _mse_range(values: torch.Tensor, lo: float, hi: float, dtype: str, symmetric: bool) -> tuple[float, float]:
    best, best_err = (lo, hi), float("inf")
    for r in _MSE_RATIOS:
        scale, zp = qparams(lo * r, hi * r, dtype, symmetric)
        err = (fake_quant(values, scale, zp, dtype) - values).pow(2).mean().item()
        if err < best_err:
            best, best_err = (lo * r, hi * r), err
    return best


def qparams(lo: float, hi: float, dtype: str, symmetric: bool) -> tuple[float, int | None]:
    """Scale and zero point (None: symmetric, or an fp8 type) of a per-tensor range."""
    q_lo, q_hi, _ = QTYPES[dtype]
    if dtype.startswith("float8") or symmetric and q_lo < 0:
        return _positive(max(abs(lo), abs(hi)) / q_hi), None
    scale = _positive((hi - lo) / (q_hi - q_lo))
    zp = int(min(max(round(q_lo - lo / scale), q_lo), q_hi))
    return scale, zp


def _positive(scale: float) -> float:
    return scale if scale > 0 and scale == scale else 1.0


def fake_quant(x: torch.Tensor, scale: float, zp: int | None, dtype: str) -> torch.Tensor:
    q_lo, q_hi, _ = QTYPES[dtype]
    if dtype.startswith("float8"):
        return (x / scale).clamp(q_lo, q_hi).to(getattr(torch, dtype)).to(torch.float32) * scale
    z = zp or 0
    return (torch.round(x / scale) + z).clamp(q_lo, q_hi).sub(z).mul(scale)
