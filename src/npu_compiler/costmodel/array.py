"""The MAC array's and the vector unit's arithmetic (see ``model``'s docstring): one GEMM mapped onto the array
under its dataflow (``gemm_on_array``), the MAC rate of a dtype, vector cycles, and the tiling of a contraction's
operands through SRAM."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import Hardware


def _rate(hw: Hardware, cls: str | None) -> tuple[float, str | None]:
    """(MACs per PE per cycle, a flag when the dtype is unsupported and the slowest supported rate is used)."""
    rate = hw.mac_rate(cls) if cls else 0.0
    if rate > 0:
        return rate, None
    slowest = min(r for r in hw.macs_per_cycle.values() if r > 0)
    return slowest, f"{cls or 'this dtype'} is unsupported by {hw.name}: costed at the slowest supported rate"


@dataclass(frozen=True)
class ArrayRun:
    """One M x N x K GEMM on an R x C array (see ``model``'s docstring): folds, cycles at one MAC per PE per
    cycle, and the array's SRAM accesses in elements."""

    folds: int
    cycles: int
    a_reads: int  # the activation operand (M x K; SCALE-Sim's IFMAP)
    w_reads: int  # the weight operand (K x N; SCALE-Sim's filter)
    writes: int  # outputs and partial sums (M x N per K fold where K is not pinned whole; SCALE-Sim's OFMAP)


def gemm_on_array(rows: int, cols: int, dataflow: str, m: int, n: int, k: int) -> ArrayRun:
    """The mapping of one M x N x K GEMM onto a ``rows`` x ``cols`` array under ``dataflow``.

    >>> gemm_on_array(4, 4, "output_stationary", 8, 8, 16)  # 4 folds of 16 + 4 + 4 - 2 cycles
    ArrayRun(folds=4, cycles=88, a_reads=256, w_reads=256, writes=64)
    """
    fm, fn, fk = -(-m // rows), -(-n // cols), -(-k // rows)
    if dataflow == "output_stationary":
        folds = fm * fn
        return ArrayRun(folds, folds * (k + rows + cols - 2), m * k * fn, k * n * fm, m * n)
    if dataflow == "weight_stationary":
        folds = fk * fn
        return ArrayRun(folds, folds * (m + 2 * rows + cols - 2), m * k * fn, k * n, m * n * fk)
    fmc = -(-m // cols)  # input_stationary: M lies along the columns
    folds = fk * fmc
    return ArrayRun(folds, folds * (n + 2 * rows + cols - 2), m * k, k * n * fmc, m * n * fk)


def _vector_cycles(hw: Hardware, vclass: str, elements: int) -> int:
    if not elements:
        return 0
    return math.ceil(elements / (hw.vector_lanes * hw.vector_ops_per_cycle[vclass]))


def _tile(hw: Hardware, w: int, a: int, acc: int) -> tuple[str, int, int, int]:
    """(tiling, weight reads, activation reads, SRAM working set) of a contraction (see ``model``'s docstring)."""
    if hw.sram_shared:
        size = hw.sram_weights_bytes
        fits = w + a <= size
        sw = sa = max(1, size // 2)
        sram = min(w + a + acc, size)
    else:
        sw, sa = hw.sram_weights_bytes, hw.sram_activations_bytes
        fits = w <= sw and a <= sa
        sram = min(w, sw) + min(a, sa) + min(acc, hw.sram_accumulators_bytes)
    if fits:
        return "resident", 1, 1, sram
    w_blocks, a_blocks = max(1, -(-w // sw)), max(1, -(-a // sa))
    if w + a * w_blocks <= a + w * a_blocks:
        return "keep weights", 1, w_blocks, sram
    return "keep activations", a_blocks, 1, sram
