"""Report files of a costed program: ``cost.csv`` (one row per dispatch), ``roofline.png`` (a roofline plot drawn
with matplotlib) and ``report.html`` (one self-contained page with the summary, the hardware, the roofline as an
inline PNG and the per-layer and per-dispatch tables).

matplotlib is optional (``pip install 'torch-ir[cost]'``): without it the roofline is written as plain SVG text,
``roofline.svg`` (``SVG_REPORT_FILES``), and inlined into the page as SVG.

The roofline names its costliest points (``roofline_labels``); in the page every point shows its layer on hover
(an SVG ``<title>``, or an image map over the PNG) and links to its row. The per-layer table adds a subtotal row
per block (``block_of``: ``layers.3`` of ``model.layers.3.mlp``), and both tables sort by any column with a small
inline script (``SORT_SCRIPT``: no network, the page stays one file). The per-dispatch table and ``cost.csv`` show
the same columns, ``CSV_COLUMNS``.

Every string that comes from the program or the hardware file (names, kernels, layers) is made harmless: a program
is untrusted input. HTML and SVG text and attributes go through ``html.escape`` (quotes included), every string
cell of ``cost.csv`` through ``torch_ir.report.cells.csv_cell`` (a name starting with ``=`` is not a formula);
each is first made one plain line (``model.plain_line``: no newline, no control character), as is every line of
the text summary.

Each file is written with ``torch_ir.fileio.atomic_write`` (whole or not at all), after every target path has
been checked, so a failed run leaves no half-written report; a symbolic link planted in the output directory
under a report's name is replaced by the report, never written through.
"""

from __future__ import annotations

import base64
import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from torch_ir.fileio import atomic_write, check_output_path, check_writable_dir, write_error
from torch_ir.report.cells import csv_cell

from .hardware import Hardware
from .model import CSV_COLUMNS, CostReport, DispatchCost, LayerCost, _rate, plain_line

REPORT_FILES = ("cost.csv", "roofline.png", "report.html")
#: What is written when matplotlib cannot be imported.
SVG_REPORT_FILES = ("cost.csv", "roofline.svg", "report.html")
#: Dot colour by bound.
BOUND_COLOURS = {"compute": "#1f77b4", "memory": "#d62728"}
_W, _H = 720, 480  # SVG size
#: How many of the costliest points the roofline names (more would cover each other).
ROOFLINE_LABELS = 5
#: The longest label on the plot: a longer module path keeps its end (the most specific part).
_LABEL_CHARS = 36
_L, _R, _T, _B = 80, 160, 50, 60  # plot margins: left, right (legend), top (title), bottom


def have_matplotlib() -> bool:
    """Whether the roofline can be drawn as PNG (matplotlib imports)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def report_files(png: bool | None = None) -> tuple[str, ...]:
    """The names ``write_reports`` writes: ``REPORT_FILES`` with matplotlib, else ``SVG_REPORT_FILES``."""
    return REPORT_FILES if (have_matplotlib() if png is None else png) else SVG_REPORT_FILES


def write_reports(report: CostReport, hw: Hardware, out_dir: str | Path, png: bool | None = None) -> list[Path]:
    """Write ``cost.csv``, ``roofline.png`` (``roofline.svg`` without matplotlib, or with ``png=False``) and
    ``report.html`` into ``out_dir`` (which must exist); return their paths. Every path is checked before anything
    is written."""
    names = report_files(png)
    paths = check_report_paths(out_dir, png)
    if names == REPORT_FILES:
        plot: str | bytes
        plot, spots = _png_and_spots(report, hw)
        figure = _png_img(plot, report, hw, spots)
    else:
        plot = figure = roofline_svg(report, hw)
    payloads = [cost_csv(report), plot, report_html(report, hw, figure)]
    for path, data in zip(paths, payloads):
        _write(path, data)
    return paths


def check_report_paths(out_dir: str | Path, png: bool | None = None) -> list[Path]:
    """The paths ``write_reports`` writes into ``out_dir``, each checked (``OutputWriteError`` before anything is
    written). A symbolic link under a report's name is not followed to check its target: it is replaced."""
    paths = [Path(out_dir) / name for name in report_files(png)]
    for path in paths:
        if path.is_symlink():
            check_writable_dir(path.parent, f"cost report {path.name}", target=path)
        else:
            check_output_path(path, f"cost report {path.name}")
    return paths


