"""Which of the two kernels a contraction runs on."""

from __future__ import annotations

from ..wgsl import Call, Shader
from .gemv import GEMV_ROWS, _gemv
from .operands import Contraction
from .qgemv import _qgemv, has_blocks
from .tiled import _tiled


def run(call: Call, c: Contraction) -> Shader:
    """The GEMV kernel where C has few rows and B is fixed (the block GEMV where B is GGUF blocks), else the tiled
    one (whose loads decode blocks element by element: prefill)."""
    if 0 < c.batch * c.m <= GEMV_ROWS and c.n and has_blocks(c):
        return _qgemv(call, c)
    if 0 < c.batch * c.m <= GEMV_ROWS and c.n and not any(b.batched for b in c.bs):
        return _gemv(call, c)
    return _tiled(call, c)
