"""Element-wise comparison of one IR value with its trusted (eager PyTorch) value."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ops.values import dtype_name
from .tolerance import tolerance_for


@dataclass
class TensorDiff:
    """How far one tensor is from its expected value, and whether that is within tolerance.

    ``max_rel`` is taken over the elements whose expected value is finite and non-zero (elsewhere a
    relative error means nothing); ``mismatched`` counts the elements outside
    ``atol + rtol * |expected|``, the rule of ``torch.isclose``.
    """

    name: str
    shape: list[int]
    dtype: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    mismatched: int
    numel: int
    ok: bool
    note: str | None = None  # why the values could not be compared as they are (shape, dtype)

    def cells(self) -> list[str]:
        """The row of a report table: name, shape, dtype, errors, tolerance, result."""
        result = "ok" if self.ok else "FAIL" + (f" ({self.mismatched}/{self.numel})" if self.mismatched else "")
        if self.note:
            result += f"; {self.note}"
        return [self.name, _shape(self.shape), self.dtype, _num(self.max_abs), _num(self.max_rel),
                _num(self.rtol), _num(self.atol), result]


TABLE_HEADER = ["tensor", "shape", "dtype", "max abs err", "max rel err", "rtol", "atol", "result"]


def compare_tensors(name: str, actual: torch.Tensor, expected: torch.Tensor,
                    rtol: float | None = None, atol: float | None = None) -> TensorDiff:
    """Compare ``actual`` (from the IR) with ``expected`` (from PyTorch) with dtype-aware tolerance.

    NaNs count as equal when both sides have them in the same place, as do equal infinities.

    Example::

        >>> d = compare_tensors("y", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
        >>> d.ok, d.max_abs, d.max_rel
        (False, 0.5, 0.2)
    """
    rtol, atol = tolerance_for(expected.dtype, rtol, atol)
    shape, dtype, numel = list(expected.shape), dtype_name(expected.dtype), expected.numel()
    if actual.shape != expected.shape:
        return TensorDiff(name, shape, dtype, math.inf, math.inf, rtol, atol, numel, numel, False,
                          f"IR shape {list(actual.shape)}")
    max_abs, max_rel, bad = _errors(actual, expected, rtol, atol)
    # a dtype change fails even when the values agree: the IR promised the model's dtype
    note = f"IR dtype {dtype_name(actual.dtype)}" if actual.dtype != expected.dtype else None
    return TensorDiff(name, shape, dtype, max_abs, max_rel, rtol, atol, bad, numel, bad == 0 and note is None, note)


def _errors(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[float, float, int]:
    """(max absolute error, max relative error, number of elements outside tolerance)."""
    a, e = _widen(actual), _widen(expected)
    same = (a == e) | (a.isnan() & e.isnan())
    diff = torch.where(same, 0.0, (a - e).abs().nan_to_num(nan=math.inf, posinf=math.inf))
    # an infinity is close only to itself (``same`` above), as in torch.isclose: no slack around it
    allowed = torch.where(e.isfinite(), atol + rtol * e.abs(), 0.0)
    if actual.dtype == expected.dtype and not (expected.is_floating_point() or expected.is_complex()):
        bad = int(actual.ne(expected).sum())  # exact even for int64 values float64 cannot hold
    else:
        bad = int((diff > allowed).sum())
    scaled = (e != 0) & e.isfinite()
    max_rel = float((diff[scaled] / e[scaled].abs()).max()) if bool(scaled.any()) else 0.0
    return (float(diff.max()) if diff.numel() else 0.0), max_rel, bad


def _widen(t: torch.Tensor) -> torch.Tensor:
    """On the CPU in float64 (complex128), so that the error itself is computed without rounding."""
    dtype = torch.complex128 if t.dtype.is_complex else torch.float64
    return t.detach().to("cpu", dtype)


def _shape(shape: list) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _num(x: float) -> str:
    return f"{x:.3g}"  # 0, 0.0124, 1e-05, inf: short, and exact enough to judge an error
