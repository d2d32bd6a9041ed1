"""Default comparison tolerances, one row per dtype, in one table.

The IR runs the very ATen kernels eager PyTorch runs, so an honest IR differs from eager only by
summation order (a decomposed op, a reassociated reduction). The tolerances allow that and not
more: about 800 ulps for float32 (long reductions reassociate), a handful of ulps for the 16-bit
formats, whose ulp is already large. Integers and booleans (indices, masks, argmax) must be equal.
"""

from __future__ import annotations

import torch

#: dtype -> (rtol, atol). A value passes when ``|actual - expected| <= atol + rtol * |expected|``.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-4, 1e-5),
}
EXACT: tuple[float, float] = (0.0, 0.0)


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for ``dtype`` from the table; exact for integers and bool.

    Example::

        >>> default_tolerance(torch.float16)
        (0.01, 0.001)
    """
    if dtype in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype]
    if dtype.is_floating_point:
        eps = torch.finfo(dtype).eps  # float8 and other rare formats: two ulps at 1.0
        return (2 * eps, eps)
    return EXACT


def tolerance_for(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """The tolerance to use: the user's ``rtol``/``atol`` where given, else the table's.

    Integers and booleans stay exact whatever is given: an index that is off by one is wrong, and
    a loose float tolerance passed for the whole model should not hide that.

    Example::

        >>> tolerance_for(torch.float32, atol=1e-3)
        (0.0001, 0.001)
        >>> tolerance_for(torch.int64, rtol=0.1, atol=1.0)
        (0.0, 0.0)
    """
    default_rtol, default_atol = default_tolerance(dtype)
    if not (dtype.is_floating_point or dtype.is_complex):
        return EXACT
    return (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)
