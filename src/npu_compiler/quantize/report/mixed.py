"""A mixed-precision proposal: start from a base assignment (w4a8, say) and keep the layers that lose most wider,
one at a time, until an accuracy target is met; every assignment tried is recorded with its accuracy and its cost
on a named NPU (``npu_compiler.costmodel``), and the Pareto front of accuracy against latency is marked.

The quantizer is a parameter, ``quantize_fn(ir, weights, config, calibration) -> (q_ir, q_weights)``
(``npu_compiler.quantize.quantize`` fits it), and so is how a config gets per-layer overrides (``with_overrides``:
by default a dict's or a dataclass's ``overrides`` field, ``{fnmatch pattern: precision}``). A layer is widened
along ``ladder`` (the override values it takes in turn, None: left float).

Sensitivity, the order layers are widened in: with ``rank="probe"`` (the default) each quantized layer alone is
widened to the ladder's first step and the output's accuracy measured (one "probe" assignment per layer, recorded
too), the layers that gain most first; with ``rank="noise"`` (no probes: cheaper on a large model) the layers that add
most noise in the base assignment (``LayerAccuracy.noise_added``) first, which misses how a layer's noise grows or
fades on its way to the output. Then the layers are widened in that order, cumulatively, one evaluation each, to the
ladder's first step, then (still short of the target) its next, until the target is met.

Cost: ``cost_fn(q_ir, q_weights) -> Cost``; by default, with ``hardware`` (a preset name or a hardware file), the
quantized IR compiled (``npu_compiler.compile``, normalized; nodes the target has no kernel for run on the host and
are counted, not costed) and costed by ``cost_program``: cycles, DRAM bytes, latency.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_ir.ir import NPU_IR

from .compare import AccuracyReport, ReportError, compare_quantized

QuantizeFn = Callable[[NPU_IR, Any, Any, Any], tuple[NPU_IR, Any]]


@dataclass(frozen=True)
class Cost:
    """One assignment's cost on the hardware: NPU cycles, DRAM bytes, latency, and the dispatches left on the host
    (not costed: a quantized op without an NPU kernel)."""

    cycles: int
    dram_bytes: int
    latency_ms: float
    host_dispatches: int = 0


CostFn = Callable[[NPU_IR, Any], Cost]


@dataclass(frozen=True)
class Target:
    """The accuracy to reach: the output's SQNR at least ``min_sqnr_db``, and/or (an LLM) the mean next-token KL
    divergence at most ``max_kld``."""

    min_sqnr_db: float | None = None
    max_kld: float | None = None

    def __post_init__(self) -> None:
        if self.min_sqnr_db is None and self.max_kld is None:
            raise ReportError("a mixed-precision target needs min_sqnr_db (dB at the output) or max_kld (an LLM's "
                              "mean next-token KL divergence)")

    def met(self, report: AccuracyReport) -> bool:
        if self.min_sqnr_db is not None and not report.output_sqnr_db >= self.min_sqnr_db:
            return False
        if self.max_kld is not None:
            if report.tokens is None:
                raise ReportError("max_kld needs an LLM (an IR whose output is next-token logits); give logits= "
                                  "the output's name, or use min_sqnr_db")
            return report.tokens.mean_kld <= self.max_kld
        return True


@dataclass
class Assignment:
    """One assignment tried: the layers kept wider than the base (node -> precision), its accuracy and cost."""

    step: int
    kind: str  # "base", "probe" (one layer alone widened, to rank them) or "greedy" (widened cumulatively)
    widened: str | None  # the layer widened at this step (None: the base assignment)
    precisions: dict[str, str]
    output_sqnr_db: float
    mean_kld: float | None
    top1_pct: float | None
    cost: Cost | None
    meets_target: bool
    pareto: bool = False

    def row(self) -> dict[str, Any]:
        c = self.cost
        return {"step": self.step, "kind": self.kind, "widened": self.widened or "(base)",
                "precisions": "; ".join(f"{k}={v}" for k, v in self.precisions.items()) or "(base)",
                "output_sqnr_db": self.output_sqnr_db, "mean_kld": self.mean_kld, "top1_pct": self.top1_pct,
                "cycles": c.cycles if c else None, "dram_bytes": c.dram_bytes if c else None,
                "latency_ms": c.latency_ms if c else None, "host_dispatches": c.host_dispatches if c else None,
                "meets_target": self.meets_target, "pareto": self.pareto}


#: The columns of ``pareto.csv`` (``Assignment.row``).
PARETO_COLUMNS = ("step", "kind", "widened", "precisions", "output_sqnr_db", "mean_kld", "top1_pct", "cycles",
                  "dram_bytes", "latency_ms", "host_dispatches", "meets_target", "pareto")


def cost_on(hardware: Any) -> CostFn:
    """The cost model's cost on ``hardware`` (a preset name, a file path or a ``Hardware``) of a quantized IR."""
    from npu_compiler.compiler import compile as compile_ir
    from npu_compiler.costmodel import Hardware, cost_program, load_hardware

    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)

    def cost(q_ir: NPU_IR, q_weights: Any) -> Cost:
        report = cost_program(compile_ir(q_ir, fallback="cpu"), hw)
        return Cost(report.total_cycles, report.dram_bytes, report.latency_ms, len(report.host))

    return cost


