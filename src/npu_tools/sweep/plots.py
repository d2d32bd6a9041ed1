"""Plots of a sweep's results table (``results.csv``, one row per point): per model, the Pareto fronts (latency vs.
area proxy, latency vs. SRAM, accuracy vs. latency by precision) and heat maps over two hardware axes (one panel per
precision, colour = latency), as PNG files and one self-contained HTML page embedding them with the tables.

matplotlib is optional (``pip install 'torch-ir[cost]'``): without it the page is still written, with each model's
Pareto points as tables and a note saying how to get the figures.

The page follows the cost report's house style and reuses its pieces (``npu_compiler.costmodel.report``: ``STYLE``,
``SORT_SCRIPT``, the tables, ``write_file``); every string from the table (model names, hardware names, failure
reasons) is escaped, and every file is written whole or not at all (``atomic_write``), after every target path has
been checked.
"""

from __future__ import annotations

import base64
import csv
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npu_compiler.costmodel.costs import plain_line
from npu_compiler.costmodel.report import SORT_SCRIPT, STYLE, Row, html_table, sortable_table, write_file
from npu_compiler.costmodel.roofline import have_matplotlib, html_text
from torch_ir.fileio import check_output_path, read_input

ResultRow = Mapping[str, Any]

#: Hardware axes a heat map may use, in the order they are preferred (the first two that vary are drawn).
HW_AXES = ("array", "sram_kib", "dram_gbps", "clock_mhz", "hw")
#: Accuracy columns, in the order they are preferred for the accuracy-vs-latency front.
ACCURACY_COLUMNS = ("sqnr_db", "top1_agreement")
#: The full table in the page is cut here (a 10,000-point sweep would make a page no browser scrolls well).
MAX_TABLE_ROWS = 2000
#: Columns of each model's Pareto tables.
FRONT_COLUMNS = ("hw", "array", "sram_kib", "dram_gbps", "clock_mhz", "precision", "latency_ms", "area_proxy")
PAGE = "report.html"
NO_MATPLOTLIB = ("matplotlib is not installed, so the figures are not drawn (pip install 'torch-ir[cost]'); "
                 "the Pareto points are listed below.")


# -- the table ------------------------------------------------------------------------------------------------------

def read_results(path: str | Path) -> list[dict[str, str]]:
    """The rows of a sweep's ``results.csv`` as dicts of strings (``InputReadError`` naming the file when it cannot
    be read)."""
    text = read_input(path, "sweep results", fix="give the results.csv a sweep wrote (torch-ir sweep -o DIR)")
    return list(csv.DictReader(io.StringIO(text.decode("utf-8"))))


def number(value: Any) -> float | None:
    """A cell as a finite float, or None (blank, text, NaN or infinite)."""
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def ok_rows(rows: Iterable[ResultRow]) -> list[ResultRow]:
    """The rows of points that were costed (status ``ok``) with a latency."""
    return [r for r in rows if r.get("status", "ok") == "ok" and number(r.get("latency_ms")) is not None]


def axis_key(value: Any) -> tuple:
    """How values of a hardware axis sort: numbers by value, ``32x16`` arrays by PE count then rows, text last."""
    x = number(value)
    if x is not None:
        return (0, x, "")
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(value))
    if m:
        return (0, int(m[1]) * int(m[2]), str(int(m[1])).zfill(8))
    return (1, 0.0, str(value))


def varying_axes(rows: Sequence[ResultRow], candidates: Sequence[str] = HW_AXES) -> list[str]:
    """The hardware columns that take more than one value in ``rows``, in ``candidates`` order."""
    return [c for c in candidates if len({str(r.get(c, "")) for r in rows if r.get(c, "") != ""}) > 1]


def accuracy_column(rows: Sequence[ResultRow]) -> str | None:
    """The first of ``ACCURACY_COLUMNS`` with a number in some row."""
    return next((c for c in ACCURACY_COLUMNS if any(number(r.get(c)) is not None for r in rows)), None)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (both minimized; ties on x keep the lowest
    y only), ordered by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best = math.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def front_rows(rows: Sequence[ResultRow], x: str, y: str, *, maximize_y: bool = False) -> list[ResultRow]:
    """The rows on the Pareto front of columns ``x`` (minimized) and ``y`` (minimized, or maximized)."""
    usable = [r for r in rows if number(r.get(x)) is not None and number(r.get(y)) is not None]
    sign = -1.0 if maximize_y else 1.0
    points = [(number(r[x]), sign * number(r[y])) for r in usable]
    return [usable[i] for i in pareto_front(points)]  # type: ignore[arg-type]


