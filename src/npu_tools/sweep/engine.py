"""One point of a sweep costed (and, at a quantized precision, its accuracy measured): ``evaluate(point, cache)``
gives one row, a dict with every column of ``COLUMNS``.

The work a point needs is cached per worker process in a :class:`ModelCache`, so no hardware point repeats it:

* extract: the model loaded as ``torch-ir cost`` loads it (``npu_tools.commands.normalize._load``: a zoo name, a
  Hugging Face ``config.json`` or directory, weight-free; an IR file as it is), once per model;
* compile: the float program (``npu_compiler.compile``, host fallback; an LLM's prefill and decode by
  ``compile_lm``; symbolic input dimensions bound to the example's shapes), once per model;
* calibrate and evaluate: at a quantized precision, the model quantized and compared with float
  (``accuracy.measure``), once per (model, precision);
* cost: ``cost_program(program, hw, precision=P)`` for every point: a float program costed as if quantized by role
  (``npu_compiler.costmodel.precision``), the same arithmetic ``torch-ir cost --precision`` does. An LLM's row is
  its decode step (ms per token over the whole cache) with its prefill chunk's latency in ``prefill_ms``.

A point that cannot be done (a model that fails to load or compile, a grid value out of the hardware file's range,
a precision whose compute width the hardware has no MACs for) is a row with ``status`` ``failed`` and the
``reason``; a cached failure fails the next point of that model at once, without retrying.

Phase times (``t_extract`` ... ``t_cost``, seconds) are the time this point spent in each phase: the point that
extracted a model carries its extraction, the others 0, so a column's sum is the sweep's time in that phase.

``area_proxy``: the silicon a hardware point costs, in PE equivalents: ``PEs + SRAM bytes / SRAM_BYTES_PER_PE``. A
PE (an 8-bit MAC with its operand and partial-sum registers) takes about the area of 256 bytes of SRAM (an
order-of-magnitude ratio for a modern process; e.g. 7 nm: ~0.03 um^2 per SRAM bit cell with periphery against
~60 um^2 per int8 MAC and its registers). A proxy to rank points on a Pareto front, not an area estimate.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from .accuracy import ACCURACY_COLUMNS, CALIBRATION_SEEDS, EVAL_SEEDS, measure, quant_preset, seeded_samples
from .grid import GRID_PARAMS, Point, format_value, point_hardware

Row = dict[str, Any]
SRAM_BYTES_PER_PE = 256
PHASES = ("extract", "compile", "calibrate", "evaluate", "cost")
TIMING_COLUMNS = tuple(f"t_{p}" for p in PHASES)
METRIC_COLUMNS = ("latency_ms", "cycles", "dram_bytes", "utilization", "peak_sram_bytes", "prefill_ms")
HARDWARE_COLUMNS = ("pes", "sram_bytes", "area_proxy")
#: Every column of the results, in order. The grid columns hold the value costed: the grid's, else the file's.
COLUMNS = ("key", "model", "hw", *GRID_PARAMS, "precision", "status", "reason", *METRIC_COLUMNS, *HARDWARE_COLUMNS,
           *ACCURACY_COLUMNS, *TIMING_COLUMNS)
#: The columns that differ between two runs of the same sweep (wall times); every other one is deterministic.
NONDETERMINISTIC_COLUMNS = TIMING_COLUMNS
#: Models a worker keeps (their IRs, programs and weights); a sweep's points come grouped by model, so the older
#: ones are done with and a zoo of 70 models does not fill the memory.
MAX_CACHED_MODELS = 2
_MAX_REASON_CHARS = 1000


@dataclass
class _Model:
    ir: Any
    spec: Any
    programs: Any = None  # {"": program} or {"prefill": ..., "decode": ...}; an exception when it failed
    normalized: Any = None
    weights: Any = None
    calibration: Any = None
    evaluation: Any = None


class ModelCache:
    """What the points of one worker share (module docstring); ``counts`` says how often each phase really ran
    (a cache hit counts nothing), by phase name."""

    def __init__(self, max_models: int = MAX_CACHED_MODELS) -> None:
        self.max_models = max_models
        self.counts: Counter[str] = Counter()
        self._models: OrderedDict[str, _Model | BaseException] = OrderedDict()
        self._accuracy: dict[tuple[str, str], dict[str, Any] | BaseException] = {}
        self._hardware: dict[tuple[str, tuple], Any] = {}

    def model(self, name: str, times: dict[str, float]) -> _Model:
        """The model loaded (extracted), or its failure raised again."""
        if name not in self._models:
            self._evict()
            from npu_tools.commands.normalize import _load

            start = time.perf_counter()
            self.counts["extract"] += 1
            try:
                self._models[name] = _Model(*_load(name))
            except Exception as e:  # noqa: BLE001 - a model that fails fails each of its points with the reason
                self._models[name] = e
            times["t_extract"] += time.perf_counter() - start
        self._models.move_to_end(name)
        return _raise_or(self._models[name])

    def programs(self, name: str, times: dict[str, float]) -> dict[str, Any]:
        m = self.model(name, times)
        if m.programs is None:
            start = time.perf_counter()
            self.counts["compile"] += 1
            try:
                m.programs = _compile(m.ir, m.spec)
            except Exception as e:  # noqa: BLE001 - as a failed extraction
                m.programs = e
            times["t_compile"] += time.perf_counter() - start
        return _raise_or(m.programs)

    def hardware(self, point: Point) -> Any:
        """The point's hardware (its file with the grid's values); a ``HardwareError`` for a bad one."""
        key = (point.hw, point.overrides)
        if key not in self._hardware:
            from npu_compiler.costmodel import load_hardware

            base_key = (point.hw, ())
            try:
                if base_key not in self._hardware:
                    self._hardware[base_key] = load_hardware(point.hw)
                self._hardware[key] = point_hardware(_raise_or(self._hardware[base_key]), point.overrides)
            except Exception as e:  # noqa: BLE001 - a bad file or grid value fails its points, not the sweep
                self._hardware.setdefault(base_key, e)
                self._hardware[key] = e
        return _raise_or(self._hardware[key])

    def accuracy(self, name: str, precision: str, times: dict[str, float]) -> dict[str, Any]:
        """The accuracy columns of ``name`` at ``precision`` (blank for a float one)."""
        preset = quant_preset(precision)
        if preset is None:
            return {}
        key = (name, precision)
        if key not in self._accuracy:
            m = self.model(name, times)
            self.counts["calibrate"] += 1
            try:
                self._prepare(m, times)
                self._accuracy[key] = measure(m.normalized, m.weights, preset, m.calibration, m.evaluation, times)
            except Exception as e:  # noqa: BLE001 - as a failed extraction
                self._accuracy[key] = e
        return _raise_or(self._accuracy[key])

    def _prepare(self, m: _Model, times: dict[str, float]) -> None:
        """The float model's normalized IR, weights and seeded samples, once per model (calibration's time)."""
        if m.normalized is not None:
            return
        from npu_compiler.passes import normalize

        start = time.perf_counter()
        if m.spec is not None:
            from torch_ir.weights import module_state

            m.weights = module_state(m.spec.build("cpu"))
        else:  # an IR file carries no weights: seeded ones, as a zoo model's
            from npu_compiler.padding import seeded_weights

            m.weights = seeded_weights(m.ir)
        normalized = m.ir if "normalize" in m.ir.metadata else normalize(m.ir)
        m.calibration = seeded_samples(normalized, m.spec, CALIBRATION_SEEDS)
        m.evaluation = seeded_samples(normalized, m.spec, EVAL_SEEDS)
        m.normalized = normalized
        times["t_calibrate"] += time.perf_counter() - start

    def _evict(self) -> None:
        while len(self._models) >= self.max_models > 0:
            old, _ = self._models.popitem(last=False)
            for key in [k for k in self._accuracy if k[0] == old]:
                del self._accuracy[key]


def _raise_or(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


def _compile(ir: Any, spec: Any) -> dict[str, Any]:
    import npu_compiler
    from npu_compiler.llm import compile_lm, is_lm

    if is_lm(ir):
        programs = compile_lm(ir, fallback="cpu")
        return {"prefill": programs.prefill, "decode": programs.decode}
    shapes = None
    if spec is not None and not spec.kwargs and any(not t.is_static for t in ir.graph_inputs):
        # a dynamic model (a symbolic batch) is costed at its example's shapes, as one would deploy it
        shapes = {t.name: list(a.shape) for t, a in zip(ir.graph_inputs, spec.args)}
    return {"": npu_compiler.compile(ir, fallback="cpu", input_shapes=shapes)}


def blank_row(point: Point) -> Row:
    """The row of ``point`` with its parameters and nothing measured yet."""
    row: Row = dict.fromkeys(COLUMNS)
    row.update(key=point.key, model=point.model, hw=point.hw, precision=point.precision, status="failed", reason="")
    row.update({k: format_value(v) for k, v in point.overrides})
    row.update(dict.fromkeys(TIMING_COLUMNS, 0.0))
    return row


def evaluate(point: Point, cache: ModelCache) -> Row:
    """The row of ``point`` (module docstring): ``status`` ``ok`` with every metric, or ``failed`` with the
    ``reason``. Never raises for a bad point."""
    row = blank_row(point)
    times = dict.fromkeys(TIMING_COLUMNS, 0.0)
    try:
        hw = cache.hardware(point)
        _hardware_columns(row, hw)
        _check_precision(point.precision, hw)
        programs = cache.programs(point.model, times)
        accuracy = cache.accuracy(point.model, point.precision, times)
        start = time.perf_counter()
        row.update(_cost(programs, hw, point.precision))
        times["t_cost"] += time.perf_counter() - start
        row.update(accuracy)
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - a bad point is a failed row; the sweep goes on
        row["reason"] = failure_reason(e)
    row.update(times)
    return row


def failure_reason(e: BaseException) -> str:
    """One line, bounded: a model's error messages can be long and span lines."""
    text = " ".join(str(e).split()) or type(e).__name__
    from torch_ir.errors import TorchIRError

    if not isinstance(e, TorchIRError):
        text = f"{type(e).__name__}: {text}"
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + " ..."


