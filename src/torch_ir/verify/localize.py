"""Find the first IR node whose value departs from PyTorch's.

The IR runs with ``run_traced`` and each node's outputs are compared, as they are produced, with
the value of the same name in the re-exported reference graph (``reference.py``). Nodes run in
topological order, so the first node outside tolerance is where the error enters: its inputs
still agree, its outputs do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from ..executor import IRExecutor
from ..ir import NPU_IR, OpNode
from ..weights import WeightsSource
from .compare import TensorDiff, compare_tensors
from .reference import EXPORT_MODES, export_reference, module_of, run_reference, unaligned

_SHOWN = 5  # unaligned names listed in a note


@dataclass
class Localization:
    """Where the IR first departs from the model, or why that could not be told (``note``)."""

    node: str | None = None  # the first diverging node's name
    op_type: str | None = None
    node_text: str | None = None  # the node as the IR prints it
    module: str | None = None  # the torch module it was traced in
    inputs: list[TensorDiff] = field(default_factory=list)
    outputs: list[TensorDiff] = field(default_factory=list)
    sources: list[TensorDiff] = field(default_factory=list)  # weights or inputs that already differ
    diverging: int = 0  # IR nodes outside tolerance, the first one included
    compared: int = 0
    note: str | None = None


def localize(ir: NPU_IR, weights: WeightsSource, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any],
             ir_inputs: Sequence[torch.Tensor], rtol: float | None, atol: float | None) -> Localization:
    """Compare every IR node's outputs with the re-exported model's and name the first that differs."""
    ep, why = _aligned_export(ir, model, args, kwargs)
    if ep is None:
        return Localization(note=why)
    tracker = _Tracker(run_reference(ep, model, args, kwargs), rtol, atol)
    executor = IRExecutor(ir, weights)
    tracker.compare_sources({**executor.state, **{t.name: v for t, v in zip(ir.graph_inputs, ir_inputs)}})
    executor.run_traced(list(ir_inputs), tracker)
    return tracker.result(ir, ep)


def _aligned_export(ir: NPU_IR, model: torch.nn.Module, args: tuple,
                    kwargs: Mapping[str, Any]) -> tuple[ExportedProgram | None, str]:
    """The first re-export whose names are the IR's, or None and why none is; never a near match."""
    failures = []
    for mode in EXPORT_MODES:
        try:
            ep = export_reference(ir, model, args, kwargs, mode)
        except Exception as e:  # noqa: BLE001 - localization is a diagnosis; the verdict stands without it
            failures.append(f"the {mode} export failed ({type(e).__name__}: {_first_line(e)})")
            continue
        problems = unaligned(ir, ep)
        if not problems:
            return ep, ""
        shown = "; ".join(problems[:_SHOWN]) + (f"; and {len(problems) - _SHOWN} more" if problems[_SHOWN:] else "")
        failures.append(f"the {mode} export's names do not line up with the IR's ({shown})")
    return None, (
        "cannot localize: " + "; ".join(failures) + ". Was the IR rewritten after extraction, "
        "or extracted with other inputs or dynamic shapes?"
    )


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


class _Tracker:
    """The ``run_traced`` callback: compares each node's outputs, remembers the first that differs."""

    def __init__(self, expected: dict[str, torch.Tensor], rtol: float | None, atol: float | None):
        self.expected, self.rtol, self.atol = expected, rtol, atol
        self.diffs: dict[str, TensorDiff] = {}  # by tensor name; errors only, the tensors are dropped
        self.sources: list[TensorDiff] = []  # weights and inputs that differ before any node runs
        self.first: OpNode | None = None
        self.diverging = 0

    def _compare(self, name: str, actual: torch.Tensor) -> TensorDiff:
        # pop: once compared, a reference value is not needed again, and a big model's add up
        diff = compare_tensors(name, actual, self.expected.pop(name), self.rtol, self.atol)
        self.diffs[name] = diff
        return diff

    def compare_sources(self, values: Mapping[str, torch.Tensor]) -> None:
        diffs = [self._compare(name, value) for name, value in values.items()]
        self.sources = [d for d in diffs if not d.ok]

    def __call__(self, node: OpNode, outputs: list[torch.Tensor]) -> None:
        diffs = [self._compare(meta.name, value) for meta, value in zip(node.outputs, outputs)]
        if not all(d.ok for d in diffs):
            self.diverging += 1
            self.first = self.first or node

    def result(self, ir: NPU_IR, ep: ExportedProgram) -> Localization:
        if self.first is None:
            return Localization(sources=self.sources, compared=len(ir.nodes), note=(
                "every IR node matches the re-exported graph within tolerance, so the difference lies between "
                "torch.export's graph and eager execution (data-dependent branches, state outside the graph)"
            ))
        node = self.first
        inputs = list({t.name: self.diffs[t.name] for t in node.inputs}.values())  # each input once
        return Localization(
            node=node.name, op_type=node.op_type, node_text=str(node), module=module_of(ep, node.name),
            inputs=inputs, outputs=[self.diffs[t.name] for t in node.outputs], sources=self.sources,
            diverging=self.diverging, compared=len(ir.nodes),
        )