def heat_grid(rows: Sequence[ResultRow], x: str, y: str, value: str = "latency_ms"
              ) -> tuple[list[str], list[str], list[list[float | None]]]:
    """The heat map of ``value`` over the hardware columns ``x`` and ``y``: the x labels, the y labels and the
    cells (``cells[j][i]`` for y label j, x label i). A cell over several points (other axes vary too) is their
    minimum, the best this pair of values reaches; a cell with no costed point is None."""
    xs = sorted({str(r.get(x, "")) for r in rows}, key=axis_key)
    ys = sorted({str(r.get(y, "")) for r in rows}, key=axis_key)
    cells: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    xi, yi = {v: i for i, v in enumerate(xs)}, {v: j for j, v in enumerate(ys)}
    for r in rows:
        v = number(r.get(value)) if r.get("status", "ok") == "ok" else None
        if v is None:
            continue
        j, i = yi[str(r.get(y, ""))], xi[str(r.get(x, ""))]
        cells[j][i] = v if cells[j][i] is None else min(cells[j][i], v)  # type: ignore[type-var]
    return xs, ys, cells


def by_model(rows: Sequence[ResultRow]) -> dict[str, list[ResultRow]]:
    """The rows grouped by model, in first-seen order."""
    groups: dict[str, list[ResultRow]] = {}
    for r in rows:
        groups.setdefault(str(r.get("model", "")), []).append(r)
    return groups


