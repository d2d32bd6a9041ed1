"""The cost model's results: the cost of each dispatch (``DispatchCost``, ``HostDispatch``), of each layer
(``LayerCost``) and of a program (``CostReport``: totals, per-layer sums, CSV rows and a summary)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch_ir.errors import TorchIRError
from torch_ir.report.cells import one_line

from .array import _rate
from .hardware import Hardware

#: Columns of ``CostReport.to_csv_rows`` (after Arm Vela's per-layer performance report): ``cost.csv`` and the
#: per-dispatch table of ``report.html`` both show exactly these.
#: ``dtype`` is the width the dispatch computes in (its MAC rate), ``operands`` the types it multiplies; the DRAM
#: bytes split into those of weights and constants (scales, zero points included) and of activations.
CSV_COLUMNS = ("index", "name", "kernel", "layer", "dtype", "operands", "macs", "flops", "cycles", "network_pct",
               "util_pct", "dram_bytes", "weight_bytes", "activation_bytes", "sram_bytes", "sram_reads", "sram_writes",
               "bound", "tiling", "mapping", "notes")


class CostModelError(TorchIRError, ValueError):
    """A cost-model argument or program cannot be costed; the message names it and the fix."""


@dataclass(frozen=True)
class DispatchCost:
    """The cost of one NPU dispatch (see ``model``'s docstring for how each number is modelled)."""

    index: int
    name: str
    kernel: str
    kind: str
    layer: str
    dtype: str  # the width it computes in, the MAC rate class used: int4, int8, int16, fp8, fp16, bf16 or fp32
    macs: int
    flops: int
    mapping: str  # e.g. "gemm 1x(M=8 N=8 K=16) output_stationary" or "vector elementwise"
    folds: int
    array_cycles: int
    vector_cycles: int
    compute_cycles: int
    memory_cycles: int
    cycles: int
    utilization: float
    tiling: str  # resident | keep weights | keep activations | stream (vector kernels)
    weight_reads: int
    activation_reads: int
    dram_bytes_read: int
    dram_bytes_written: int
    sram_bytes: int
    bound: str
    flags: tuple[str, ...] = ()
    #: Array-side SRAM accesses in elements (words): operand reads and output (partial-sum) writes.
    sram_reads: int = 0
    sram_writes: int = 0
    #: The types it multiplies (``int8 x int4 g128``), or its dtype (vector work).
    operands: str = ""
    #: DRAM bytes read of weights and constants (a quantized weight's codes, scales and zero points), as tiled.
    weight_bytes: int = 0
    #: (name, bytes) of each weight or constant it reads, whole, at the size it is costed at.
    weight_sizes: tuple[tuple[str, int], ...] = ()

    @property
    def dram_bytes(self) -> int:
        return self.dram_bytes_read + self.dram_bytes_written

    @property
    def activation_bytes(self) -> int:
        """DRAM bytes of everything but weights and constants: activations read and written, KV cache."""
        return self.dram_bytes - self.weight_bytes


@dataclass(frozen=True)
class HostDispatch:
    """A dispatch that runs on the host CPU: no NPU cycles."""

    index: int
    name: str
    kernel: str
    reason: str


@dataclass(frozen=True)
class LayerCost:
    """Dispatches of one module path, summed."""

    layer: str
    dispatches: int
    macs: int
    cycles: int
    dram_bytes: int
    sram_bytes: int


@dataclass
class CostReport:
    """Per-dispatch costs of one program on one NPU, with totals."""

    hardware: Hardware
    model_name: str
    rows: list[DispatchCost]
    host: list[HostDispatch] = field(default_factory=list)
    bind: list[DispatchCost] = field(default_factory=list)
    #: One line on the precision costed at and why, shown under the summary's first line (``torch-ir cost``
    #: sets it: "costed at int8, the hardware's native precision; --dtype to change").
    dtype_note: str = ""
    #: The positions of the program's KV cache (None without one) and the live ones costed (None: all of them).
    cache_length: int | None = None
    context: int | None = None
    #: The KV cache's bytes (its state slots together) and their dtypes (``int8 + float32``: a quantized cache).
    cache_bytes: int | None = None
    cache_dtypes: str = ""
    #: The ``precision`` costed at (``precision.PRECISIONS``), None without one.
    precision: str | None = None

    @property
    def total_cycles(self) -> int:
        return sum(r.cycles for r in self.rows)

    @property
    def compute_cycles(self) -> int:
        return sum(r.compute_cycles for r in self.rows)

    @property
    def memory_cycles(self) -> int:
        return sum(r.memory_cycles for r in self.rows)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.rows)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def latency_ms(self) -> float:
        return self.total_cycles / (self.hardware.clock_mhz * 1e3)

    @property
    def fps(self) -> float:
        return 1000.0 / self.latency_ms if self.latency_ms > 0 else math.inf

    @property
    def utilization(self) -> float:
        """MACs done over MACs the array could have done in the program's total cycles (at each row's rate)."""
        hw = self.hardware
        peak = sum(r.cycles * hw.pes * _rate(hw, r.dtype)[0] for r in self.rows)
        return self.macs / peak if peak else 0.0

    @property
    def dram_bytes(self) -> int:
        return sum(r.dram_bytes for r in self.rows)

    @property
    def weight_bytes(self) -> int:
        """DRAM bytes read of weights and constants per inference (re-reads of tiling included)."""
        return sum(r.weight_bytes for r in self.rows)

    @property
    def activation_bytes(self) -> int:
        return sum(r.activation_bytes for r in self.rows)

    @property
    def weights_stored(self) -> int:
        """Bytes of the weights and constants the NPU dispatches read (bind-time ones too), each counted once at
        the smallest size a dispatch reads it at (a tied embedding stored quantized for the head)."""
        sizes: dict[str, int] = {}
        for r in [*self.bind, *self.rows]:
            for name, size in r.weight_sizes:
                sizes[name] = min(size, sizes.get(name, size))
        return sum(sizes.values())

    @property
    def peak_sram_bytes(self) -> int:
        return max((r.sram_bytes for r in self.rows), default=0)

    def by_layer(self, depth: int | None = None) -> dict[str, LayerCost]:
        """Dispatches grouped by module path (``DispatchCost.layer``), in program order; ``depth`` keeps only the
        first ``depth`` dotted components (``depth=3``: ``encoder.stages.0``)."""
        groups: dict[str, list[DispatchCost]] = {}
        for r in self.rows:
            key = ".".join(r.layer.split(".")[:depth]) if depth else r.layer
            groups.setdefault(key, []).append(r)
        return {k: LayerCost(k, len(rs), sum(r.macs for r in rs), sum(r.cycles for r in rs),
                             sum(r.dram_bytes for r in rs), max(r.sram_bytes for r in rs)) for k, rs in groups.items()}

    @property
    def context_note(self) -> str:
        """For a program with a KV cache: how many of its positions attention was costed as reading."""
        held = f"; it holds {self.cache_bytes:,} bytes ({self.cache_dtypes})" if self.cache_bytes is not None else ""
        if self.context is None:
            return (f"KV cache: attention reads all {self.cache_length} positions (the whole cache: the slowest "
                    f"run){held}")
        return f"KV cache: attention reads the {self.context} live positions of {self.cache_length} (the context){held}"

    def to_csv_rows(self) -> list[dict[str, Any]]:
        """One dict per NPU dispatch with the ``CSV_COLUMNS`` (for ``csv.DictWriter``)."""
        total = self.total_cycles or 1
        return [{"index": r.index, "name": r.name, "kernel": r.kernel, "layer": r.layer, "dtype": r.dtype,
                 "operands": r.operands, "macs": r.macs, "flops": r.flops, "cycles": r.cycles,
                 "network_pct": round(100 * r.cycles / total, 2), "util_pct": round(100 * r.utilization, 2),
                 "dram_bytes": r.dram_bytes, "weight_bytes": r.weight_bytes, "activation_bytes": r.activation_bytes,
                 "sram_bytes": r.sram_bytes,
                 "sram_reads": r.sram_reads, "sram_writes": r.sram_writes, "bound": r.bound, "tiling": r.tiling,
                 "mapping": r.mapping, "notes": "; ".join(r.flags)} for r in self.rows]

    def width_mix(self) -> str:
        """The dispatches by the width they compute in, and their cycles: ``int8 52 (81.0% of cycles), ...``."""
        total = self.total_cycles or 1
        counts: dict[str, list[int]] = {}
        for r in self.rows:
            entry = counts.setdefault(r.dtype, [0, 0])
            entry[0] += 1
            entry[1] += r.cycles
        return ", ".join(f"{w} {n} ({c / total:.1%} of cycles)" for w, (n, c) in counts.items()) or "none"

    def summary(self, top: int = 5) -> str:
        """A few readable lines: totals, the bound mix, the heaviest dispatches, host and bind-time work. Names
        come from the program (untrusted): each line is made one plain line (``plain_line``), so a name cannot
        forge a line or send escape sequences to a terminal."""
        hw = self.hardware
        lines = [
            f"{self.model_name} on {hw.name} ({hw.rows}x{hw.cols} {hw.dataflow}, {hw.clock_mhz:g} MHz, "
            f"{hw.dram_bandwidth_gbps:g} GB/s)",
            *([self.dtype_note] if self.dtype_note else
              [f"costed at precision {self.precision} (weights and activations by role)"] if self.precision else []),
            *([self.context_note] if self.cache_length else []),
            f"dispatches: {len(self.rows)} on the NPU, {len(self.host)} on the host, {len(self.bind)} at bind time",
            f"cycles: {self.total_cycles:,} ({self.latency_ms:.3f} ms, {self.fps:.1f} fps)  "
            f"compute {self.compute_cycles:,}  memory {self.memory_cycles:,}",
            f"MACs: {self.macs:,}  utilization {self.utilization:.1%}  DRAM {self.dram_bytes:,} bytes  "
            f"peak SRAM {self.peak_sram_bytes:,} bytes",
            f"DRAM by role: weights {self.weight_bytes:,} bytes, activations {self.activation_bytes:,} bytes; "
            f"weights stored {self.weights_stored:,} bytes",
            f"compute widths: {self.width_mix()}",
            f"bound: {sum(r.bound == 'compute' for r in self.rows)} compute, "
            f"{sum(r.bound == 'memory' for r in self.rows)} memory",
        ]
        heavy = sorted(self.rows, key=lambda r: -r.cycles)[:top]
        if heavy:
            lines.append("heaviest dispatches:")
            total = self.total_cycles or 1
            lines += [f"  {r.name} ({r.kernel}): {r.cycles:,} cycles ({r.cycles / total:.1%}), {r.bound}-bound, "
                      f"util {r.utilization:.0%}" for r in heavy]
        flags = sorted({f for r in self.rows for f in r.flags})
        lines += [f"note: {f}" for f in flags]
        lines += [f"host: {h.name} ({h.kernel}): {h.reason}" for h in self.host]
        return "\n".join(plain_line(line) for line in lines)


def plain_line(text: str) -> str:
    """``text`` as one line of plain text: line breaks become spaces and every other unprintable character
    (an ANSI escape, a bidirectional override, ...) is shown escaped, as ``\\x1b``."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in one_line(text))
