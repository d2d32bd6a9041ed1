"""One self-contained HTML page of a whole run: the graph of every stage, the overlays, the cost summary, the
verification result and the compiled program's memory plan as a timeline.

``write_report(path, graphs, overlays, program=..., cost=..., verification=...)`` writes ONE file: the script, the
style and the data are inlined, nothing is fetched (no server, no network; it works from ``file://``). The page
draws the graphs itself (``static/report.js``: a layered layout of the visible boxes), starting folded by block
(``model.layers.3``: the module path up to its first numeric part, as the cost report's ``block_of``), so an
80-layer model opens as ~85 boxes; a click unfolds a block into its modules and nodes.

Everything a model names (node names, module paths, ops, attributes, tensor names) is untrusted. It reaches the
page only as JSON inside ``<script type="application/json">``, with ``<``, ``>`` and ``&`` written as ``\\u003c``,
``\\u003e`` and ``\\u0026`` (so no name can close the script element), and the script reads it with
``JSON.parse`` and shows it through ``textContent`` and attributes set one by one, never as markup. The few strings
rendered here in Python (the title, the cost and verification tables) go through ``html.escape``.

The embedded data (``report_data``), compact because an 80-layer model has ~7,000 nodes over four stages:
``stages``: ``[{stage, nodes: [{id, op, ns, in: [indices of the nodes it reads], out: [[name, shape, dtype]],
attrs, src, rules}]}]`` (``src`` left out where it is ``[id]``, an extracted node's own name); ``overlays``:
``[{name, unit, stage (where measured), reduce, values: {stage: [value or null, one per node]}}]``; ``memory``:
``{arena_bytes, steps, tensors: [[name, offset, nbytes, first, last]]}`` (``first`` -1: live on entry; ``last``
``steps``: live on exit), from ``npu_program.memory_check.lifetimes`` and ``program.memory.offsets``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch_ir.fileio import atomic_write, check_output_path

from .overlays import Overlay
from .stages import GraphNode, StageGraph

if TYPE_CHECKING:
    from npu_compiler.costmodel.costs import CostReport
    from npu_program.program import CompiledProgram
    from torch_ir.verify.result import VerificationReport

#: The id of the ``<script type="application/json">`` element holding ``report_data``.
DATA_ID = "report-data"
#: An attribute whose JSON is longer than this is shown cut (a constant's values, a long list): the page stays small.
MAX_ATTR_CHARS = 300
#: The reductions the page knows for a folded box (``overlays.REDUCTIONS``); an overlay without one sums.
DEFAULT_REDUCE = "sum"


def write_report(path: str | Path, graphs: Sequence[StageGraph], overlays: Sequence[Overlay] = (), *,
                 program: CompiledProgram | None = None, cost: CostReport | None = None,
                 verification: VerificationReport | None = None, title: str = "Pipeline report") -> Path:
    """Write the report page to ``path`` (whole or not at all: ``atomic_write``) and return its path."""
    target = Path(path)
    check_output_path(target, "HTML report")
    page = report_html(graphs, overlays, program=program, cost=cost, verification=verification, title=title)
    atomic_write(target, page, what="HTML report")
    return target


def report_html(graphs: Sequence[StageGraph], overlays: Sequence[Overlay] = (), *,
                program: CompiledProgram | None = None, cost: CostReport | None = None,
                verification: VerificationReport | None = None, title: str = "Pipeline report") -> str:
    """The page as text (see the module docstring)."""
    from .report_page import page

    data = report_data(graphs, overlays, program)
    return page(title, embed_json(data), script(), cost=cost, verification=verification)


def script() -> str:
    """The page's script (``static/report.js``), inlined: the page fetches nothing."""
    return resources.files(__package__).joinpath("static", "report.js").read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` escaped as ``\\uXXXX``
    (``</script>`` or ``<!--`` in a name cannot end or change the element; ``JSON.parse`` reads them back)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def report_data(graphs: Sequence[StageGraph], overlays: Sequence[Overlay] = (),
                program: CompiledProgram | None = None) -> dict[str, Any]:
    """The data the page draws (module docstring): stages, overlays per node, and the memory timeline."""
    return {"stages": [_stage(g) for g in graphs],
            "overlays": [_overlay(o, graphs) for o in overlays],
            "memory": memory_timeline(program) if program is not None else None}


def _stage(graph: StageGraph) -> dict[str, Any]:
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    return {"stage": graph.stage, "nodes": [_node(n, index) for n in graph.nodes],
            "inputs": [[name, _plain(shape), str(dtype)] for name, shape, dtype in graph.inputs]}


def _node(node: GraphNode, index: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": node.id, "op": node.op, "ns": node.namespace,
                             "in": [index[i] for i in node.inputs if i in index],
                             "out": [[name, _plain(shape), str(dtype)] for name, shape, dtype in node.outputs]}
    if node.attrs:
        entry["attrs"] = {str(k): _attr(v) for k, v in node.attrs.items()}
    if node.sources != [node.id]:
        entry["src"] = list(node.sources)
    if node.rules:
        entry["rules"] = list(node.rules)
    return entry


def _attr(value: Any) -> Any:
    """An attribute as JSON data, or its text cut to ``MAX_ATTR_CHARS`` when longer (or not JSON at all)."""
    plain = _plain(value)
    text = json.dumps(plain, allow_nan=False)
    return plain if len(text) <= MAX_ATTR_CHARS else text[:MAX_ATTR_CHARS] + " ..."


def _plain(value: Any) -> Any:
    """``value`` as JSON data: tuples as lists, non-finite floats and anything else as text."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _overlay(overlay: Overlay, graphs: Sequence[StageGraph]) -> dict[str, Any]:
    """An overlay as one list per stage, aligned with that stage's nodes (null where it has no value)."""
    values = {g.stage: [_value(overlay.on(g.stage).get(n.id)) for n in g.nodes] for g in graphs}
    return {"name": overlay.name, "unit": overlay.unit, "stage": overlay.source_stage,
            "reduce": overlay.reduce or DEFAULT_REDUCE, "values": values}


def _value(value: Any) -> Any:
    """A number kept to 6 significant digits (the page shows no more; an 80-layer model has ~7,000 nodes a
    stage), a non-finite one as text, anything else as text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number):
            return str(number)
        return int(number) if number.is_integer() and abs(number) < 2**53 else float(f"{number:.6g}")
    return str(value)


def memory_timeline(program: CompiledProgram) -> dict[str, Any]:
    """The arena as tensor lifetimes against offsets: one ``[name, offset, nbytes, first, last]`` per planned
    tensor (a view has none: it lives in its base's bytes), as ``npu_program.check`` computes them."""
    from npu_program.memory_check import lifetimes

    memory = program.memory
    sizes = {name: program.tensors[name].nbytes for name in memory.offsets if name in program.tensors}
    pinned = program.bind_outputs  # computed at bind time, read by every run: live throughout
    lives = lifetimes([(d.inputs, d.outputs) for d in program.dispatches], sizes,
                      live_in=[*(s.name for s in program.input_specs), *pinned],
                      live_out=[*(s.name for s in program.output_specs), *pinned], aliases=memory.aliases)
    return {"arena_bytes": memory.arena_bytes, "steps": len(program.dispatches), "alignment": memory.alignment,
            "tensors": [[life.name, memory.offsets[life.name], life.nbytes, life.first, life.last]
                        for life in lives]}


__all__ = ["DATA_ID", "embed_json", "memory_timeline", "report_data", "report_html", "script", "write_report"]