def _hardware_columns(row: Row, hw: Any) -> None:
    """The hardware costed, whatever the grid left to the file: array, SRAM, bandwidth, clock and area."""
    sram_kib = hw.sram_total_bytes / 1024
    row.update(array=f"{hw.rows}x{hw.cols}", sram_kib=format_value(round(sram_kib, 6)),
               dram_gbps=format_value(hw.dram_bandwidth_gbps), clock_mhz=format_value(hw.clock_mhz),
               pes=hw.pes, sram_bytes=hw.sram_total_bytes, area_proxy=area_proxy(hw))


def area_proxy(hw: Any) -> float:
    """PEs + SRAM bytes / ``SRAM_BYTES_PER_PE`` (module docstring)."""
    return hw.pes + hw.sram_total_bytes / SRAM_BYTES_PER_PE


def _check_precision(precision: str, hw: Any) -> None:
    """A precision whose contractions' width has no MAC rate on ``hw`` fails the point: the cost model would
    refuse a quantized one, and cost a float one at another width's rate, which is not that precision."""
    from npu_compiler.costmodel.model import CostModelError
    from npu_compiler.costmodel.precision import PRECISIONS

    width = PRECISIONS[precision].compute
    if hw.mac_rate(width) == 0:
        raise CostModelError(f"precision {precision} computes at {width}, but {hw.rate_origin(width)} is 0 (no "
                             f"{width} MACs); fix: leave {precision} out for this hardware, or give it a {width} "
                             "rate")