def _write(path: Path, data: str | bytes) -> None:
    """``atomic_write``, replacing a link planted at ``path`` rather than writing through it: atomic_write renames
    over a link to a regular file, but writes in place into a FIFO or a device, and a link to one would lead it
    there (a report's content then lands wherever the link's author chose)."""
    what = f"cost report {path.name}"
    if path.is_symlink():
        try:
            path.unlink()
        except OSError as err:
            raise write_error(path, err, what) from None
    atomic_write(path, data, what=what)


def cost_csv(report: CostReport) -> str:
    """The per-dispatch table (``CSV_COLUMNS``) as CSV text; every string cell is one plain line, through
    ``csv_cell`` (a name a spreadsheet would evaluate, ``=HYPERLINK(...)``, is shown as text)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: _csv_value(value) for key, value in row.items()} for row in report.to_csv_rows())
    return buffer.getvalue()


def _csv_value(value: object) -> object:
    """A cell: a string as one plain line (no control characters: ``cat cost.csv`` must not drive the terminal),
    then neutralized for spreadsheets; a number as it is."""
    return csv_cell(plain_line(value)) if isinstance(value, str) else value


def _text(value: object) -> str:
    """Untrusted text for HTML or SVG, as element text or inside a quoted attribute: one plain line (no control
    characters, which XML forbids in the SVG), then escaped, quotes included."""
    return escape(plain_line(str(value)), quote=True)


# -- roofline -------------------------------------------------------------------------------------------------------

def program_dtype(report: CostReport) -> str:
    """The MAC rate class of the program: the one most of its FLOPs are costed at (int8 when there are none)."""
    weight: dict[str, int] = {}
    for r in report.rows:
        weight[r.dtype] = weight.get(r.dtype, 0) + r.flops
    return max(weight, key=lambda k: weight[k]) if weight else "int8"


def peak_flops(hw: Hardware, dtype: str) -> float:
    """FLOPs per second of the array at ``dtype``'s rate (2 per MAC); the slowest supported rate when ``dtype``
    has none, as the model costs it."""
    rate, _ = _rate(hw, dtype)
    return 2 * hw.pes * rate * hw.clock_mhz * 1e6


def roofline_points(report: CostReport, hw: Hardware) -> list[tuple[DispatchCost, float, float]]:
    """(row, arithmetic intensity in FLOPs per DRAM byte, achieved FLOPs per second) of every dispatch with FLOPs,
    DRAM bytes and cycles."""
    seconds_per_cycle = 1 / (hw.clock_mhz * 1e6)
    return [(r, r.flops / r.dram_bytes, r.flops / (r.cycles * seconds_per_cycle))
            for r in report.rows if r.flops > 0 and r.dram_bytes > 0 and r.cycles > 0]


def _decades(values: Sequence[float]) -> tuple[int, int]:
    lo = math.floor(math.log10(min(values)))
    hi = math.ceil(math.log10(max(values)))
    return lo, max(hi, lo + 1)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _roofs(report: CostReport, hw: Hardware) -> tuple[str, float, float, float, list, list[float]]:
    """What both plots draw: (dtype, peak FLOPs/s, DRAM bytes/s, ridge point, the dispatches' points, the
    x values the axis must hold)."""
    dtype = program_dtype(report)
    peak = peak_flops(hw, dtype)
    bandwidth = hw.dram_bandwidth_gbps * 1e9
    ridge = peak / bandwidth
    points = roofline_points(report, hw)
    return dtype, peak, bandwidth, ridge, points, [p[1] for p in points] + [ridge / 10, ridge * 10]


def roofline_labels(report: CostReport, hw: Hardware, count: int = ROOFLINE_LABELS) -> list[tuple[str, float, float]]:
    """(label, x, y) of the ``count`` costliest points of the roofline, by cycles: each names its dispatch's layer.
    The same layer in every block lands on the same spot, so a spot is named once, with how many more share it
    ("layers.0.mlp (+23 alike)") instead of piling up labels; a point right beside a named one is left unnamed
    (the page still names it on hover)."""
    points = roofline_points(report, hw)
    at: dict[tuple[float, float], list[DispatchCost]] = {}
    for r, x, y in points:
        at.setdefault(_spot(x, y), []).append(r)
    labels: list[tuple[str, float, float]] = []
    named: set[tuple[float, float]] = set()
    for r, x, y in sorted(points, key=lambda p: -p[0].cycles):
        spot = _spot(x, y)
        if len(labels) >= count:
            break
        if not any(_near(spot, other) for other in named):  # a label beside a named dot would cover its label
            named.add(spot)
            alike = len(at[spot]) - 1
            labels.append((_short(r.layer) + (f" (+{alike} alike)" if alike else ""), x, y))
    return labels


def _near(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether labels at the two spots would overlap: a label, drawn to the right of its dot, is about a decade of
    the x axis wide and a fifth of a decade of the y axis high."""
    return abs(a[0] - b[0]) < 1.0 and abs(a[1] - b[1]) < 0.2


