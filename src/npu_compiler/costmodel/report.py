"""Report files of a costed program: ``cost.csv`` (one row per dispatch), ``roofline.png`` (a roofline plot drawn
with matplotlib) and ``report.html`` (one self-contained page with the summary, the hardware, the roofline as an
inline PNG and the per-layer and per-dispatch tables).

matplotlib is optional (``pip install 'torch-ir[cost]'``): without it the roofline is written as plain SVG text,
``roofline.svg`` (``SVG_REPORT_FILES``), and inlined into the page as SVG.

The roofline (:mod:`.roofline`) names its costliest points; in the page every point shows its layer on hover
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

The page's pieces (``STYLE``, ``SORT_SCRIPT``, ``Row``, ``html_table``, ``sortable_table``, ``csv_value``,
``write_file``) are public: the quantization report (``npu_compiler.quantize.report``) builds its page from them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from torch_ir.fileio import atomic_write, check_output_path, check_writable_dir
from torch_ir.report.cells import csv_cell

from .costs import CSV_COLUMNS, CostReport, LayerCost, plain_line
from .hardware import MAC_DTYPES, Hardware
from .roofline import have_matplotlib, html_text, png_and_spots, png_figure, png_img, roofline_svg

REPORT_FILES = ("cost.csv", "roofline.png", "report.html")
#: What is written when matplotlib cannot be imported.
SVG_REPORT_FILES = ("cost.csv", "roofline.svg", "report.html")
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
        plot, spots = png_and_spots(report, hw)
        figure = png_img(plot, report, hw, spots)
    else:
        plot = figure = roofline_svg(report, hw)
    payloads = [cost_csv(report), plot, report_html(report, hw, figure)]
    for path, data in zip(paths, payloads):
        write_file(path, data)
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


def write_file(path: Path, data: str | bytes) -> None:
    """``atomic_write``, replacing a link planted at ``path`` rather than writing through it (a link to a FIFO
    or a device would otherwise lead the report wherever the link's author chose)."""
    atomic_write(path, data, what=f"cost report {path.name}", replace_links=True)


def cost_csv(report: CostReport) -> str:
    """The per-dispatch table (``CSV_COLUMNS``) as CSV text; every string cell is one plain line, through
    ``csv_cell`` (a name a spreadsheet would evaluate, ``=HYPERLINK(...)``, is shown as text)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: csv_value(value) for key, value in row.items()} for row in report.to_csv_rows())
    return buffer.getvalue()


def csv_value(value: object) -> object:
    """A cell: a string as one plain line (no control characters: ``cat cost.csv`` must not drive the terminal),
    then neutralized for spreadsheets; a number as it is."""
    return csv_cell(plain_line(value)) if isinstance(value, str) else value


# -- HTML -----------------------------------------------------------------------------------------------------------

STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
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
                 "dram_bytes": "DRAM bytes", "weight_bytes": "weight bytes", "activation_bytes": "activation bytes",
                 "dtype": "compute width", "sram_bytes": "SRAM bytes", "sram_reads": "SRAM reads (words)",
                 "sram_writes": "SRAM writes (words)"}
#: Columns of the per-layer table (the subtotal rows sum them; the SRAM column is the peak, not a sum).
LAYER_COLUMNS = ("layer", "dispatches", "MACs", "cycles", "% of network", "DRAM bytes", "peak SRAM bytes")


@dataclass(frozen=True)
class Row:
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
    return f"<td>{html_text(value)}</td>"


def _tr(row: Row) -> str:
    attrs = (f' class="{html_text(row.css)}"' if row.css else "") + (f' id="{html_text(row.id)}"' if row.id else "")
    return f"<tr{attrs}>" + "".join(_cell(v) for v in row.cells) + "</tr>"


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain two-column style table (summary, hardware, host dispatches)."""
    head = "".join(f"<th>{html_text(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>\n" + "\n".join(_tr(Row(r)) for r in rows) + "</table>"


def sortable_table(columns: Sequence[tuple[str, str]], groups: Sequence[Sequence[Row]]) -> str:
    """A table ``SORT_SCRIPT`` sorts: ``columns`` are (key, header) pairs, the key in ``data-col``; each group is
    one ``<tbody>``."""
    head = "".join(f'<th data-col="{html_text(key)}" title="sort">{html_text(label)}</th>' for key, label in columns)
    bodies = "\n".join("<tbody>" + "\n".join(_tr(r) for r in group) + "</tbody>" for group in groups)
    return f'<table class="sortable"><thead><tr>{head}</tr></thead>\n{bodies}</table>'


def dispatch_table(report: CostReport) -> str:
    """The per-dispatch table: the rows and columns of ``cost.csv`` (``to_csv_rows``, ``CSV_COLUMNS``), each row
    with the id the roofline's points link to."""
    columns = [(key, COLUMN_LABELS.get(key, key)) for key in CSV_COLUMNS]
    rows = [Row([row[key] for key in CSV_COLUMNS], id=f"dispatch-{r.index}")
            for r, row in zip(report.rows, report.to_csv_rows())]
    return sortable_table(columns, [rows])


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

    def row(name: str, layers: Sequence[LayerCost], css: str = "") -> Row:
        cycles = sum(lc.cycles for lc in layers)
        return Row([name, sum(lc.dispatches for lc in layers), sum(lc.macs for lc in layers), cycles,
                     round(100 * cycles / total, 2), sum(lc.dram_bytes for lc in layers),
                     max(lc.sram_bytes for lc in layers)], css)

    groups = []
    for block, layers in layer_groups(report):
        rows = [row(lc.layer, [lc]) for lc in layers]
        if block is not None and len(layers) > 1:
            rows.append(row(f"{block} (block subtotal, {len(layers)} layers)", layers, "subtotal"))
        groups.append(rows)
    return sortable_table([(label, label) for label in LAYER_COLUMNS], groups)


def _hardware_rows(hw: Hardware) -> list[tuple[str, str]]:
    rates = ", ".join(f"{k} {hw.mac_rate(k):g}" + ("" if k in hw.macs_per_cycle else " (derived)")
                      for k in MAC_DTYPES)
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
        figure = png_figure(report, hw) if have_matplotlib() else roofline_svg(report, hw)
    summary = [*([("precision", report.dtype_note)] if report.dtype_note else []),
               ("latency", f"{report.latency_ms:.3f} ms"), ("throughput", f"{report.fps:.1f} fps"),
               ("total cycles", f"{report.total_cycles:,}"), ("compute cycles", f"{report.compute_cycles:,}"),
               ("memory cycles", f"{report.memory_cycles:,}"), ("MACs", f"{report.macs:,}"),
               ("FLOPs", f"{report.flops:,}"), ("array utilization", f"{report.utilization:.1%}"),
               ("DRAM traffic", f"{report.dram_bytes:,} bytes"),
               ("DRAM by role", f"weights {report.weight_bytes:,} bytes, activations {report.activation_bytes:,} "
                                "bytes"),
               ("weights stored", f"{report.weights_stored:,} bytes"), ("compute widths", report.width_mix()),
               ("peak SRAM", f"{report.peak_sram_bytes:,} bytes"),
               ("dispatches", f"{len(report.rows)} on the NPU, {len(report.host)} on the host, "
                              f"{len(report.bind)} at bind time")]
    title = f"Cost of {report.model_name} on {hw.name}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html_text(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html_text(title)}</h1>", "<h2>Summary</h2>", html_table(("metric", "value"), summary),
             "<h2>Hardware</h2>", html_table(("field", "value"), _hardware_rows(hw)),
             "<h2>Roofline</h2>", figure,
             "<h2>Per layer</h2>", "<p>Click a header to sort; a block's subtotal stays under its layers.</p>",
             layer_table(report),
             "<h2>Per dispatch</h2>", "<p>The columns of cost.csv. Click a header to sort.</p>",
             dispatch_table(report)]
    if report.host:
        parts += ["<h2>Host dispatches (not costed)</h2>",
                  html_table(("#", "name", "kernel", "reason"), [(h.index, h.name, h.kernel, h.reason)
                                                               for h in report.host])]
    if report.bind:
        parts += ["<h2>Bind-time dispatches (once per weight binding, not in the totals)</h2>",
                  html_table(("#", "name", "kernel", "cycles", "DRAM bytes"),
                         [(r.index, r.name, r.kernel, r.cycles, r.dram_bytes) for r in report.bind])]
    parts += ["<h2>Text summary</h2>", f"<pre>{escape(report.summary())}</pre>", SORT_SCRIPT, "</body></html>"]
    return "\n".join(parts) + "\n"


__all__ = ["COLUMN_LABELS", "LAYER_COLUMNS", "REPORT_FILES", "SORT_SCRIPT", "SVG_REPORT_FILES", "block_of",
           "check_report_paths", "cost_csv", "dispatch_table", "have_matplotlib", "layer_groups", "layer_table",
           "report_files", "report_html", "write_reports"]
