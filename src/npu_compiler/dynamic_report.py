"""What each way of serving a dynamic dimension costs, for the lengths a model actually serves.

    >>> from npu_compiler.dynamic_report import bucket_report
    >>> report = bucket_report(ir, "seq", [12, 40, 40, 300], bind={"batch": 1}, buckets=[64, 512])  # doctest: +SKIP
    >>> print("\\n".join(report.table()))  # doctest: +SKIP

For one symbol of the IR (``seq``; the others fixed by ``bind``) and the observed lengths (a list, or a histogram
``{length: count}``), every candidate bucket size is compiled as a static program (``compile(ir, bind=...)``) and
costed by the cost model (``costmodel.cost_program``): arena bytes, FLOPs, latency. Three ways of serving the
traffic are compared (``dynamic_buckets`` does the arithmetic):

- the given buckets: each length runs in the smallest bucket that holds it, padded;
- the suggested buckets: the subset of the candidates (powers of two, their 1.5x midpoints, the range max, the
  longest observed length and the given buckets) with the least expected latency, at most ``max_buckets`` of them
  and within ``memory_cap`` arena bytes; found exactly, by a dynamic programme;
- the upper-bound plan (ExecuTorch-style): one arena planned for the range max, every dispatch sized at run time,
  so a length pays what a program compiled at exactly that length costs, with no padding. It is costed at each
  distinct observed length when there are at most ``EXACT_POINTS``, else at ``EXACT_POINTS`` sizes and linearly
  interpolated between them (the report says which).

The figures are the cost model's, on the described NPU (``hw``); arena bytes are the activation arena of the
memory plan (weights and any KV cache are shared by every variant and left out).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from npu_compiler.costmodel.hardware import DEFAULT_PRESET
from torch_ir.fileio import atomic_write
from torch_ir.ir import NPU_IR

from .compiler import CompileOptions, compile, load_source
from .dynamic_buckets import BucketSet, SizeCost, candidate_sizes, evaluate, interpolate, interpolation_grid, suggest
from .errors import CompileError

if TYPE_CHECKING:
    from .costmodel.hardware import Hardware

#: Up to this many distinct observed lengths, the upper-bound plan is costed at each; beyond, at this many sizes.
EXACT_POINTS = 48
#: The preset costed on when none is named.
DEFAULT_HW = DEFAULT_PRESET
CSV_COLUMNS = ("row", "name", "sizes", "arena_bytes", "arena_sum_bytes", "flops", "latency_ms", "share_given",
               "share_suggested", "expected_latency_ms", "waste")


class DynamicReportError(CompileError):
    """Bad input to the dynamic-shape report: the message names the symbol, length or bucket and the fix."""


@dataclass
class DynamicReport:
    """Per-bucket figures and the bucket sets compared (see the module docstring)."""

    model_name: str
    symbol: str
    low: int
    high: int
    bind: dict[str, int]
    hardware: str
    dtype: str | None
    histogram: dict[int, int]  # length -> requests, sorted by length
    sizes: dict[int, SizeCost]  # every size compiled: the candidates and the upper-bound plan's points
    candidates: tuple[int, ...]
    given: BucketSet | None
    suggested: BucketSet
    upper_bound: BucketSet
    upper_bound_points: tuple[int, ...]
    interpolated: bool
    max_buckets: int
    memory_cap: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def sets(self) -> list[BucketSet]:
        return [s for s in (self.given, self.suggested, self.upper_bound) if s is not None]

    def table(self) -> list[str]:
        """The report as text lines: the candidate buckets, then the bucket sets compared."""
        from .dynamic_text import report_lines

        return report_lines(self)

    def csv_rows(self) -> list[dict[str, object]]:
        """One row per candidate bucket, then one per bucket set (``CSV_COLUMNS``)."""
        rows: list[dict[str, object]] = []
        given = self.given.share if self.given else {}
        for size in self.candidates:
            c = self.sizes[size]
            rows.append({"row": "bucket", "name": str(size), "sizes": str(size), "arena_bytes": c.arena_bytes,
                         "arena_sum_bytes": c.arena_bytes, "flops": c.flops, "latency_ms": f"{c.latency_ms:.6g}",
                         "share_given": _share(given, size), "share_suggested": _share(self.suggested.share, size)})
        for s in self.sets:
            rows.append({"row": "set", "name": s.name, "sizes": " ".join(map(str, s.sizes)),
                         "arena_bytes": s.arena_shared, "arena_sum_bytes": s.arena_sum,
                         "expected_latency_ms": f"{s.expected_latency_ms:.6g}", "waste": f"{s.waste:.6g}"})
        return rows

    def to_csv(self, path: str | Path) -> Path:
        """Write ``csv_rows`` to ``path`` atomically; returns the path."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.csv_rows())
        atomic_write(path, buffer.getvalue(), what="dynamic-shape report CSV")
        return Path(path)

    def plot(self, directory: str | Path) -> list[Path]:
        """Write ``lengths.png`` (the length histogram with the given and suggested bucket edges), ``buckets.png``
        (arena bytes and latency per candidate against the upper-bound plan) and ``sets.png`` (expected latency
        against padded compute per set) into ``directory``; needs matplotlib (``pip install 'torch-ir[cost]'``)."""
        from .dynamic_plot import write_plots

        return write_plots(self, Path(directory))