def _cost(programs: dict[str, Any], hw: Any, precision: str) -> Row:
    from npu_compiler.costmodel import cost_lm, cost_program

    out: Row = {}
    if "decode" in programs:
        lm = cost_lm(programs["prefill"], programs["decode"], hw, precision=precision)
        report = lm.decode
        out["prefill_ms"] = lm.prefill.latency_ms
    else:
        report = cost_program(programs[""], hw, precision=precision)
    out.update(latency_ms=report.latency_ms, cycles=report.total_cycles, dram_bytes=report.dram_bytes,
               utilization=report.utilization, peak_sram_bytes=report.peak_sram_bytes)
    return out


# -- what a worker runs ----------------------------------------------------------------------------------------------

_WORKER_CACHE: ModelCache | None = None


def worker_cache(fresh: bool = False) -> ModelCache:
    """This process's cache (a new one with ``fresh``: a sweep run in-process starts from nothing)."""
    global _WORKER_CACHE
    if _WORKER_CACHE is None or fresh:
        _WORKER_CACHE = ModelCache()
    return _WORKER_CACHE


def evaluate_group(points: list[Point]) -> list[Row]:
    """The rows of a group of points (one model's) with this process's cache: what an executor runs per task."""
    cache = worker_cache()
    return [evaluate(p, cache) for p in points]


__all__ = ["COLUMNS", "HARDWARE_COLUMNS", "METRIC_COLUMNS", "NONDETERMINISTIC_COLUMNS", "PHASES",
           "SRAM_BYTES_PER_PE", "TIMING_COLUMNS", "ModelCache", "Row", "area_proxy", "blank_row", "evaluate",
           "evaluate_group", "failure_reason", "worker_cache"]
