"""The report's files: ``accuracy.csv`` (one row per compared layer), ``pareto.csv`` (the assignments a
mixed-precision search tried; only the header without one), ``accuracy.png`` (``accuracy.svg`` without
matplotlib) and one self-contained ``report.html`` (no network: the figure inline, the tables sortable by the cost
report's inline script).

The cost report's helpers are reused (``npu_compiler.costmodel.report``): its table markup, style, sort script and
cell rules. Every model-provided string (node, tensor, module names) is one plain line, escaped in HTML and SVG
(quotes included), and made inert in a CSV (``csv_cell``: a name starting with ``=`` is not a formula). Every path
is checked before anything is written, each file is written whole or not at all (``torch_ir.fileio``), and a link
planted under a report's name is replaced, never written through.
"""

from __future__ import annotations

import base64
import csv
import io
import math
from html import escape
from pathlib import Path

from npu_compiler.costmodel.costs import plain_line
from npu_compiler.costmodel.report import SORT_SCRIPT, STYLE, Row, csv_value, html_table, sortable_table, write_file
from npu_compiler.costmodel.roofline import have_matplotlib, html_text
from torch_ir.fileio import check_output_path, check_writable_dir

from .compare import AccuracyReport, LayerAccuracy
from .mixed import PARETO_COLUMNS
from .plot import figure_png, figure_svg

REPORT_FILES = ("accuracy.csv", "pareto.csv", "accuracy.png", "report.html")
SVG_REPORT_FILES = ("accuracy.csv", "pareto.csv", "accuracy.svg", "report.html")
#: The columns of ``accuracy.csv``.
ACCURACY_COLUMNS = ("index", "node", "op", "module", "tensor", "sqnr_db", "cosine", "max_rel_error",
                    "input_sqnr_db", "loss_db", "noise_added", "first_jump")

_MORE_STYLE = "tr.jump td{background:#fde0e0}tr.target td{background:#e4f4e4}"


def write_report(report: AccuracyReport, out_dir: str | Path, png: bool | None = None) -> list[Path]:
    """Write the report's files into ``out_dir`` (which must exist) and return their paths; ``png=False`` (or no
    matplotlib) draws the figure as SVG."""
    use_png = have_matplotlib() if png is None else png
    paths = [Path(out_dir) / name for name in (REPORT_FILES if use_png else SVG_REPORT_FILES)]
    for path in paths:
        if path.is_symlink():
            check_writable_dir(path.parent, f"accuracy report {path.name}", target=path)
        else:
            check_output_path(path, f"accuracy report {path.name}")
    if use_png:
        plot: str | bytes = figure_png(report)
        figure = (f'<img alt="{html_text(report.model_name)}: SQNR per layer" '
                  f'src="data:image/png;base64,{base64.b64encode(plot).decode("ascii")}">')
    else:
        plot = figure = figure_svg(report)
    for path, data in zip(paths, [accuracy_csv(report), pareto_csv(report), plot, report_html(report, figure)]):
        write_file(path, data)
    return paths


def _number(v: float | None) -> float | str | None:
    """A CSV number: inf and nan as words (Python's float() reads them back)."""
    if v is None:
        return None
    return v if math.isfinite(v) else str(v)


def layer_row(la: LayerAccuracy, jump: LayerAccuracy | None) -> dict[str, object]:
    return {"index": la.index, "node": la.node, "op": la.op, "module": la.module or "", "tensor": la.tensor,
            "sqnr_db": _number(la.sqnr_db), "cosine": _number(la.cosine), "max_rel_error": _number(la.rel_error),
            "input_sqnr_db": _number(la.input_sqnr_db), "loss_db": _number(la.loss_db),
            "noise_added": _number(la.noise_added), "first_jump": la is jump}


def _csv(columns: tuple[str, ...], rows: list[dict[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: csv_value(v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def accuracy_csv(report: AccuracyReport) -> str:
    jump = report.first_jump
    return _csv(ACCURACY_COLUMNS, [layer_row(la, jump) for la in report.layers])


def pareto_csv(report: AccuracyReport) -> str:
    rows = []
    for a in report.assignments:
        row = a.row()
        rows.append({k: _number(v) if isinstance(v, float) else v for k, v in row.items()})
    return _csv(PARETO_COLUMNS, rows)


def _cells(row: dict[str, object]) -> list[object]:
    """Table cells: numbers stay numbers (sortable), booleans and missing values become words."""
    return [("yes" if v else "") if isinstance(v, bool) else ("" if v is None else v) for v in row.values()]


def report_html(report: AccuracyReport, figure: str) -> str:
    """The page: summary, next-token agreement (an LLM), the figure (trusted markup: an inline ``<img>`` or SVG),
    the per-layer table, the assignments tried, the text summary."""
    jump = report.first_jump
    summary = [("tensors compared", len(report.layers)), ("input sets", report.inputs),
               ("output SQNR", _db(report.output_sqnr_db)),
               ("first jump", f"{jump.node} ({jump.op})" if jump else f"none ({report.verdict.kind})"),
               ("noise floor (relative)", f"{report.noise_floor:.3g}"), ("verdict", report.verdict.text)]
    if report.tokens is not None:
        t = report.tokens
        summary += [("positions (next token)", t.positions), ("mean KLD", f"{t.mean_kld:.6f}"),
                    ("99% KLD", f"{t.p99_kld:.6f}"), ("max KLD", f"{t.max_kld:.6f}"),
                    ("same top-1 token", f"{t.top1_pct:.2f}%")]
    title = f"Quantization accuracy of {report.model_name}"
    layers = [Row(_cells(layer_row(la, jump)), "jump" if la is jump else "", f"layer-{la.index}")
              for la in report.layers]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html_text(title)}</title><style>{STYLE}{_MORE_STYLE}</style></head><body>",
             f"<h1>{html_text(title)}</h1>", "<h2>Summary</h2>", html_table(("metric", "value"), summary),
             "<h2>Figure</h2>", figure, "<h2>Per layer</h2>",
             "<p>The columns of accuracy.csv, in graph order. Click a header to sort.</p>",
             sortable_table([(c, c) for c in ACCURACY_COLUMNS], [layers])]
    if report.assignments:
        rows = [Row(_cells(a.row()), "target" if a.meets_target else "") for a in report.assignments]
        parts += [f"<h2>Mixed precision{html_text(f' on {report.hardware}') if report.hardware else ''}</h2>",
                  "<p>The columns of pareto.csv: every assignment tried; pareto = on the accuracy/latency front.</p>",
                  sortable_table([(c, c) for c in PARETO_COLUMNS], [rows])]
    parts += ["<h2>Text summary</h2>", f"<pre>{escape(_plain_lines(report.summary()))}</pre>", SORT_SCRIPT,
              "</body></html>"]
    return "\n".join(parts) + "\n"


def _plain_lines(text: str) -> str:
    """Each line one plain line: a name cannot forge a line or carry control characters into the page."""
    return "\n".join(plain_line(line) for line in text.splitlines())


def _db(v: float) -> str:
    return f"{v:.2f} dB" if math.isfinite(v) else str(v)