def _share(share: Mapping[int, float], size: int) -> str:
    return f"{share[size]:.6g}" if size in share else ""


def bucket_report(ir: NPU_IR | dict | str | Path, symbol: str, lengths: Iterable[int] | Mapping[int, int], *,
                  buckets: Iterable[int] | None = None, bind: Mapping[str, int] | None = None,
                  memory_cap: int | None = None, max_buckets: int = 4, target: str = "cpu",
                  hw: str | Path | Hardware = DEFAULT_HW, dtype: str | None = None,
                  options: CompileOptions | None = None,
                  progress: Callable[[str], None] | None = None) -> DynamicReport:
    """The dynamic-shape report of ``ir`` for ``symbol`` over ``lengths`` (see the module docstring).

    ``bind`` fixes the IR's other symbols (``{"batch": 1}``); ``buckets`` is a bucket set to compare (sizes of
    ``symbol``); ``memory_cap`` bounds the suggested set's shared arena in bytes; ``hw`` is a cost-model preset,
    a hardware file or a ``Hardware``; ``dtype`` is ``cost_program``'s (None: each dispatch's own). ``progress``
    is given one line per compiled size. Raises ``DynamicReportError`` for bad input, ``CompileError`` when a
    needed size does not compile."""
    from .costmodel import Hardware, load_hardware

    ir = load_source(ir)
    low, high = _check_symbol(ir, symbol, bind or {})
    histogram = histogram_of(lengths, symbol, low, high)
    given = _check_buckets(buckets, symbol, low, high, histogram)
    _check_limits(memory_cap, max_buckets)
    hardware = hw if isinstance(hw, Hardware) else load_hardware(hw)
    measure = _Measure(ir, symbol, dict(bind or {}), target, options, hardware, dtype, progress)
    candidates = candidate_sizes(low, high, max(histogram), given or ())
    points, interpolated = _upper_bound_points(histogram, candidates)
    measure.plan(len(set(candidates) | set(points)))
    for size in [high, *(given or ()), *points]:  # needed: a failure here is the report's failure
        measure(size)
    notes = []
    for size in candidates:  # the grid: a size the model cannot take (a recorded guard) is passed over
        try:
            measure(size)
        except CompileError as err:
            notes.append(f"{symbol}={size} left out of the candidates: {err}")
    candidates = [s for s in candidates if s in measure.costs]
    costs = measure.costs
    useful = {n: interpolate({p: costs[p] for p in points}, n, lambda c: c.flops) for n in histogram}
    chosen = _suggest(histogram, costs, candidates, max_buckets, memory_cap, symbol)
    upper = _upper_bound_set(histogram, costs, points, high)
    return DynamicReport(
        ir.model_name, symbol, low, high, dict(bind or {}), hardware.name, dtype, histogram,
        dict(sorted(costs.items())), tuple(candidates),
        evaluate("given", given, histogram, costs, useful) if given else None,
        evaluate("suggested", chosen, histogram, costs, useful), upper, tuple(points), interpolated, max_buckets,
        memory_cap, notes)


