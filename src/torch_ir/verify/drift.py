"""Drift or fault: is a stage's error a tolerance problem spread over the graph, or one broken node?

Along the graph, each node's *relative error* is ``max|actual - expected| / max|expected|`` over its outputs
(a scale-relative error: an element-wise one explodes where the expected value crosses zero). A **fault** is
a jump: a node whose outputs are beyond tolerance while its inputs were not, and whose error is more than
``JUMP`` (10) times its inputs' error. **Drift** is error that grows smoothly over many nodes (lower precision,
a reassociated reduction, bfloat16 accumulation) and crosses the tolerance with no such jump: the fix is a
tolerance or a precision, not a bug hunt.

The rule is one fact used in two places: ``npu_tools.debug`` (bisect: a stage against the stage before it) and
``npu_compiler.quantize.report`` (a quantized model against its float one, where ``floor`` is the quantization noise
a layer is expected to add, not the float type's rounding). The plot of the per-layer error is ``npu_tools``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .compare import compare_tensors

#: A node's error must exceed this many times its inputs' error to count as a jump (a fault).
JUMP = 10.0


@dataclass
class Step:
    """One node or dispatch of the series: what it reads and writes, by tensor name."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    module: str | None = None


@dataclass
class NodeError:
    """One node's error against the reference: its outputs' and its inputs' relative errors."""

    index: int  # position of the node or dispatch in the graph or program
    node: str
    op: str
    module: str | None
    error: float  # max relative error of its outputs
    input_error: float  # max relative error of its (compared) inputs
    ok: bool  # every output within tolerance (compare_tensors)
    tensor: str  # the output with the largest error

    def to_dict(self) -> dict[str, Any]:
        return {k: (_finite(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Verdict:
    """``kind``: "fault" (a jump at ``jump``), "drift" (no jump, tolerance crossed at ``first_beyond``), "ok"
    (no node beyond tolerance) or "undetermined" (no intermediate value could be compared)."""

    kind: str
    text: str
    jump: NodeError | None = None
    first_beyond: NodeError | None = None
    series: list[NodeError] = field(default_factory=list)
    layers: list[tuple[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text,
                "jump": self.jump.to_dict() if self.jump else None,
                "first_beyond": self.first_beyond.to_dict() if self.first_beyond else None,
                "layers": [[name, _finite(err)] for name, err in self.layers],
                "series": [e.to_dict() for e in self.series]}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|``; NaNs in the same places agree; a shape mismatch is inf."""
    if actual.shape != expected.shape:
        return math.inf
    if not (expected.is_floating_point() or expected.is_complex()):
        return 0.0 if torch.equal(actual.to(expected.dtype), expected) else math.inf
    a, e = actual.detach().double(), expected.detach().double()
    same = (a == e) | (a.isnan() & e.isnan())
    diff = torch.where(same, 0.0, (a - e).abs().nan_to_num(nan=math.inf, posinf=math.inf))
    if diff.numel() == 0:
        return 0.0
    scale = float(e.abs().nan_to_num(nan=0.0, posinf=0.0).max()) if e.numel() else 0.0
    worst = float(diff.max())
    return worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)


def floor_of(dtype: torch.dtype) -> float:
    """The smallest error worth comparing against: one ulp at 1.0 of the dtype (an input off by nothing still
    carries rounding)."""
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-7


def error_series(steps: Sequence[Step], actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                 *, rtol: float | None = None, atol: float | None = None) -> list[NodeError]:
    """Each step's error, in order, over the outputs that both sides computed under the same name (a step with
    none is left out). Inputs no step computed (graph inputs, weights) count as exact."""
    known: dict[str, float] = {}
    series: list[NodeError] = []
    for position, step in enumerate(steps):
        errors, ok, worst_name = [], True, ""
        for name in step.outputs:
            if name not in actual or name not in expected:
                continue
            a, e = actual[name], expected[name]
            err = relative_error(a, e)
            known[name] = err
            if not compare_tensors(name, a.to(e.dtype) if a.shape == e.shape else a, e, rtol, atol).ok:
                ok = False
            if not errors or err > max(errors):
                worst_name = name
            errors.append(err)
        if not errors:
            continue
        in_err = max((known.get(n, 0.0) for n in step.inputs), default=0.0)
        series.append(NodeError(position, step.name, step.op, step.module, max(errors), in_err, ok, worst_name))
    return series


def judge(series: Sequence[NodeError], *, dtype: torch.dtype = torch.float32, jump: float = JUMP,
          floor: float | None = None) -> Verdict:
    """The verdict on an error series (see the module docstring), with the numbers that decided it. ``floor``: the
    smallest input error a jump is measured against (None: ``floor_of(dtype)``, one rounding of the type)."""
    layers = per_layer(series)
    beyond = next((e for e in series if not e.ok), None)
    floor = floor_of(dtype) if floor is None else floor
    for e in series:
        if not e.ok and e.error > jump * max(e.input_error, floor):
            text = (f"fault: a jump at {e.node} ({e.op}{_in(e.module)}): its output {e.tensor!r} is off by "
                    f"{_num(e.error)} (relative) while its inputs were off by {_num(e.input_error)} "
                    f"({_ratio(e, floor)} times more), beyond tolerance")
            return Verdict("fault", text, e, beyond, list(series), layers)
    if beyond is None:
        if not series:
            return Verdict("undetermined", "no intermediate value of this stage could be compared with the "
                           "reference (no tensor names in common)", None, None, [], [])
        return Verdict("ok", f"all {len(series)} compared nodes are within tolerance", None, None, list(series), layers)
    before = [e for e in series if e.index <= beyond.index and e.error > floor]
    worst = max((e.error for e in before), default=0.0)
    text = (f"drift: no node jumps (none is more than {jump:g} times its inputs' error); errors up to "
            f"{_num(worst)} are spread over {len(before)} nodes and first cross the tolerance at {beyond.node} "
            f"({beyond.op}{_in(beyond.module)}), whose inputs were already off by {_num(beyond.input_error)}. A "
            "tolerance or precision problem, not one broken node: loosen --rtol/--atol or compute in higher "
            "precision")
    return Verdict("drift", text, None, beyond, list(series), layers)


def layer_of(module: str | None) -> str:
    """The layer a module path belongs to: the path up to its first numeric part (``model.layers.3.mlp`` ->
    ``model.layers.3``), else the path itself; no module is ``(top)``."""
    if not module:
        return "(top)"
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return module


def per_layer(series: Sequence[NodeError]) -> list[tuple[str, float]]:
    """The largest node error of each layer, layers in the order the graph first reaches them."""
    layers: dict[str, float] = {}
    for e in series:
        key = layer_of(e.module)
        layers[key] = max(layers.get(key, 0.0), e.error)
    return list(layers.items())


def _in(module: str | None) -> str:
    return f", in {module}" if module else ""


def _num(v: float) -> str:
    return f"{v:.3g}"


def _ratio(e: NodeError, floor: float) -> str:
    r = e.error / max(e.input_error, floor)
    return f"{r:.3g}" if math.isfinite(r) else "inf"


def _finite(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


__all__ = ["JUMP", "NodeError", "Step", "Verdict", "error_series", "floor_of", "judge", "layer_of", "per_layer",
           "relative_error"]