def with_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """``config`` with ``overrides`` added to its per-layer overrides: a dict's ``"overrides"`` key, a dataclass's
    ``overrides`` field, or an object's ``with_overrides`` method. The new patterns come first and win (a quantizer
    that takes the first matching pattern uses them). A preset name is the toolkit's ``QuantConfig`` of it."""
    from ..presets import QuantConfig, get_preset

    if isinstance(config, str):
        config = get_preset(config)
    if isinstance(config, QuantConfig):  # first match wins there: the widened layers' exact names go first
        return dataclasses.replace(config, overrides=tuple(dict(overrides).items()) + tuple(config.overrides))
    if hasattr(config, "with_overrides"):
        return config.with_overrides(dict(overrides))
    if isinstance(config, Mapping):
        return {**config, "overrides": _merged(overrides, config.get("overrides"))}
    if dataclasses.is_dataclass(config) and hasattr(config, "overrides"):
        return dataclasses.replace(config, overrides=_merged(overrides, config.overrides))
    raise ReportError(f"cannot add per-layer overrides to a config of type {type(config).__name__}; pass "
                      "with_overrides=(config, {pattern: precision}) -> config")


def _merged(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**dict(new), **{k: v for k, v in (old or {}).items() if k not in new}}


def literal_pattern(name: str) -> str:
    """An fnmatch pattern matching exactly ``name`` (its ``*``, ``?`` and ``[`` taken literally)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@dataclass
class _Search:
    float_ir: NPU_IR
    weights: Any
    base_config: Any
    calibration: Any
    eval_inputs: Sequence[Any]
    quantize_fn: QuantizeFn
    add_overrides: Callable[[Any, Mapping[str, Any]], Any]
    cost_fn: CostFn | None
    logits: str | bool | None
    tried: list[Assignment] = field(default_factory=list)
    #: Assignments already evaluated (a cumulative one can equal a probe): recorded again, not recomputed.
    seen: dict[tuple, tuple[AccuracyReport, set[str], Assignment]] = field(default_factory=dict)

    def evaluate(self, target: Target, ladder: Sequence[Any], levels: Mapping[str, int], kind: str,
                 widened: str | None) -> tuple[AccuracyReport, set[str]]:
        """Quantize with ``levels`` (layer -> steps up the ladder), compare, cost, record; the report and the
        quantized layers."""
        key = tuple(sorted(levels.items()))
        if key in self.seen:
            report, quantized, before = self.seen[key]
            self.tried.append(dataclasses.replace(before, step=len(self.tried), kind=kind, widened=widened))
            return report, quantized
        overrides = {literal_pattern(n): ladder[k - 1] for n, k in levels.items()}
        config = self.add_overrides(self.base_config, overrides) if overrides else self.base_config
        q_ir, q_weights = self.quantize_fn(self.float_ir, self.weights, config, self.calibration)
        report = compare_quantized(self.float_ir, self.weights, q_ir, q_weights, self.eval_inputs,
                                   logits=self.logits)
        tokens = report.tokens
        self.tried.append(Assignment(
            len(self.tried), kind, widened, {n: _label(ladder[k - 1]) for n, k in levels.items()},
            report.output_sqnr_db, tokens.mean_kld if tokens else None, tokens.top1_pct if tokens else None,
            self.cost_fn(q_ir, q_weights) if self.cost_fn else None, target.met(report)))
        quantized = dequantized_readers(q_ir)
        self.seen[key] = report, quantized, self.tried[-1]
        return report, quantized

    def order(self, rank: str, base: AccuracyReport, quantized: set[str], target: Target,
              ladder: Sequence[Any]) -> list[str]:
        """The quantized layers, most sensitive first (module docstring)."""
        layers = [la.node for la in base.layers if la.node in quantized]
        if rank == "noise":
            noise = {la.node: la.noise_added for la in base.layers}
            return sorted(layers, key=lambda n: -noise[n])
        if rank != "probe":
            raise ReportError(f"rank={rank!r}: use 'probe' (widen each layer alone and measure) or 'noise'")
        gain = {}
        for layer in layers:
            probe, _ = self.evaluate(target, ladder, {layer: 1}, "probe", layer)
            gain[layer] = accuracy_of(probe, target) - accuracy_of(base, target)
        return sorted(layers, key=lambda n: -gain[n])


def accuracy_of(report: AccuracyReport, target: Target) -> float:
    """The accuracy the target is about, higher better: the output SQNR, or minus the mean KLD."""
    if target.max_kld is not None and report.tokens is not None:
        return -report.tokens.mean_kld
    return report.output_sqnr_db


def _label(precision: Any) -> str:
    return "float" if precision is None else str(precision)


def dequantized_readers(q_ir: NPU_IR) -> set[str]:
    """The quantized layers: those the toolkit's quantizer records (``metadata["quantize"]["layers"]``), else the
    nodes that read a DEQUANTIZE's output (a pooling between two quantized layers is not a layer to widen)."""
    recorded = q_ir.metadata.get("quantize", {}).get("layers") if isinstance(q_ir.metadata, dict) else None
    if recorded:
        return set(recorded)
    made = {t.name for n in q_ir.nodes if n.op_type == "DEQUANTIZE" for t in n.outputs}
    return {n.name for n in q_ir.nodes if n.op_type != "DEQUANTIZE" and any(t.name in made for t in n.inputs)}