class _Measure:
    """Compile and cost the static program at one size of the symbol, once per size."""

    def __init__(self, ir: NPU_IR, symbol: str, bind: dict[str, int], target: str,
                 options: CompileOptions | None, hardware: Hardware, dtype: str | None,
                 progress: Callable[[str], None] | None) -> None:
        self.ir, self.symbol, self.bind, self.target, self.options = ir, symbol, bind, target, options
        self.hardware, self.dtype, self.progress = hardware, dtype, progress
        self.costs: dict[int, SizeCost] = {}
        self.total = 0

    def plan(self, total: int) -> None:
        self.total = total

    def __call__(self, size: int) -> SizeCost:
        from .costmodel import cost_program

        if size in self.costs:
            return self.costs[size]
        program = compile(self.ir, target=self.target, options=self.options, bind={**self.bind, self.symbol: size})
        report = cost_program(program, self.hardware, dtype=self.dtype)
        cost = SizeCost(size, program.memory.arena_bytes, report.flops, report.latency_ms)
        self.costs[size] = cost
        if self.progress is not None:
            self.progress(f"compiled {self.symbol}={size} ({len(self.costs)}/{max(self.total, len(self.costs))}): "
                          f"arena {human_bytes(cost.arena_bytes)}, {cost.latency_ms:.4g} ms")
        return cost


def histogram_of(lengths: Iterable[int] | Mapping[int, int], symbol: str, low: int, high: int) -> dict[int, int]:
    """``lengths`` (a list of observed lengths, or ``{length: count}``) as a histogram sorted by length; every
    length a whole number inside ``[low, high]``, every count a whole number >= 0, and at least one request."""
    if isinstance(lengths, Mapping):
        counts = dict(lengths)
    else:
        counts = Counter(lengths)
    for length, count in counts.items():
        if not _whole(length) or not low <= length <= high:
            rule = f"length {length!r} is outside the range of {symbol!r} the model was exported for ({low}..{high})"
            raise DynamicReportError(f"{rule}; fix: leave it out of the lengths, or export the model with a wider "
                                     "torch.export.Dim",
                                     cli=f"--lengths: {rule}; fix: leave it out, or export the model with a wider "
                                         "torch.export.Dim")
        if not _whole(count) or count < 0:
            raise DynamicReportError(f"length {length}: count {count!r} must be a whole number >= 0")
    histogram = {int(n): int(c) for n, c in sorted(counts.items()) if c > 0}
    if not histogram:
        raise DynamicReportError(f"no observed lengths of {symbol!r} to report on; fix: give at least one length")
    return histogram


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_symbol(ir: NPU_IR, symbol: str, bind: Mapping[str, int]) -> tuple[int, int]:
    """(min, max) of ``symbol``; every other symbol of the IR must be in ``bind``, and ``symbol`` must not."""
    symbols = sorted(ir.symbols)
    if symbol not in ir.symbols:
        raise DynamicReportError(f"IR {ir.model_name!r} has no symbol {symbol!r} to report on; its symbols are "
                                 f"{', '.join(symbols) or 'none (it is static)'}")
    if symbol in bind:
        raise DynamicReportError(f"symbol {symbol!r} is both reported on and bound to {bind[symbol]}; fix: leave "
                                 f"{symbol} out of bind (the report varies it)",
                                 cli=f"--bind {symbol}={bind[symbol]}: {symbol} is the symbol --report-dynamic "
                                     f"varies; fix: leave --bind {symbol} out")
    unbound = [s for s in symbols if s != symbol and s not in bind]
    if unbound:
        example = " ".join(f"--bind {s}=1" for s in unbound)
        raise DynamicReportError(
            f"IR {ir.model_name!r}: symbol(s) {', '.join(unbound)} must be fixed for the report on {symbol!r}; fix: "
            f"bind={{{', '.join(f'{s!r}: 1' for s in unbound)}}}",
            cli=f"IR {ir.model_name!r}: symbol(s) {', '.join(unbound)} must be fixed for the report on {symbol!r}; "
                f"fix: {example}")
    spec = ir.symbols[symbol]
    low, high = spec.get("min"), spec.get("max")
    if not _whole(low) or not _whole(high):
        raise DynamicReportError(f"IR {ir.model_name!r}: symbol {symbol!r} has no bounded range ({low}..{high}) to "
                                 "plan buckets in; fix: export it with torch.export.Dim(min=..., max=...)")
    return low, high


