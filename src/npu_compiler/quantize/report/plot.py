"""The report's figure: SQNR per layer (the first jump marked) and, after a mixed-precision search, accuracy
against cycles for every assignment tried (the Pareto front joined). A PNG drawn with matplotlib (the ``cost``
extra) on the Agg canvas, no pyplot state; without matplotlib, plain SVG text. Every name is untrusted: one plain
line, escaped in SVG (``html_text``), never parsed as mathtext in matplotlib.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from npu_compiler.costmodel.costs import plain_line
from npu_compiler.costmodel.roofline import html_text

from .compare import AccuracyReport

#: Where an exact (inf dB) tensor is drawn: this far above the best finite one.
_EXACT_HEADROOM_DB = 10.0
_MAX_TICKS = 60


def sqnr_points(report: AccuracyReport) -> list[float]:
    """SQNR per layer for drawing: an exact tensor just above the rest, no signal left at 0 dB."""
    finite = [la.sqnr_db for la in report.layers if math.isfinite(la.sqnr_db)]
    top = (max(finite) if finite else 0.0) + _EXACT_HEADROOM_DB
    return [la.sqnr_db if math.isfinite(la.sqnr_db) else (top if la.sqnr_db > 0 else 0.0) for la in report.layers]


def pareto_points(report: AccuracyReport) -> tuple[str, list[tuple[float, float, bool, int]]]:
    """(accuracy label, [(cycles, accuracy, on the front, step)]) of the costed assignments."""
    kld = report.tokens is not None and all(a.mean_kld is not None for a in report.assignments)
    label = "mean KLD" if kld else "output SQNR (dB)"
    points = []
    for a in report.assignments:
        if a.cost is None:
            continue
        value = a.mean_kld if kld else a.output_sqnr_db
        if value is not None and math.isfinite(value):
            points.append((float(a.cost.cycles), float(value), a.pareto, a.step))
    return label, points


def figure_png(report: AccuracyReport, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    label, points = pareto_points(report)
    panels = 2 if points else 1
    width = min(24.0, max(7.0, 0.22 * len(report.layers) + 3))
    fig = Figure(figsize=(width, 3.8 * panels), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(panels, 1, 1)
    ys = sqnr_points(report)
    ax.plot(range(len(ys)), ys, marker="o", markersize=3, label="SQNR")
    jump = report.first_jump
    if jump is not None:
        i = report.layers.index(jump)
        ax.plot([i], [ys[i]], "rx", markersize=10, label=plain_line(f"first jump: {jump.node}"))
    step = max(1, -(-len(ys) // _MAX_TICKS))
    ax.set_xticks(range(0, len(ys), step))
    ax.set_xticklabels([plain_line(la.node) for la in report.layers][::step], rotation=90, fontsize=6,
                       parse_math=False)
    ax.set_ylabel("SQNR (dB)")
    ax.set_title(plain_line(f"{report.model_name}: SQNR per layer (exact drawn at the top)"), fontsize=9,
                 parse_math=False)
    _plain_legend(ax)
    if points:
        _pareto_axes(fig.add_subplot(2, 1, 2), label, points)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def _pareto_axes(ax: Any, label: str, points: Sequence[tuple[float, float, bool, int]]) -> None:
    ax.scatter([p[0] for p in points], [p[1] for p in points], s=16, color="#7f7f7f", label="assignment tried")
    front = sorted((p for p in points if p[2]), key=lambda p: p[0])
    ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="#d62728", markersize=5, label="Pareto front")
    for x, y, _, step in points:
        ax.annotate(str(step), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6)
    ax.set_xlabel("NPU cycles (cost model)")
    ax.set_ylabel(label)
    ax.set_title("accuracy against latency of the assignments tried", fontsize=9)
    _plain_legend(ax)


def _plain_legend(ax: Any) -> None:
    for text in ax.legend(fontsize=7).get_texts():
        text.set_parse_math(False)


def figure_svg(report: AccuracyReport) -> str:
    """The figure as plain SVG text (no dependency): the SQNR line, and the Pareto scatter when there is one."""
    width, height, pad = 720, 260, 50
    label, points = pareto_points(report)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * (2 if points else 1)}" '
             'font-size="10">']
    ys = sqnr_points(report)
    parts += _svg_series(list(range(len(ys))), ys, [f"{la.node}: {la.sqnr_db:.1f} dB" for la in report.layers],
                         (width, height, pad), f"{report.model_name}: SQNR per layer (dB)", line=True)
    if points:
        parts.append(f'<g transform="translate(0,{height})">')
        parts += _svg_series([p[0] for p in points], [p[1] for p in points],
                             [f"step {p[3]}: {p[0]:.0f} cycles, {p[1]:.4g}{' (Pareto)' if p[2] else ''}"
                              for p in points], (width, height, pad), f"{label} against NPU cycles", line=False)
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _svg_series(xs: Sequence[float], ys: Sequence[float], titles: Sequence[str], box: tuple[int, int, int],
                title: str, *, line: bool) -> list[str]:
    width, height, pad = box
    if not ys:
        return [f'<text x="{pad}" y="20">{html_text(title)}: nothing to draw</text>']
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def at(x: float, y: float) -> str:
        return (f"{pad + (width - 2 * pad) * (x - x0) / (x1 - x0):.1f},"
                f"{height - pad - (height - 2 * pad) * (y - y0) / (y1 - y0):.1f}")

    out = [f'<text x="{pad}" y="20">{html_text(title)}</text>',
           f'<text x="4" y="{height - pad}">{y0:.3g}</text><text x="4" y="{pad}">{y1:.3g}</text>']
    if line:
        out.append(f'<polyline fill="none" stroke="steelblue" points="{" ".join(at(x, y) for x, y in zip(xs, ys))}"/>')
    for x, y, t in zip(xs, ys, titles):
        cx, cy = at(x, y).split(",")
        out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="steelblue"><title>{html_text(t)}</title></circle>')
    return out
