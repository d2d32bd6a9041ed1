"""Drift or fault: is a stage's error a tolerance problem spread over the graph, or one broken node?

Along the graph, each node's *relative error* is ``max|actual - expected| / max|expected|`` over its outputs
(a scale-relative error: an element-wise one explodes where the expected value crosses zero). A **fault** is
a jump: a node whose outputs are beyond tolerance while its inputs were not, and whose error is more than
``JUMP`` (10) times its inputs' error. **Drift** is error that grows smoothly over many nodes (lower precision,
a reassociated reduction, bfloat16 accumulation) and crosses the tolerance with no such jump: the fix is a
tolerance or a precision, not a bug hunt. The per-layer error (nodes grouped by the model's module path,
``model.layers.3``) is drawn as a plot.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from torch_ir.fileio import atomic_write
from torch_ir.report.cells import one_line
from torch_ir.verify.compare import compare_tensors

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


def judge(series: Sequence[NodeError], *, dtype: torch.dtype = torch.float32, jump: float = JUMP) -> Verdict:
    """The verdict on an error series (see the module docstring), with the numbers that decided it."""
    layers = per_layer(series)
    beyond = next((e for e in series if not e.ok), None)
    floor = floor_of(dtype)
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


#: The plot's width in inches grows with the layers up to this: a file with 10^5 module paths must not ask
#: matplotlib for an image wider than it can make (2^16 pixels) or than memory holds.
MAX_PLOT_INCHES = 60.0
MAX_TICK_LABELS = 200


def plot(verdict: Verdict, path: str | Path, *, title: str = "", tolerance: float | None = None) -> Path:
    """The per-layer error as a PNG (matplotlib) or, without matplotlib, an SVG written by hand (the suffix of
    ``path`` is changed to match). Returns the path written.

    Written atomically (``torch_ir.fileio.atomic_write``: a link at the path is replaced, never written through).
    Layer and node names come from a file: matplotlib shows them as plain text (no ``$...$`` math, which a
    hostile name could make fail), each on one line."""
    path = Path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        svg = path.with_suffix(".svg")
        atomic_write(svg, _svg(verdict, title, tolerance), what="bisect error plot")
        return svg
    names = [one_line(name) for name, _ in verdict.layers]
    errors = [max(err, 1e-12) if math.isfinite(err) else 1e3 for _, err in verdict.layers]
    fig, ax = plt.subplots(figsize=(min(MAX_PLOT_INCHES, max(6.0, 0.25 * len(names) + 3)), 3.6))
    try:
        ax.semilogy(range(len(names)), errors, marker="o", markersize=3, label="max relative error")
        if tolerance:
            ax.axhline(tolerance, color="grey", linestyle="--", linewidth=1, label="tolerance (rtol)")
        if verdict.jump is not None:
            layer = one_line(layer_of(verdict.jump.module))
            if layer in names:
                i = names.index(layer)
                ax.plot([i], [errors[i]], "rx", markersize=10, label=f"jump: {one_line(verdict.jump.node)}")
        step = max(1, -(-len(names) // MAX_TICK_LABELS))  # every step-th layer named: the labels stay legible
        ax.set_xticks(range(0, len(names), step))
        ax.set_xticklabels(names[::step], rotation=90, fontsize=6, parse_math=False)
        ax.set_ylabel("relative error")
        ax.set_title(one_line(title) or f"per-layer error ({verdict.kind})", fontsize=9, parse_math=False)
        for text in ax.legend(fontsize=7).get_texts():
            text.set_parse_math(False)
        fig.tight_layout()
        png = path.with_suffix(".png")
        atomic_write(png, lambda handle: fig.savefig(handle, format="png", dpi=110), what="bisect error plot")
    finally:
        plt.close(fig)
    return png


def _svg(verdict: Verdict, title: str, tolerance: float | None) -> str:
    """A log-scale line plot of the per-layer error, plain SVG (no dependency)."""
    width, height, pad = 720, 300, 50
    errors = [max(err, 1e-12) if math.isfinite(err) else 1e3 for _, err in verdict.layers] or [1e-12]
    logs = [math.log10(e) for e in errors] + ([math.log10(tolerance)] if tolerance else [])
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    hi = hi if hi > lo else lo + 1

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(1, len(errors) - 1))

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (math.log10(v) - lo) / (hi - lo)

    points = " ".join(f"{x(i):.1f},{y(e):.1f}" for i, e in enumerate(errors))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="10">',
             f'<text x="{pad}" y="20">{_esc(title or "per-layer error")} ({verdict.kind})</text>',
             f'<polyline fill="none" stroke="steelblue" points="{points}"/>']
    for k in range(lo, hi + 1):
        parts.append(f'<text x="4" y="{y(10.0 ** k) + 3:.1f}">1e{k}</text>')
    if tolerance:
        parts.append(f'<line x1="{pad}" x2="{width - pad}" y1="{y(tolerance):.1f}" y2="{y(tolerance):.1f}" '
                     'stroke="grey" stroke-dasharray="4"/>')
    for i, (name, _) in enumerate(verdict.layers):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(errors[i]):.1f}" r="2.5" fill="steelblue">'
                     f'<title>{_esc(name)}: {errors[i]:.3g}</title></circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def _esc(text: str) -> str:
    return html.escape(one_line(text))


def _in(module: str | None) -> str:
    return f", in {module}" if module else ""


def _num(v: float) -> str:
    return f"{v:.3g}"


def _ratio(e: NodeError, floor: float) -> str:
    r = e.error / max(e.input_error, floor)
    return f"{r:.3g}" if math.isfinite(r) else "inf"


def _finite(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


__all__ = ["JUMP", "NodeError", "Step", "Verdict", "error_series", "judge", "layer_of", "per_layer", "plot",
           "relative_error"]
