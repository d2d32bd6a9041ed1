"""The report page's markup and style (``report.py`` gives it the data and the script): the toolbar, the graph and
its node panel, the cost summary, the verification result and the memory timeline's place.

The cost and verification tables are rendered here, every string through ``html_text`` (escaped, quotes included,
one plain line), in the cost report's house style (``npu_compiler.costmodel.report``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npu_compiler.costmodel.report import STYLE as COST_STYLE
from npu_compiler.costmodel.report import html_table
from npu_compiler.costmodel.roofline import html_text

if TYPE_CHECKING:
    from npu_compiler.costmodel.costs import CostReport
    from torch_ir.verify.result import VerificationReport

STYLE = COST_STYLE + """
body{margin:1em 2em}h1{font-size:1.4em}.toolbar{display:flex;gap:.6em;align-items:center;flex-wrap:wrap;
margin:.5em 0}.toolbar label{font-size:13px}#counts{color:#666;font-size:12px}
.graph-wrap{display:flex;gap:1em;align-items:flex-start}
#graph{flex:1;height:70vh;overflow:auto;border:1px solid #ccc;background:#fcfcfc}
#panel{width:26em;max-height:70vh;overflow:auto;font-size:13px;border:1px solid #ccc;padding:.5em 1em}
#panel h3{margin:.3em 0;word-break:break-all}#panel dt{font-weight:bold;margin-top:.4em}
#panel dd{margin-left:1em;word-break:break-all;white-space:pre-wrap;font-family:monospace}
svg text{font-family:sans-serif;pointer-events:none}
g.unit.dark text{fill:#fff}
g.unit{cursor:pointer}g.unit rect{stroke:#567;stroke-width:1}g.unit.group rect{stroke:#a67c2e;stroke-width:2}
g.unit.selected rect{stroke:#d00;stroke-width:3}g.unit.related rect{stroke:#e07000;stroke-width:3}
path.edge{fill:none;stroke:#99a;stroke-width:1}rect.frame{fill:#f3eee2;fill-opacity:.45;stroke:#c9b48a}
text.frame-label{pointer-events:auto;cursor:pointer;fill:#7a5a1e;font-size:11px}
#legend{font-size:12px;display:flex;gap:.5em;align-items:center;flex-wrap:wrap;min-height:1.5em}
#legend .swatch{display:inline-block;width:12px;height:12px;border:1px solid #888;vertical-align:middle}
#legend .ramp{display:inline-block;width:160px;height:12px;border:1px solid #888;vertical-align:middle;
background:linear-gradient(to right,#fff5c0,#f5a040,#c01010)}
.verdict-pass{color:#070;font-weight:bold}.verdict-fail{color:#b00;font-weight:bold}
#timeline{overflow:auto;border:1px solid #ccc}rect.life{stroke:#335;stroke-width:.5}"""

HELP = ("Folded by block: click a box to unfold it, the label of an unfolded block to fold it. Click a node for its "
        "op, attributes, shapes, sources and overlay values; the nodes of the other stages computing the same "
        "source nodes are outlined when you switch stage.")


def page(title: str, data_json: str, script: str, *, cost: CostReport | None = None,
         verification: VerificationReport | None = None) -> str:
    """The whole page: ``data_json`` (already escaped for a script element: ``report.embed_json``) and ``script``
    (the page's own code) inlined."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html_text(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html_text(title)}</h1>", "<h2>Graph</h2>", f"<p>{html_text(HELP)}</p>", _toolbar(),
             '<div id="legend"></div>',
             '<div class="graph-wrap"><div id="graph"></div><aside id="panel"><p>No node selected.</p></aside></div>',
             "<h2>Cost</h2>", cost_section(cost), "<h2>Verification</h2>", verification_section(verification),
             "<h2>Memory plan</h2>",
             "<p>Each rectangle is one tensor of the arena: from the dispatch that writes it to the last that reads "
             "it (x), at its offset and size in the arena (y). Hover for its name.</p>",
             '<div id="timeline"></div>',
             f'<script type="application/json" id="report-data">{data_json}</script>',
             f"<script>{script}</script>", "</body></html>"]
    return "\n".join(parts) + "\n"


def _toolbar() -> str:
    return ('<div class="toolbar"><label>Stage <select id="stage"></select></label>'
            '<label>Overlay <select id="overlay"></select></label>'
            '<button id="fold-all" type="button">Fold all</button>'
            '<button id="unfold-all" type="button">Unfold all</button>'
            '<button id="zoom-out" type="button" title="zoom out">&minus;</button>'
            '<button id="zoom-in" type="button" title="zoom in">+</button><span id="counts"></span></div>')


def cost_section(cost: CostReport | None) -> str:
    """The cost summary (totals, the hardware) and the cycles and DRAM bytes by kernel; a line when not costed."""
    if cost is None:
        return "<p>Not costed.</p>"
    summary = [("hardware", cost.hardware.name), ("latency", f"{cost.latency_ms:.3f} ms"),
               ("total cycles", f"{cost.total_cycles:,}"), ("MACs", f"{cost.macs:,}"),
               ("DRAM traffic", f"{cost.dram_bytes:,} bytes"), ("array utilization", f"{cost.utilization:.1%}"),
               ("dispatches", f"{len(cost.rows)} on the NPU, {len(cost.host)} on the host, "
                              f"{len(cost.bind)} at bind time")]
    if cost.dtype_note:
        summary.insert(1, ("precision", cost.dtype_note))
    return (html_table(("metric", "value"), summary) + "<h3>By kernel</h3>"
            + html_table(("kernel", "dispatches", "cycles", "% of cycles", "DRAM bytes", "bound"), by_kernel(cost)))


def by_kernel(cost: CostReport) -> list[tuple[object, ...]]:
    """(kernel, dispatches, cycles, % of cycles, DRAM bytes, bounds) per kernel, the costliest first."""
    rows: dict[str, list] = {}
    for r in cost.rows:
        entry = rows.setdefault(r.kernel, [r.kernel, 0, 0, 0.0, 0, set()])
        entry[1] += 1
        entry[2] += r.cycles
        entry[4] += r.dram_bytes
        entry[5].add(r.bound)
    total = cost.total_cycles or 1
    out = [(k, n, cycles, round(100 * cycles / total, 2), dram, ", ".join(sorted(bounds)))
           for k, n, cycles, _, dram, bounds in rows.values()]
    return sorted(out, key=lambda row: -row[2])


def verification_section(report: VerificationReport | None) -> str:
    """The verdict, the largest error, each output's errors, and the first diverging node on failure."""
    if report is None:
        return "<p>Not verified (torch-ir report --verify runs the verifier).</p>"
    from torch_ir.verify.compare import TABLE_HEADER

    worst = max((d.max_abs for d in report.outputs), default=0.0)
    verdict = "PASS" if report.ok else "FAIL"
    parts = [f'<p>Verification of the IR against the model: <span class="verdict-{verdict.lower()}" '
             f'id="verdict">{verdict}</span>; max abs error {html_text(f"{worst:.3g}")}</p>']
    if report.note:
        parts.append(f"<p>{html_text(report.note)}</p>")
    parts.append(html_table(TABLE_HEADER, [d.cells() for d in report.outputs]))
    loc = report.localization
    if loc is not None and loc.node is not None:
        parts.append(f"<p>First diverging node: {html_text(loc.node)} ({html_text(loc.op_type)}); "
                     f"{loc.diverging} of {loc.compared} nodes differ</p>")
    return "\n".join(parts)


__all__ = ["HELP", "STYLE", "by_kernel", "cost_section", "page", "verification_section"]
