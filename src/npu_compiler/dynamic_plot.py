"""The dynamic-shape report's figures (``DynamicReport.plot``), PNGs drawn with matplotlib (the ``cost`` extra) on
the Agg canvas, no pyplot state; names are drawn as plain text, never parsed as mathtext:

- ``lengths.png``: the observed length histogram, with the edges of the given and the suggested buckets;
- ``buckets.png``: arena bytes and latency of each candidate bucket, against the upper-bound plan's;
- ``sets.png``: each bucket set's expected latency against its padded compute.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch_ir.fileio import atomic_write, check_output_path

from .costmodel.costs import plain_line
from .errors import CompileError

if TYPE_CHECKING:
    from .dynamic_report import DynamicReport

PLOT_FILES = ("lengths.png", "buckets.png", "sets.png")
INSTALL = "pip install 'torch-ir[cost]'"
_COLOURS = {"given": "#1f77b4", "suggested": "#d62728", "upper bound": "#2ca02c"}


def write_plots(report: DynamicReport, directory: Path) -> list[Path]:
    """Draw the three figures into ``directory`` (made if missing); returns their paths."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401 - the check itself
    except ImportError:
        raise CompileError(f"the dynamic-shape plots need matplotlib; fix: {INSTALL}") from None
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in zip(PLOT_FILES, (_lengths, _buckets, _sets)):
        path = directory / name
        check_output_path(path, "dynamic-shape plot")
        atomic_write(path, _png(draw, report), what="dynamic-shape plot")
        paths.append(path)
    return paths


def _png(draw: Any, report: DynamicReport) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    draw(fig, report)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _title(ax: Any, text: str) -> None:
    ax.set_title(plain_line(text), fontsize=9, parse_math=False)


def _legend(ax: Any) -> None:
    for text in ax.legend(fontsize=7).get_texts():
        text.set_parse_math(False)


def _lengths(fig: Any, report: DynamicReport) -> None:
    ax = fig.add_subplot(1, 1, 1)
    lengths, counts = list(report.histogram), list(report.histogram.values())
    if len(lengths) <= 64:
        ax.bar(lengths, counts, width=max(1.0, (report.high - report.low) / 200), color="#7f7f7f", label="requests")
    else:  # many distinct lengths: binned, as a reader would draw them
        ax.hist(lengths, weights=counts, bins=min(64, len(lengths)), color="#7f7f7f", label="requests")
    # the suggested edges first: a given edge at the same size is drawn dashed over it, both visible
    for s, style in ((report.suggested, "-"), (report.given, "--")):
        if s is None:
            continue
        for i, size in enumerate(s.sizes):
            ax.axvline(size, color=_COLOURS[s.name], linestyle=style, linewidth=1.2,
                       label=f"{s.name} buckets" if i == 0 else None)
    ax.set_xlabel(plain_line(f"{report.symbol} (observed length)"))
    ax.set_ylabel("requests")
    _title(ax, f"{report.model_name}: observed {report.symbol} and bucket edges")
    _legend(ax)


def _buckets(fig: Any, report: DynamicReport) -> None:
    sizes = list(report.candidates)
    points = list(report.upper_bound_points)
    upper_arena = report.upper_bound.arena_shared
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(sizes, [report.sizes[s].arena_bytes / 2**20 for s in sizes], "o-", markersize=4, label="bucket (static)")
    ax.axhline(upper_arena / 2**20, color=_COLOURS["upper bound"], linestyle="--", label="upper-bound plan")
    ax.set_xlabel(plain_line(report.symbol))
    ax.set_ylabel("arena (MiB)")
    _title(ax, "arena per variant")
    _legend(ax)
    ax = fig.add_subplot(1, 2, 2)
    ax.plot(sizes, [report.sizes[s].latency_ms for s in sizes], "o", markersize=4, label="bucket (padded to size)")
    ax.plot(points, [report.sizes[p].latency_ms for p in points], "-", color=_COLOURS["upper bound"],
            label="upper-bound plan (exact length)")
    ax.set_xlabel(plain_line(report.symbol))
    ax.set_ylabel(plain_line(f"latency (ms, {report.hardware})"))
    _title(ax, "cost-model latency")
    _legend(ax)


def _sets(fig: Any, report: DynamicReport) -> None:
    ax = fig.add_subplot(1, 1, 1)
    for i, s in enumerate(report.sets):
        ax.scatter([s.expected_latency_ms], [100 * s.waste], s=40, color=_COLOURS[s.name], label=s.name)
        sizes = f"run-time <= {report.high}" if s is report.upper_bound else ",".join(map(str, s.sizes))
        text = ax.annotate(plain_line(f"{sizes}; arena {s.arena_shared / 2**20:.2f} MiB"),
                           (s.expected_latency_ms, 100 * s.waste), xytext=(6, 6 if i % 2 == 0 else -12),
                           textcoords="offset points",
                           fontsize=7)
        text.set_parse_math(False)
    ax.margins(0.3)  # room for the labels beside the points (alternately above and below: sets may lie close)
    ax.set_ylim(bottom=-5)
    ax.set_xlabel("expected latency per request (ms)")
    ax.set_ylabel("padded compute (% of executed FLOPs)")
    _title(ax, f"{report.model_name}: bucket sets over the observed {report.symbol}")
    _legend(ax)


__all__ = ["INSTALL", "PLOT_FILES", "write_plots"]