def propose_mixed_precision(float_ir: NPU_IR, weights: Any, base_config: Any, calibration: Any,
                            eval_inputs: Sequence[Any], *, target: Target, quantize_fn: QuantizeFn,
                            hardware: str | Path | Any | None = None, ladder: Sequence[Any] = ("w8a8", None),
                            cost_fn: CostFn | None = None, max_steps: int = 64,
                            overrides: Callable[[Any, Mapping[str, Any]], Any] = with_overrides,
                            rank: str = "probe", logits: str | bool | None = None) -> AccuracyReport:
    """Greedy mixed precision (module docstring). Returns the report of the first assignment that meets
    ``target`` (else of the last one tried) with every assignment tried in ``assignments`` and the Pareto front of
    accuracy against cycles in ``pareto``. ``ladder``: the override values a layer is widened through, narrowest
    first (None: float)."""
    if not ladder:
        raise ReportError("ladder is empty: give the precisions a layer may be widened to, e.g. ('w8a8', None)")
    if cost_fn is None and hardware is not None:
        cost_fn = cost_on(hardware)
    search = _Search(float_ir, weights, base_config, calibration, eval_inputs, quantize_fn, overrides, cost_fn,
                     logits)
    report, quantized = search.evaluate(target, ladder, {}, "base", None)
    order = [] if target.met(report) else search.order(rank, report, quantized, target, ladder)
    levels: dict[str, int] = {}
    for level in range(1, len(ladder) + 1):
        for layer in order:
            if target.met(report) or len(search.tried) > max_steps:
                break
            levels[layer] = level
            report, _ = search.evaluate(target, ladder, dict(levels), "greedy", layer)
    mark_pareto(search.tried, kld=target.max_kld is not None)
    report.assignments = search.tried
    report.pareto = [a for a in search.tried if a.pareto]
    report.hardware = None if hardware is None else str(getattr(hardware, "name", hardware))
    return report


def mark_pareto(tried: Sequence[Assignment], *, kld: bool = False) -> None:
    """Mark the assignments no other beats on both accuracy (output SQNR, or mean KLD with ``kld``) and cycles
    (an assignment without a cost competes on accuracy alone)."""
    def accuracy(a: Assignment) -> float:
        if kld:
            return -a.mean_kld if a.mean_kld is not None and not math.isnan(a.mean_kld) else -math.inf
        return a.output_sqnr_db

    def cycles(a: Assignment) -> float:
        return a.cost.cycles if a.cost is not None else 0.0

    for a in tried:
        a.pareto = not any(accuracy(b) >= accuracy(a) and cycles(b) <= cycles(a)
                           and (accuracy(b) > accuracy(a) or cycles(b) < cycles(a)) for b in tried)