def precisions(rows: Sequence[ResultRow]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(str(r.get("precision", "")), None)
    return list(seen)


def slug(index: int, name: str) -> str:
    """A file-name-safe stem for a model (its name may be a path such as ``./Qwen2.5-0.5B/config.json``)."""
    return f"{index:02d}_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:60] or "model")


# -- figures (matplotlib) -------------------------------------------------------------------------------------------

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def _figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas: no display, no pyplot state shared between threads."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _text(s: object) -> str:
    """Text for matplotlib from the table: one plain line (mathtext is off at every call that takes it)."""
    return plain_line(str(s))


def _front_panel(ax: Any, rows: Sequence[ResultRow], x: str, y: str, precs: Sequence[str], *,
                 maximize_y: bool = False, xlabel: str = "", ylabel: str = "") -> None:
    """One scatter, a colour per precision, with the Pareto front over all of them drawn as a step line."""
    for k, prec in enumerate(precs):
        mine = [r for r in rows if r.get("precision") == prec and number(r.get(x)) is not None
                and number(r.get(y)) is not None]
        if mine:
            ax.scatter([number(r[x]) for r in mine], [number(r[y]) for r in mine], s=16, alpha=0.7,
                       color=_COLOURS[k % len(_COLOURS)], label=_text(prec))
    front = front_rows(rows, x, y, maximize_y=maximize_y)
    if front:
        fx, fy = [number(r[x]) for r in front], [number(r[y]) for r in front]
        ax.step(fx, fy, where="post", color="#222222", lw=1.2, label=f"Pareto front ({len(front)})")
        ax.scatter(fx, fy, s=60, facecolors="none", edgecolors="#222222", lw=1.2)  # a one-point front shows too
    else:
        ax.text(0.5, 0.5, "no points", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    ax.grid(True, color="#dddddd")
    if front:
        legend = ax.legend(fontsize=7)
        for t in legend.get_texts():
            t.set_parse_math(False)


def pareto_png(model: str, rows: Sequence[ResultRow]) -> bytes:
    """A model's three fronts side by side: latency vs. area proxy, latency vs. SRAM, accuracy vs. latency."""
    ok = ok_rows(rows)
    precs = precisions(ok)
    acc = accuracy_column(ok)
    fig = _figure(15, 4.4)
    axes = fig.subplots(1, 3)
    _front_panel(axes[0], ok, "area_proxy", "latency_ms", precs, xlabel="area proxy", ylabel="latency (ms)")
    _front_panel(axes[1], ok, "sram_kib", "latency_ms", precs, xlabel="SRAM (KiB)", ylabel="latency (ms)")
    if acc:
        _front_panel(axes[2], ok, "latency_ms", acc, precs, maximize_y=True, xlabel="latency (ms)", ylabel=acc)
    else:
        axes[2].text(0.5, 0.5, "no accuracy metric\n(float precisions only)", ha="center", va="center",
                     transform=axes[2].transAxes)
    for ax, title in zip(axes, ("latency vs. area", "latency vs. SRAM", "accuracy vs. latency")):
        ax.set_title(title, fontsize=10)
    fig.suptitle(_text(f"{model}: Pareto fronts over {len(ok)} costed points"), parse_math=False)
    fig.tight_layout()
    return _png(fig)


def heatmap_png(model: str, rows: Sequence[ResultRow], x: str, y: str) -> bytes:
    """A model's latency over hardware columns ``x`` and ``y``, one panel per precision; a blank cell had no costed
    point (it failed: see the table)."""
    import matplotlib

    precs = precisions(rows)
    fig = _figure(min(5.2 * len(precs), 20), 4.6)
    axes = fig.subplots(1, len(precs), squeeze=False)[0]
    for ax, prec in zip(axes, precs):
        xs, ys, cells = heat_grid([r for r in rows if r.get("precision") == prec], x, y)
        data = [[math.nan if v is None else v for v in line] for line in cells]
        cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="#dddddd")  # a failed cell: grey, not white
        image = ax.imshow(data, origin="lower", aspect="auto", cmap=cmap)
        known = [v for line in cells for v in line if v is not None]
        middle = (min(known) + max(known)) / 2 if known else 0.0
        ax.set_xticks(range(len(xs)), [_text(v) for v in xs], rotation=45 if len(xs) > 6 else 0, fontsize=8)
        ax.set_yticks(range(len(ys)), [_text(v) for v in ys], fontsize=8)
        for label in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
            label.set_parse_math(False)
        if len(xs) * len(ys) <= 144:  # numbers stay readable up to a 12 x 12 grid
            for j, line in enumerate(cells):
                for i, v in enumerate(line):
                    # viridis_r is dark at the high end: white text there, black on the light low end
                    dark = v is not None and v > middle
                    ax.text(i, j, "failed" if v is None else f"{v:.3g}", ha="center", va="center", fontsize=7,
                            color="#ffffff" if dark else "#000000")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(_text(f"{prec}: latency (ms)"), fontsize=10, parse_math=False)
        fig.colorbar(image, ax=ax, shrink=0.85)
    fig.suptitle(_text(f"{model}: latency over {x} x {y} (cells over other axes: the minimum)"), parse_math=False)
    fig.tight_layout()
    return _png(fig)


# -- the page -------------------------------------------------------------------------------------------------------

def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html_text(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _cell_value(value: Any) -> object:
    """A table cell: a number as a number (sorted by value), anything else as text (escaped by the table)."""
    x = number(value)
    if x is None:
        return "" if value is None else str(value)
    return int(x) if x.is_integer() and abs(x) < 2**53 and "." not in str(value) else x


def _rows_table(rows: Sequence[ResultRow], columns: Sequence[str]) -> str:
    return sortable_table([(c, c) for c in columns], [[Row([_cell_value(r.get(c)) for c in columns]) for r in rows]])


def _model_section(model: str, rows: Sequence[ResultRow], figures: Mapping[str, bytes]) -> list[str]:
    ok = ok_rows(rows)
    acc = accuracy_column(ok)
    columns = [c for c in FRONT_COLUMNS if any(r.get(c, "") != "" for r in rows)] + ([acc] if acc else [])
    parts = [f"<h2>{html_text(model)}</h2>",
             f"<p>{len(ok)} of {len(rows)} points costed; precisions: {html_text(', '.join(precisions(rows)))}.</p>"]
    parts += [_img(png, f"{model}: {name}") for name, png in figures.items()]
    fronts = [("latency vs. area proxy", "area_proxy", "latency_ms", False),
              ("latency vs. SRAM", "sram_kib", "latency_ms", False)]
    if acc:
        fronts.append((f"accuracy ({acc}) vs. latency", "latency_ms", acc, True))
    for title, x, y, maximize in fronts:
        front = front_rows(ok, x, y, maximize_y=maximize)
        if front:
            parts += [f"<h3>Pareto front: {html_text(title)}</h3>", _rows_table(front, columns)]
    return parts


def report_html(rows: Sequence[ResultRow], figures: Mapping[str, Mapping[str, bytes]], title: str) -> str:
    """The page: a summary, per model its figures (``figures[model]``: name -> PNG) and Pareto tables, the failed
    points with their reasons, and the whole table (sortable; cut at ``MAX_TABLE_ROWS``)."""
    failed = [r for r in rows if r.get("status", "ok") != "ok"]
    columns = list(rows[0].keys()) if rows else []
    summary = [("points", len(rows)), ("costed", len(rows) - len(failed)), ("failed", len(failed)),
               ("models", len(by_model(rows))), ("precisions", ", ".join(precisions(rows))),
               ("hardware axes that vary", ", ".join(varying_axes(rows)) or "none")]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html_text(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html_text(title)}</h1>", html_table(("", "value"), summary)]
    if not have_matplotlib():
        parts.append(f"<p><b>{html_text(NO_MATPLOTLIB)}</b></p>")
    for model, mine in by_model(rows).items():
        parts += _model_section(model, mine, figures.get(model, {}))
    if failed:
        parts += [f"<h2>Failed points ({len(failed)})</h2>",
                  _rows_table(failed, [c for c in ("model", "hw", *HW_AXES[:-1], "precision", "reason")
                                       if c in columns])]
    shown = rows[:MAX_TABLE_ROWS]
    cut = f" (the first {len(shown)} of {len(rows)}: the rest are in results.csv)" if len(shown) < len(rows) else ""
    parts += [f"<h2>All points{html_text(cut)}</h2>", "<p>Click a header to sort.</p>", _rows_table(shown, columns),
              SORT_SCRIPT, "</body></html>"]
    return "\n".join(parts) + "\n"


def model_figures(model: str, rows: Sequence[ResultRow], axes: Sequence[str] | None = None) -> dict[str, bytes]:
    """A model's PNGs by name: ``pareto`` always, ``heatmap`` when two hardware axes vary (or ``axes`` names
    them)."""
    figures = {"pareto": pareto_png(model, rows)}
    pair = list(axes) if axes else varying_axes(rows)[:2]
    if len(pair) == 2:
        figures["heatmap"] = heatmap_png(model, rows, pair[0], pair[1])
    return figures


def write_report(rows: Sequence[ResultRow], out_dir: str | Path, *, title: str = "Design-space sweep",
                 axes: Sequence[str] | None = None, png: bool | None = None) -> list[Path]:
    """Write ``report.html`` and, with matplotlib (``png``: default whether it imports), ``NN_<model>_pareto.png``
    and ``NN_<model>_heatmap.png`` per model with a costed point (``slug``) into ``out_dir`` (which must exist);
    return the paths written. Every path is checked before anything is written."""
    draw = have_matplotlib() if png is None else png
    models = by_model(rows)
    # a model none of whose points was costed (it failed to load) has nothing to draw: its reasons are in the page
    figures = {m: model_figures(m, mine, axes) for m, mine in models.items() if draw and ok_rows(mine)}
    files = {Path(out_dir) / f"{slug(i, m)}_{name}.png": data
             for i, m in enumerate(models) for name, data in figures.get(m, {}).items()}
    files[Path(out_dir) / PAGE] = report_html(rows, figures, title)
    for path in files:
        check_output_path(path, f"sweep report {path.name}")
    for path, data in files.items():
        write_file(path, data)
    return list(files)


__all__ = ["ACCURACY_COLUMNS", "HW_AXES", "accuracy_column", "axis_key", "front_rows", "heat_grid", "heatmap_png",
           "model_figures", "number", "ok_rows", "pareto_front", "pareto_png", "read_results", "report_html",
           "varying_axes", "write_report"]
