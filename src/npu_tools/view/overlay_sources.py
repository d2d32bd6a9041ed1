"""The overlays people ask for, each made from the result of the tool that measures it and carried to every stage
through provenance (``overlays.carry``). Plain data out (``Overlay``): the Model Explorer writer
(``npu_tools.view.explorer``) and the HTML report read the same ones.

=================== ================================ ==============================================================
overlay             measured on                      from
=================== ================================ ==============================================================
cycles, DRAM bytes  the compiled program's dispatches ``npu_compiler.costmodel.cost_program`` (``cost_overlays``)
bound               (same)                           (same): compute, memory, ... per dispatch
time (us)           (same)                           a ``npu_runtime.profile.Profile`` (``profile_overlay``)
placement           (same)                           ``Dispatch.host``: the reason a dispatch runs on the host CPU
error               the extracted IR's nodes          the verifier's per-node error (``drift.error_series``)
first divergent     wherever bisect names it         a ``BisectReport`` or its ``report.json``
SQNR (dB)           the quantized IR's nodes          ``npu_compiler.quantize.report.AccuracyReport``
=================== ================================ ==============================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npu_program.program import CompiledProgram
from torch_ir.errors import TorchIRError

from .overlays import Overlay, Value, carry
from .stages import StageGraph, ir_graph

#: What a dispatch that runs on the NPU shows in the placement overlay.
NPU = "NPU"


class OverlayError(TorchIRError, ValueError):
    """An overlay's source does not fit the graphs (a report of another model, a broken report file)."""


def cost_overlays(report: Any, graphs: Sequence[StageGraph]) -> list[Overlay]:
    """Cycles, DRAM bytes and the bound of each dispatch of a ``CostReport`` (``cost_program(program, hw)``), on
    every stage. Host dispatches and those run once at bind time (``report.bind``) are not in a run's cost, so they
    have no value: the compiled stage's cycles add up to the report's ``total_cycles``."""
    rows = report.rows
    return [carry("cycles", {f"d{r.index}": r.cycles for r in rows}, "compiled", graphs, unit="cycles"),
            carry("DRAM bytes", {f"d{r.index}": r.dram_bytes for r in rows}, "compiled", graphs, unit="bytes"),
            carry("bound", {f"d{r.index}": r.bound for r in rows}, "compiled", graphs, reduce="join")]


def profile_overlay(profile: Any, graphs: Sequence[StageGraph]) -> Overlay:
    """The measured time of each dispatch (``Profile.dispatches[i].us``, the mean of the middle half of the timed
    runs), in microseconds, on every stage: a fused node shows the time of the dispatches computing it."""
    return carry("time (us)", {f"d{t.index}": t.us for t in profile.dispatches}, "compiled", graphs, unit="us")


def placement_overlay(program: CompiledProgram, graphs: Sequence[StageGraph], *, target: str = NPU) -> Overlay:
    """Where each dispatch runs: ``target`` or ``CPU: <reason>`` for a host dispatch (``compile(fallback="cpu")``
    places a node with no kernel on the host and says why); a node of an earlier stage computed by both shows
    both."""
    measured: dict[str, Value] = {f"d{i}": f"CPU: {d.host}" if d.host else target
                                  for i, d in enumerate(program.dispatches)}
    return carry("placement", measured, "compiled", graphs, reduce="join")


def error_overlay(series: Sequence[Any], graphs: Sequence[StageGraph], *, stage: str = "extracted") -> Overlay:
    """The verifier's per-node error: a ``torch_ir.verify.drift.NodeError`` series over ``stage``'s nodes (its
    ``node`` is a node name of that stage), the largest where several nodes meet."""
    ids = _ids(graphs, stage)
    measured = {e.node: e.error for e in series if e.node in ids and math.isfinite(e.error)}
    return carry("error", measured, stage, graphs, unit="max rel error", reduce="max")


def verifier_errors(subject: Any) -> list[Any]:
    """The per-node error series of a subject's extracted IR against its trusted source (``load_subject``: a zoo
    model's eager values, onnxruntime's, ...), computed by the machinery ``bisect`` uses for a frontend fault."""
    from npu_tools.debug.bisect import ir_steps
    from npu_tools.debug.stages import Pipeline
    from torch_ir.verify.drift import error_series

    if subject.trusted_values is None:
        raise OverlayError(f"{subject.trusted} gives no intermediate values to compare the IR's nodes with; the error "
                           "overlay needs a source that does (a PyTorch model, an ONNX file)")
    return error_series(ir_steps(subject.ir), Pipeline(subject).ir_values(subject.ir), subject.trusted_values())


def bisect_overlay(report: Any, graphs: Sequence[StageGraph]) -> Overlay:
    """Bisect's first divergent node, from a ``BisectReport``, its ``to_dict()`` or its ``report.json`` path,
    marked on every stage: the dispatch when bisect names one, else the node's extracted sources. No finding: an
    overlay with no value."""
    finding = _finding(report)
    label = f"first divergent ({finding.get('kind')}, {finding.get('stage')})" if finding else ""
    for stage, names in _located(finding, graphs):
        return carry("first divergent", {n: label for n in names}, stage, graphs, reduce="join")
    return carry("first divergent", {}, "extracted" if _has(graphs, "extracted") else graphs[0].stage, graphs)