def _check_buckets(buckets: Iterable[int] | None, symbol: str, low: int, high: int,
                   histogram: Mapping[int, int]) -> tuple[int, ...] | None:
    if buckets is None:
        return None
    sizes = list(buckets)
    flag = f"--buckets {symbol}={','.join(map(str, sizes))}"
    for size in sizes:
        if not _whole(size) or not low <= size <= high:
            raise DynamicReportError(f"bucket {size!r} of {symbol!r} is outside its range ({low}..{high}); fix: "
                                     "give bucket sizes inside the range",
                                     cli=f"{flag}: {size} is outside the range of {symbol} ({low}..{high}); fix: "
                                         "give sizes inside the range")
    if not sizes or len(set(sizes)) != len(sizes):
        raise DynamicReportError(f"buckets {sizes} of {symbol!r}: give one or more distinct sizes",
                                 cli=f"{flag}: give one or more distinct sizes")
    longest = max(histogram)
    if max(sizes) < longest:
        over = [n for n in histogram if n > max(sizes)]
        raise DynamicReportError(
            f"buckets {sorted(sizes)} of {symbol!r} do not cover the observed lengths {_some(over)}; fix: add a "
            f"bucket of at least {longest}",
            cli=f"{flag} does not cover the observed lengths {_some(over)}; fix: add a size of at least {longest}")
    return tuple(sorted(sizes))


def _some(values: list[int], limit: int = 5) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _check_limits(memory_cap: int | None, max_buckets: int) -> None:
    if memory_cap is not None and (not _whole(memory_cap) or memory_cap <= 0):
        raise DynamicReportError(f"memory_cap {memory_cap!r}: give a positive number of bytes",
                                 cli=f"--memory-cap {memory_cap}: give a positive size (e.g. --memory-cap 8MiB)")
    if not _whole(max_buckets) or max_buckets < 1:
        raise DynamicReportError(f"max_buckets {max_buckets!r}: give a whole number >= 1",
                                 cli=f"--max-buckets {max_buckets}: give a whole number >= 1")


def _upper_bound_points(histogram: Mapping[int, int], candidates: list[int]) -> tuple[list[int], bool]:
    if len(histogram) <= EXACT_POINTS:
        return sorted(histogram), False
    return interpolation_grid(list(histogram), candidates, EXACT_POINTS), True


def _suggest(histogram: Mapping[int, int], costs: Mapping[int, SizeCost], candidates: list[int], max_buckets: int,
             memory_cap: int | None, symbol: str) -> tuple[int, ...]:
    """The optimizer's set, the candidates over ``memory_cap`` left out; refused when none left holds the longest
    length."""
    allowed = [s for s in candidates if memory_cap is None or costs[s].arena_bytes <= memory_cap]
    chosen = suggest(histogram, costs, allowed, max_buckets)
    if chosen is not None:
        return chosen
    longest = max(histogram)
    smallest = min(s for s in candidates if s >= longest)
    need = costs[smallest].arena_bytes
    raise DynamicReportError(
        f"length {longest} of {symbol!r} needs a bucket of at least {longest}; the smallest, {symbol}={smallest}, "
        f"needs {need:,} arena bytes ({human_bytes(need)}), over memory_cap={memory_cap:,}; fix: raise memory_cap "
        f"to at least {need}, or leave the lengths over the cap out",
        cli=f"length {longest} of {symbol} needs a bucket of at least {longest}; the smallest, {symbol}={smallest}, "
            f"needs {need:,} arena bytes ({human_bytes(need)}), over --memory-cap {memory_cap:,}; fix: "
            f"--memory-cap {need} or more")


def _upper_bound_set(histogram: Mapping[int, int], costs: Mapping[int, SizeCost], points: list[int],
                     high: int) -> BucketSet:
    """One arena planned for the range max; each length pays the program at exactly its length, no padding."""
    measured = {p: costs[p] for p in points}
    total = sum(histogram.values())
    latency = sum(c * interpolate(measured, n, lambda s: s.latency_ms) for n, c in histogram.items())
    arena = costs[high].arena_bytes
    return BucketSet("upper bound", (high,), latency / total, 0.0, arena, arena, {high: 1.0})


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable: the loop returns at GiB


__all__ = ["CSV_COLUMNS", "DEFAULT_HW", "EXACT_POINTS", "DynamicReport", "DynamicReportError", "bucket_report",
           "histogram_of", "human_bytes"]
