"""Drift or fault, drawn: the per-layer error of a bisect verdict as a plot.

The rule (a fault is a jump, drift is error grown smoothly) and its data live in ``torch_ir.verify.drift``, so the
quantization report (``npu_compiler.quantize.report``) judges its layers by the same test; they are re-exported
here under their old names.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from torch_ir.fileio import atomic_write
from torch_ir.report.cells import one_line
from torch_ir.verify.drift import (
    JUMP,
    NodeError,
    Step,
    Verdict,
    error_series,
    floor_of,
    judge,
    layer_of,
    per_layer,
    relative_error,
)

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


__all__ = ["JUMP", "NodeError", "Step", "Verdict", "error_series", "floor_of", "judge", "layer_of", "per_layer",
           "plot", "relative_error"]