def sqnr_overlay(report: Any, quantized_ir: Any, graphs: Sequence[StageGraph]) -> Overlay:
    """Per-layer SQNR (dB) of a quantization ``AccuracyReport`` (``compare_quantized``): its layers are nodes of
    ``quantized_ir``, whose provenance leads to the extracted nodes they compute, so every stage shows the worst
    (smallest) SQNR of what it computes. An exact layer (infinite SQNR) shows nothing."""
    quantized = ir_graph(quantized_ir, "quantized")
    measured = {la.node: la.sqnr_db for la in report.layers if math.isfinite(la.sqnr_db)}
    return carry("SQNR (dB)", measured, "quantized", [*graphs, quantized], unit="dB", reduce="min")


def pipeline_overlays(graphs: Sequence[StageGraph], program: CompiledProgram | None, cost: Any = None, *,
                      subject: Any = None, verify: bool = False, profile: bool = False,
                      bisect_report: Any = None) -> list[Overlay]:
    """The overlays of a run, as ``torch-ir view`` and ``torch-ir report`` draw them: the cost report's cycles, DRAM
    bytes and bound and the placement whenever there is a program; with ``verify`` the verifier's error per node and
    with ``profile`` the measured time per dispatch (both run ``subject``, an ``npu_tools.debug`` ``Subject``); with
    ``bisect_report`` bisect's first divergent node."""
    overlays = cost_overlays(cost, graphs) if cost is not None else []
    if program is not None:
        overlays.append(placement_overlay(program, graphs))
    if verify:
        overlays.append(error_overlay(verifier_errors(subject), graphs))
    if profile and program is not None:
        overlays.append(profile_overlay(profile_of(program, subject), graphs))
    if bisect_report:
        overlays.append(bisect_overlay(bisect_report, graphs))
    return overlays


def profile_of(program: CompiledProgram, subject: Any) -> Any:
    """The measured time per dispatch of ``program``, run on the CPU on ``subject``'s inputs and weights."""
    from npu_runtime import Device, Executor, load_weights

    device = Device()
    inputs = {spec.name: value.numpy() for spec, value in zip(program.input_specs, subject.inputs)}
    return Executor(program, device).profile(inputs, load_weights(dict(subject.weights), program, device), runs=5)


def _ids(graphs: Sequence[StageGraph], stage: str) -> set[str]:
    for g in graphs:
        if g.stage == stage:
            return {n.id for n in g.nodes}
    raise OverlayError(f"no stage {stage!r} among the graphs ({', '.join(g.stage for g in graphs)})")


def _has(graphs: Sequence[StageGraph], stage: str) -> bool:
    return any(g.stage == stage for g in graphs)


def _finding(report: Any) -> dict[str, Any] | None:
    if isinstance(report, (str, Path)):
        try:
            report = json.loads(Path(report).read_text())
        except (OSError, ValueError) as e:
            raise OverlayError(f"cannot read bisect report {str(report)!r}: {e}; give the report.json that "
                               "`torch-ir bisect -o DIR` writes") from e
    if not isinstance(report, Mapping):
        report = report.to_dict()
    finding = report.get("finding")
    if finding is not None and not isinstance(finding, Mapping):
        raise OverlayError("bisect report: 'finding' must be an object (the report.json of `torch-ir bisect`)")
    return dict(finding) if finding else None


def _located(finding: dict[str, Any] | None, graphs: Sequence[StageGraph]) -> list[tuple[str, list[str]]]:
    """Where a finding can be marked, most precise first: (stage, node ids of that stage)."""
    if not finding:
        return []
    places: list[tuple[str, list[str]]] = []
    if isinstance(finding.get("dispatch"), int) and _has(graphs, "compiled"):
        places.append(("compiled", [f"d{finding['dispatch']}"]))
    provenance = finding.get("provenance") or {}
    for stage in ("extracted", "normalized", "fused"):
        if not _has(graphs, stage):
            continue
        ids = _ids(graphs, stage)
        if stage == "extracted":
            sources = [n for n in (provenance.get("nodes") or []) if n in ids]
            if sources:
                places.append((stage, sources))
        if finding.get("node") in ids:
            places.append((stage, [finding["node"]]))
    if _has(graphs, "extracted"):
        ids = _ids(graphs, "extracted")
        group = [n for n in finding.get("group") or [] if n in ids]
        if group:
            places.append(("extracted", group))
    return places


__all__ = ["NPU", "OverlayError", "bisect_overlay", "cost_overlays", "error_overlay", "pipeline_overlays",
           "placement_overlay", "profile_of", "profile_overlay", "sqnr_overlay", "verifier_errors"]