def _spot(x: float, y: float) -> tuple[float, float]:
    """Where a point lands on the log-log plot, to a hundredth of a decade."""
    return round(math.log10(x), 2), round(math.log10(y), 2)


def _short(name: str) -> str:
    """A label for the plot: one plain line of at most ``_LABEL_CHARS``, keeping the end of a long path."""
    text = plain_line(name)
    return text if len(text) <= _LABEL_CHARS else "\u2026" + text[-(_LABEL_CHARS - 1):]


def roofline_png(report: CostReport, hw: Hardware, dpi: int = 110) -> bytes:
    """The roofline plot as PNG bytes (``roofline_figure``)."""
    return _png_and_spots(report, hw, dpi)[0]


def _png_and_spots(report: CostReport, hw: Hardware, dpi: int = 110
                   ) -> tuple[bytes, list[tuple[DispatchCost, float, float]]]:
    """The PNG bytes, and where each dispatch's dot is in the image's pixels (from the top left): the page lays
    an image map over them, so hovering a dot names its layer."""
    fig = roofline_figure(report, hw, dpi)
    fig.canvas.draw()  # fixes the layout: the data-to-pixel transform is then the one savefig uses
    ax = fig.axes[0]
    height = fig.bbox.height
    spots = [(r, float(px), float(height - py))
             for r, x, y in roofline_points(report, hw) for px, py in [ax.transData.transform((x, y))]]
    buffer = io.BytesIO()
    # the figure's own size and dpi, whatever a matplotlibrc says (savefig.bbox = tight, savefig.dpi): the map's
    # pixel coordinates are the figure's
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches=fig.bbox_inches, metadata={"Software": None})
    return buffer.getvalue(), spots


def roofline_figure(report: CostReport, hw: Hardware, dpi: int = 110) -> Any:
    """The roofline as a matplotlib ``Figure`` on the Agg canvas (no display, no pyplot state): the compute and
    bandwidth roofs, one dot per dispatch (with FLOPs and DRAM bytes) coloured by bound, and the costliest few
    named (``roofline_labels``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dtype, peak, bandwidth, ridge, points, xs = _roofs(report, hw)
    x0, x1 = _decades(xs)
    fig = Figure(figsize=(8, 5.3), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    xl, xr = 10.0 ** x0, 10.0 ** x1
    ax.plot([xl, ridge], [bandwidth * xl, peak], color="#2ca02c", lw=2, label=f"bandwidth roof {_fmt(bandwidth)} B/s")
    ax.plot([ridge, xr], [peak, peak], color="#ff7f0e", lw=2, label=f"compute roof {_fmt(peak)} FLOPs/s")
    for bound, colour in BOUND_COLOURS.items():
        mine = [(x, y) for r, x, y in points if r.bound == bound]
        if mine:
            ax.scatter([x for x, _ in mine], [y for _, y in mine], s=18, color=colour, alpha=0.75,
                       label=f"{bound}-bound dispatch ({len(mine)})")
    other = [(x, y) for r, x, y in points if r.bound not in BOUND_COLOURS]
    if other:
        ax.scatter([x for x, _ in other], [y for _, y in other], s=18, color="#7f7f7f", alpha=0.75)
    ax.set_xlim(xl, xr)
    ys = [y for _, _, y in points] + [peak]
    ax.set_ylim(10.0 ** math.floor(math.log10(min(ys + [bandwidth * xl]))), 10.0 ** math.ceil(math.log10(peak * 2)))
    ax.grid(True, which="major", color="#dddddd")
    ax.set_xlabel("arithmetic intensity (FLOPs per DRAM byte)")
    ax.set_ylabel("achieved throughput (FLOPs per second)")
    # names come from the program: never let matplotlib read them as mathtext ($...$)
    ax.set_title(plain_line(f"Roofline: {report.model_name} on {hw.name} ({dtype})"), parse_math=False)
    for label, x, y in roofline_labels(report, hw):
        ax.annotate(label, (x, y), xytext=(6, 2), textcoords="offset points", fontsize=7, color="#333333",
                    parse_math=False)
    legend = ax.legend(loc="lower right", fontsize=8)
    for text in legend.get_texts():
        text.set_parse_math(False)
    fig.tight_layout()
    return fig


def _png_img(png: bytes, report: CostReport, hw: Hardware,
             spots: Sequence[tuple[DispatchCost, float, float]] = ()) -> str:
    """An ``<img>`` carrying ``png`` inline (a data URI), so the page stays one self-contained file, with an image
    map of ``spots``: hovering a dot shows its layer, clicking it goes to its row of the per-dispatch table."""
    alt = _text(f"Roofline of {report.model_name} on {hw.name}")
    areas = "".join(f'<area shape="circle" coords="{x:.0f},{y:.0f},5" href="#dispatch-{r.index}" '
                    f'title="{_text(_point_title(r))}" alt="{_text(r.layer)}">' for r, x, y in spots)
    return (f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
            f'usemap="#roofline-points"><map name="roofline-points">{areas}</map>')


def _png_figure(report: CostReport, hw: Hardware) -> str:
    """The page's roofline as an inline PNG with its image map."""
    png, spots = _png_and_spots(report, hw)
    return _png_img(png, report, hw, spots)


