"""Per-node values shown on the graphs of every stage: an ``Overlay`` and the one mapping through provenance.

A measurement is known on one stage's nodes: cycles, DRAM bytes and the profile's time per dispatch of the
compiled program; the verifier's error per extracted node; a placement per fused node. ``carry`` shows it on
every stage: a node of any stage takes the values of the nodes of the measured stage that share an extracted
source with it (``GraphNode.sources``), reduced (``sum`` for times and bytes, each contributing node counted once;
``max`` for errors; ``min`` for a signal-to-noise ratio, where the worst is the smallest; ``join`` for text such
as a placement reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .stages import StageGraph

Value = float | str

#: How the values of several contributing nodes become one.
REDUCTIONS = ("sum", "max", "min", "join")


@dataclass
class Overlay:
    """One measurement on the nodes of every stage: ``values[stage][node id]``."""

    name: str  # "cycles", "DRAM bytes", "time (us)", "error", "placement", ...
    unit: str = ""
    values: dict[str, dict[str, Value]] = field(default_factory=dict)
    source_stage: str = ""  # where it was measured
    reduce: str = "sum"  # how a viewer combines the values of a folded module (``REDUCTIONS``)

    def on(self, stage: str) -> dict[str, Value]:
        return self.values.get(stage, {})


def carry(name: str, measured: Mapping[str, Value], stage: str, graphs: Sequence[StageGraph], *, unit: str = "",
          reduce: str = "sum") -> Overlay:
    """``measured`` (node id of ``stage`` -> value) shown on every stage of ``graphs`` through provenance."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"overlay {name!r}: reduce must be one of {REDUCTIONS}, got {reduce!r}")
    by_stage = {g.stage: g for g in graphs}
    if stage not in by_stage:
        raise ValueError(f"overlay {name!r}: no stage {stage!r} among {list(by_stage)}")
    holders: dict[str, set[str]] = {}  # extracted source -> the measured nodes computing it
    for node in by_stage[stage].nodes:
        if node.id in measured:
            for source in node.sources:
                holders.setdefault(source, set()).add(node.id)
    overlay = Overlay(name, unit, {}, stage, reduce)
    for graph in graphs:
        values = {}
        for node in graph.nodes:
            contributing = measured.keys() & {node.id} if graph.stage == stage else \
                set().union(*(holders.get(s, set()) for s in node.sources))
            if contributing:
                values[node.id] = _reduce([measured[c] for c in sorted(contributing)], reduce)
        overlay.values[graph.stage] = values
    return overlay


def _reduce(values: list[Value], how: str) -> Value:
    if how == "join" or any(isinstance(v, str) for v in values):
        return "; ".join(dict.fromkeys(str(v) for v in values))
    numbers = [float(v) for v in values]
    return sum(numbers) if how == "sum" else min(numbers) if how == "min" else max(numbers)


__all__ = ["REDUCTIONS", "Overlay", "Value", "carry"]