def _point_title(r: DispatchCost) -> str:
    """What hovering a dispatch's dot says (plain text: the caller escapes it)."""
    return f"{r.layer}: {r.name} ({r.kernel}), {r.cycles:,} cycles, {r.bound}-bound"


def roofline_svg(report: CostReport, hw: Hardware) -> str:
    """A log-log roofline plot as SVG text: the compute and bandwidth roofs and one dot per dispatch (with FLOPs
    and DRAM bytes), coloured by bound."""
    dtype, peak, bandwidth, ridge, points, xs = _roofs(report, hw)
    ys = [p[2] for p in points] + [peak * 2, min(bandwidth * min(xs), peak) / 2]
    x0, x1 = _decades(xs)
    y0, y1 = _decades(ys)
    pw, ph = _W - _L - _R, _H - _T - _B

    def px(x: float) -> float:
        return _L + (math.log10(x) - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return _T + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    title = f"Roofline: {report.model_name} on {hw.name} ({dtype})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
           f'font-family="sans-serif" font-size="11">',
           f"<title>{_text(title)}</title>",
           f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_W / 2:.1f}" y="24" text-anchor="middle" font-size="14" font-weight="bold">'
           f"{_text(title)}</text>",
           f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="black"/>']
    for e in range(x0, x1 + 1):  # ticks and grid at powers of ten
        x = px(10.0 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{_T}" x2="{x:.1f}" y2="{_T + ph}" stroke="#ddd"/>')
        out.append(f'<line x1="{x:.1f}" y1="{_T + ph}" x2="{x:.1f}" y2="{_T + ph + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{_T + ph + 18}" text-anchor="middle">1e{e}</text>')
    for e in range(y0, y1 + 1):
        y = py(10.0 ** e)
        out.append(f'<line x1="{_L}" y1="{y:.1f}" x2="{_L + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<line x1="{_L - 5}" y1="{y:.1f}" x2="{_L}" y2="{y:.1f}" stroke="black"/>')
        out.append(f'<text x="{_L - 8}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    out.append(f'<text x="{_L + pw / 2:.1f}" y="{_H - 15}" text-anchor="middle">'
               "arithmetic intensity (FLOPs per DRAM byte)</text>")
    out.append(f'<text x="18" y="{_T + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 18 {_T + ph / 2:.1f})">achieved throughput (FLOPs per second)</text>')
    # roofs: bandwidth from the left edge to the ridge point, compute from the ridge to the right edge
    xl, xr = 10.0 ** x0, 10.0 ** x1
    bw_start = max(xl, 10.0 ** y0 / bandwidth)
    out.append(f'<polyline fill="none" stroke="#2ca02c" stroke-width="2" points="{px(bw_start):.1f},'
               f'{py(bandwidth * bw_start):.1f} {px(ridge):.1f},{py(peak):.1f}"/>')
    out.append(f'<polyline fill="none" stroke="#ff7f0e" stroke-width="2" points="{px(ridge):.1f},{py(peak):.1f} '
               f'{px(xr):.1f},{py(peak):.1f}"/>')
    for r, x, y in points:
        colour = BOUND_COLOURS.get(r.bound, "#7f7f7f")
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{colour}" fill-opacity="0.75">'
                   f"<title>{_text(_point_title(r))}: {_fmt(x)} FLOPs/byte, {_fmt(y)} FLOPs/s</title></circle>")
    for label, x, y in roofline_labels(report, hw):
        out.append(f'<text class="label" x="{px(x) + 6:.1f}" y="{py(y) - 3:.1f}" font-size="9" fill="#333">'
                   f"{_text(label)}</text>")
    legend = [("line", "#ff7f0e", f"compute roof {_fmt(peak)} FLOPs/s"),
              ("line", "#2ca02c", f"bandwidth roof {_fmt(bandwidth)} B/s"),
              ("dot", BOUND_COLOURS["compute"], "compute-bound dispatch"),
              ("dot", BOUND_COLOURS["memory"], "memory-bound dispatch")]
    lx = _L + pw + 12
    for i, (shape, colour, label) in enumerate(legend):
        ly = _T + 10 + 34 * i
        if shape == "line":
            out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 18}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        else:
            out.append(f'<rect x="{lx + 5}" y="{ly - 4}" width="8" height="8" rx="4" fill="{colour}"/>')
        words = label.split(" ", 2)
        out.append(f'<text x="{lx + 24}" y="{ly + 4}">{escape(" ".join(words[:2]))}</text>')
        if len(words) > 2:
            out.append(f'<text x="{lx + 24}" y="{ly + 17}">{escape(words[2])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- HTML -----------------------------------------------------------------------------------------------------------

_STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#f0f0f0}td.n{text-align:right}
table.sortable th{cursor:pointer}table.sortable th[data-dir=asc]::after{content:" \\25B2"}
table.sortable th[data-dir=desc]::after{content:" \\25BC"}tr.subtotal td{font-weight:bold;background:#f4f4f4}
tr:target td{background:#fff3b0}pre{background:#f7f7f7;padding:1em}"""

#: Sorts a ``table.sortable`` by the clicked column (first click: largest first), a number by its ``data-v``.
#: Each ``<tbody>`` is a group (a block and its subtotal row, or one row): rows sort within their group, the
#: subtotal stays last, and the groups sort by their last row. It only moves existing rows: no markup is built.
SORT_SCRIPT = """<script>
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), col = th.cellIndex, dir = th.dataset.dir === "desc" ? 1 : -1;
    table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    function key(row) {
      var cell = row.cells[col];
      return cell && cell.dataset.v !== undefined ? parseFloat(cell.dataset.v) : (cell ? cell.textContent : "");
    }
    function cmp(a, b) {
      var x = key(a), y = key(b);
      if (typeof x === "number" && typeof y === "number") { return (x - y) * dir; }
      return String(x).localeCompare(String(y), undefined, {numeric: true}) * dir;
    }
    var groups = Array.prototype.slice.call(table.tBodies);
    groups.forEach(function (body) {
      var rows = Array.prototype.slice.call(body.rows);
      var totals = rows.filter(function (r) { return r.classList.contains("subtotal"); });
      rows.filter(function (r) { return !r.classList.contains("subtotal"); }).sort(cmp).concat(totals)
        .forEach(function (r) { body.appendChild(r); });
    });
    groups.sort(function (a, b) { return cmp(a.rows[a.rows.length - 1], b.rows[b.rows.length - 1]); })
      .forEach(function (body) { table.appendChild(body); });
  });
});
</script>"""

#: Headers of the per-dispatch table by ``CSV_COLUMNS`` key (a key without one is shown as it is).
COLUMN_LABELS = {"index": "#", "macs": "MACs", "flops": "FLOPs", "network_pct": "% of network", "util_pct": "util %",
                 "dram_bytes": "DRAM bytes", "sram_bytes": "SRAM bytes", "sram_reads": "SRAM reads (words)",
                 "sram_writes": "SRAM writes (words)"}
#: Columns of the per-layer table (the subtotal rows sum them; the SRAM column is the peak, not a sum).
LAYER_COLUMNS = ("layer", "dispatches", "MACs", "cycles", "% of network", "DRAM bytes", "peak SRAM bytes")


@dataclass(frozen=True)
class _Row:
    """One row of a table: its cells (an int or float is a number, anything else text), a class and an id."""

    cells: Sequence[object]
    css: str = ""
    id: str = ""


def _cell(value: object) -> str:
    """A ``<td>``: a number right-aligned with its exact value in ``data-v`` (what the sort script compares),
    anything else as escaped text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="n" data-v="{value}">{value:,}</td>'
    if isinstance(value, float):
        return f'<td class="n" data-v="{value!r}">{value:,.2f}</td>'
    return f"<td>{_text(value)}</td>"


def _tr(row: _Row) -> str:
    attrs = (f' class="{_text(row.css)}"' if row.css else "") + (f' id="{_text(row.id)}"' if row.id else "")
    return f"<tr{attrs}>" + "".join(_cell(v) for v in row.cells) + "</tr>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain two-column style table (summary, hardware, host dispatches)."""
    head = "".join(f"<th>{_text(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>\n" + "\n".join(_tr(_Row(r)) for r in rows) + "</table>"


def _sortable_table(columns: Sequence[tuple[str, str]], groups: Sequence[Sequence[_Row]]) -> str:
    """A table ``SORT_SCRIPT`` sorts: ``columns`` are (key, header) pairs, the key in ``data-col``; each group is
    one ``<tbody>``."""
    head = "".join(f'<th data-col="{_text(key)}" title="sort">{_text(label)}</th>' for key, label in columns)
    bodies = "\n".join("<tbody>" + "\n".join(_tr(r) for r in group) + "</tbody>" for group in groups)
    return f'<table class="sortable"><thead><tr>{head}</tr></thead>\n{bodies}</table>'


def dispatch_table(report: CostReport) -> str:
    """The per-dispatch table: the rows and columns of ``cost.csv`` (``to_csv_rows``, ``CSV_COLUMNS``), each row
    with the id the roofline's points link to."""
    columns = [(key, COLUMN_LABELS.get(key, key)) for key in CSV_COLUMNS]
    rows = [_Row([row[key] for key in CSV_COLUMNS], id=f"dispatch-{r.index}")
            for r, row in zip(report.rows, report.to_csv_rows())]
    return _sortable_table(columns, [rows])


def block_of(layer: str) -> str | None:
    """The repeated block a module path belongs to: the path up to its first numeric part (``model.layers.3`` of
    ``model.layers.3.mlp.down_proj``, ``layer1.0`` of ResNet's ``layer1.0.conv1``); None outside any block."""
    parts = layer.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None


def layer_groups(report: CostReport) -> list[tuple[str | None, list[LayerCost]]]:
    """The layers of ``by_layer`` grouped by ``block_of``, in program order of each group's first layer:
    (block, its layers), or (None, [one layer]) for a layer outside any block."""
    groups: dict[str, tuple[str | None, list[LayerCost]]] = {}
    for lc in report.by_layer().values():
        block = block_of(lc.layer)
        key = f"block {block}" if block is not None else f"layer {lc.layer}"
        groups.setdefault(key, (block, []))[1].append(lc)
    return list(groups.values())


def layer_table(report: CostReport) -> str:
    """The per-layer table: a block's layers then its subtotal row (cycles, MACs, DRAM bytes and dispatches
    summed, SRAM the peak), a layer outside any block on its own."""
    total = report.total_cycles or 1

    def row(name: str, layers: Sequence[LayerCost], css: str = "") -> _Row:
        cycles = sum(lc.cycles for lc in layers)
        return _Row([name, sum(lc.dispatches for lc in layers), sum(lc.macs for lc in layers), cycles,
                     round(100 * cycles / total, 2), sum(lc.dram_bytes for lc in layers),
                     max(lc.sram_bytes for lc in layers)], css)

    groups = []
    for block, layers in layer_groups(report):
        rows = [row(lc.layer, [lc]) for lc in layers]
        if block is not None and len(layers) > 1:
            rows.append(row(f"{block} (block subtotal, {len(layers)} layers)", layers, "subtotal"))
        groups.append(rows)
    return _sortable_table([(label, label) for label in LAYER_COLUMNS], groups)


def _hardware_rows(hw: Hardware) -> list[tuple[str, str]]:
    rates = ", ".join(f"{k} {v:g}" for k, v in hw.macs_per_cycle.items())
    vector = ", ".join(f"{k} {v:g}" for k, v in hw.vector_ops_per_cycle.items())
    if hw.sram_shared:
        sram = f"{hw.sram_weights_bytes:,} bytes shared"
    else:
        sram = (f"weights {hw.sram_weights_bytes:,}, activations {hw.sram_activations_bytes:,}, "
                f"accumulators {hw.sram_accumulators_bytes:,} bytes")
    return [("name", hw.name), ("source", hw.source), ("array", f"{hw.rows} x {hw.cols} PEs, {hw.dataflow}"),
            ("clock", f"{hw.clock_mhz:g} MHz"), ("MACs per PE per cycle", rates),
            ("vector unit", f"{hw.vector_lanes} lanes; ops per lane per cycle: {vector}"), ("SRAM", sram),
            ("DRAM", f"{hw.dram_bandwidth_gbps:g} GB/s, {hw.dram_latency_ns:g} ns latency per dispatch"),
            ("DMA overlaps compute", "yes" if hw.dma_overlaps_compute else "no")]


def report_html(report: CostReport, hw: Hardware, figure: str | None = None) -> str:
    """One self-contained HTML page: summary numbers, hardware, the roofline (``figure``: trusted markup, an inline
    ``<img>`` of the PNG or the SVG text; by default the PNG with matplotlib, else the SVG), per-layer and
    per-dispatch tables."""
    if figure is None:
        figure = _png_figure(report, hw) if have_matplotlib() else roofline_svg(report, hw)
    summary = [*([("precision", report.dtype_note)] if report.dtype_note else []),
               ("latency", f"{report.latency_ms:.3f} ms"), ("throughput", f"{report.fps:.1f} fps"),
               ("total cycles", f"{report.total_cycles:,}"), ("compute cycles", f"{report.compute_cycles:,}"),
               ("memory cycles", f"{report.memory_cycles:,}"), ("MACs", f"{report.macs:,}"),
               ("FLOPs", f"{report.flops:,}"), ("array utilization", f"{report.utilization:.1%}"),
               ("DRAM traffic", f"{report.dram_bytes:,} bytes"),
               ("peak SRAM", f"{report.peak_sram_bytes:,} bytes"),
               ("dispatches", f"{len(report.rows)} on the NPU, {len(report.host)} on the host, "
                              f"{len(report.bind)} at bind time")]
    title = f"Cost of {report.model_name} on {hw.name}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_text(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{_text(title)}</h1>", "<h2>Summary</h2>", _table(("metric", "value"), summary),
             "<h2>Hardware</h2>", _table(("field", "value"), _hardware_rows(hw)),
             "<h2>Roofline</h2>", figure,
             "<h2>Per layer</h2>", "<p>Click a header to sort; a block's subtotal stays under its layers.</p>",
             layer_table(report),
             "<h2>Per dispatch</h2>", "<p>The columns of cost.csv. Click a header to sort.</p>",
             dispatch_table(report)]
    if report.host:
        parts += ["<h2>Host dispatches (not costed)</h2>",
                  _table(("#", "name", "kernel", "reason"), [(h.index, h.name, h.kernel, h.reason)
                                                               for h in report.host])]
    if report.bind:
        parts += ["<h2>Bind-time dispatches (once per weight binding, not in the totals)</h2>",
                  _table(("#", "name", "kernel", "cycles", "DRAM bytes"),
                         [(r.index, r.name, r.kernel, r.cycles, r.dram_bytes) for r in report.bind])]
    parts += ["<h2>Text summary</h2>", f"<pre>{escape(report.summary())}</pre>", SORT_SCRIPT, "</body></html>"]
    return "\n".join(parts) + "\n"


__all__ = ["COLUMN_LABELS", "LAYER_COLUMNS", "REPORT_FILES", "ROOFLINE_LABELS", "SORT_SCRIPT", "SVG_REPORT_FILES",
           "block_of", "check_report_paths", "cost_csv", "dispatch_table", "have_matplotlib", "layer_groups",
           "layer_table", "peak_flops", "program_dtype", "report_files", "report_html", "roofline_figure",
           "roofline_labels", "roofline_png", "roofline_points", "roofline_svg", "write_reports"]
