"""Google's Model Explorer (``pip install ai-edge-model-explorer``, the ``view`` extra) on every stage of a model.

``write_explorer(graphs, out_dir, overlays)`` writes, without the package:

* ``graphs.json``: a Model Explorer graph collection (its JSON graph format, ``model_explorer.graph_builder``), one
  graph per stage (``extracted``, ``normalized``, ``fused``, ``compiled``). A node's label is its op, its namespace
  the module path with a block index kept on its block (``model.layers.3.self_attn`` -> ``model/layers.3/self_attn``,
  so a transformer folds into ``layers.N`` groups, one per block, not a ``layers`` group of groups named ``0``,
  ``1``, ...), its attributes the op's, its outputs' metadata ``tensor_name`` and ``tensor_shape``
  (``float32[2,8,64]``, which Model Explorer's "tensor shape" edge labels read), its incoming edges one per
  producing node, and the attribute ``sources``: the extracted-IR nodes it computes (its provenance).
* ``overlays/<name>.json``: one node-data file per overlay in Model Explorer's model node-data format (values by
  graph id, then node id): loaded with the graphs, a stage colours its nodes by the overlay.
* ``sync/<left>__<right>.json``: Model Explorer's sync-navigation mapping between two stages (``mappingEntries``:
  the nodes of each side that share extracted sources). In the split view, "Sync navigation" > "Upload mapping
  from computer" with this file makes selecting a dispatch on one side select the nodes it came from on the other.

Everything is plain JSON built here, so the files are written whether or not the package is installed; ``serve``
starts the package's local server on them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_ir.errors import TorchIRError
from torch_ir.fileio import atomic_write, make_output_dir

from .overlays import Overlay
from .stages import StageGraph

GRAPHS_FILE = "graphs.json"
OVERLAY_DIR = "overlays"
SYNC_DIR = "sync"
#: An attribute longer than this is cut (a constant's values, a long list): the side panel shows a summary and
#: the 80-layer model's file stays a few MB.
MAX_ATTR_CHARS = 200
#: Numeric overlays colour from the smallest value (first) to the largest (last).
GRADIENT = ({"stop": 0, "bgColor": "#fff7bc"}, {"stop": 0.5, "bgColor": "#fd8d3c"}, {"stop": 1, "bgColor": "#bd0026"})
#: Text overlays (a placement, a bound): one colour per distinct value, in the order they first appear.
PALETTE = ("#a6dba0", "#fdae61", "#92c5de", "#f4a582", "#c2a5cf", "#d9d9d9", "#fee08b", "#80cdc1")
INSTALL_HINT = "pip install 'torch-ir[view]' (or: pip install ai-edge-model-explorer)"


class ExplorerMissingError(TorchIRError, RuntimeError):
    """Model Explorer is not installed: the files are written, the server cannot start."""


def namespace_path(module: str) -> str:
    """A module path as a Model Explorer namespace: ``.`` becomes ``/`` except before a block index, which stays
    on its block (``model.layers.3.self_attn`` -> ``model/layers.3/self_attn``)."""
    return re.sub(r"\.(?!\d+(?:\.|$))", "/", module) if module else ""


def graph_json(graph: StageGraph) -> dict[str, Any]:
    """One stage as a Model Explorer graph (``graph_builder.Graph`` as JSON); the graph's id is the stage."""
    nodes = []
    for node in graph.nodes:
        # the label is the op (less a ".default" overload) and the namespace the module: neither is repeated here,
        # which keeps the 80-layer model's file small
        attrs = [{"key": "op", "value": node.op}] if _label(node.op) != node.op else []
        if node.sources != [node.id]:
            attrs.append({"key": "sources", "value": ", ".join(node.sources)})
        if node.rules:
            attrs.append({"key": "rules", "value": ", ".join(node.rules)})
        attrs += [{"key": str(k), "value": _attr_text(v)} for k, v in node.attrs.items()]
        nodes.append({
            "id": node.id, "label": _label(node.op), "namespace": namespace_path(node.namespace), "attrs": attrs,
            "incomingEdges": [{"sourceNodeId": src, "sourceNodeOutputId": "0", "targetNodeInputId": str(i)}
                              for i, src in enumerate(node.inputs)],
            "outputsMetadata": [{"id": str(i), "attrs": [
                {"key": "tensor_name", "value": name},
                {"key": "tensor_shape", "value": f"{dtype}{_shape_text(shape)}"}]}
                for i, (name, shape, dtype) in enumerate(node.outputs)],
        })
    return {"id": graph.stage, "nodes": nodes,
            "groupNodeAttributes": {"": {"stage": graph.stage, "nodes": str(len(graph.nodes))}}}


def graph_collection(graphs: Sequence[StageGraph], label: str) -> dict[str, Any]:
    """Every stage in one collection (``graph_builder.GraphCollection``), in pipeline order in the selector."""
    return {"label": label, "graphs": [graph_json(g) for g in graphs]}


def node_data_json(overlay: Overlay) -> dict[str, Any]:
    """An overlay as Model Explorer's model node data (``node_data_builder.ModelNodeData``): per stage (graph id),
    the value of each node. Numbers are coloured on a gradient from the stage's smallest to its largest; text
    values one colour each. A value that is not a finite number or a string is left out (JSON has no NaN)."""
    out: dict[str, Any] = {}
    colours: dict[str, str] = {}
    for stage, values in overlay.values.items():
        results: dict[str, Any] = {}
        for node_id, value in values.items():
            if isinstance(value, str):
                colour = colours.setdefault(value, PALETTE[len(colours) % len(PALETTE)])
                results[node_id] = {"value": value, "bgColor": colour}
            elif isinstance(value, (int, float)) and math.isfinite(value):
                results[node_id] = {"value": value}
        if results:
            data: dict[str, Any] = {"name": overlay.name, "results": results}
            if any(not isinstance(r["value"], str) for r in results.values()):
                data["gradient"] = [dict(g) for g in GRADIENT]
            else:
                data["showExpandedSummaryOnGroupNode"] = True
            out[stage] = data
    return out


def sync_mapping(left: StageGraph, right: StageGraph) -> dict[str, Any]:
    """Model Explorer's sync-navigation mapping between two stages: the nodes of both sides joined through shared
    extracted sources, one entry per connected group (a node in two entries would keep only the last)."""
    parent: dict[tuple[int, str], tuple[int, str]] = {}

    def find(x: tuple[int, str]) -> tuple[int, str]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    by_source: dict[str, tuple[int, str]] = {}
    for side, graph in ((0, left), (1, right)):
        for node in graph.nodes:
            me = find((side, node.id))
            for source in node.sources:
                other = by_source.setdefault(source, me)
                parent[find(other)] = find(me)
    groups: dict[tuple[int, str], tuple[list[str], list[str]]] = {}
    for side, graph in ((0, left), (1, right)):
        for node in graph.nodes:
            if node.sources:
                groups.setdefault(find((side, node.id)), ([], []))[side].append(node.id)
    return {"mappingEntries": [{"leftNodeIds": lefts, "rightNodeIds": rights}
                               for lefts, rights in groups.values() if lefts and rights]}


def overlay_file_name(overlay: Overlay) -> str:
    """``overlays/<name>.json``: the overlay's name made a portable file name (``time (us)`` -> ``time_us``)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", overlay.name).strip("_").lower() or "overlay"


def write_explorer(graphs: Sequence[StageGraph], out_dir: str | Path, overlays: Sequence[Overlay] = (), *,
                   label: str = "model") -> list[Path]:
    """Write ``graphs.json``, ``overlays/*.json`` and ``sync/*.json`` into ``out_dir`` (made if missing, in an
    existing parent), each file whole or not at all; returns the paths, the graphs first."""
    out = make_output_dir(out_dir, "Model Explorer output directory")
    files = [(out / GRAPHS_FILE, graph_collection(graphs, label))]
    names: set[str] = set()
    for overlay in overlays:
        name = overlay_file_name(overlay)
        while name in names:
            name += "_"
        names.add(name)
        files.append((out / OVERLAY_DIR / f"{name}.json", node_data_json(overlay)))
    by_stage = {g.stage: g for g in graphs}
    pairs = list(zip(graphs, graphs[1:]))
    if "extracted" in by_stage and "compiled" in by_stage and len(graphs) > 2:
        pairs.append((by_stage["extracted"], by_stage["compiled"]))
    files += [(out / SYNC_DIR / f"{a.stage}__{b.stage}.json", sync_mapping(a, b)) for a, b in pairs]
    for path, data in files:
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, _dumps(data), what="Model Explorer file", replace_links=True)
    return [path for path, _ in files]


def serve(out_dir: str | Path, *, host: str = "localhost", port: int = 8080, open_browser: bool = True) -> None:
    """Start Model Explorer's local server on the files ``write_explorer`` wrote into ``out_dir``, with every
    overlay loaded as node data; blocks until interrupted. Raises ``ExplorerMissingError`` without the package."""
    try:
        import model_explorer
    except ImportError as e:
        raise ExplorerMissingError(f"Model Explorer is not installed: {INSTALL_HINT}; the files are in "
                                   f"{out_dir}") from e
    out = Path(out_dir)
    config = model_explorer.config().add_model_from_path(str(out / GRAPHS_FILE))
    for path in sorted((out / OVERLAY_DIR).glob("*.json")):
        config.add_node_data_from_path(str(path))
    model_explorer.visualize_from_config(config, host=host, port=port, no_open_in_browser=not open_browser)


def _dumps(data: Any) -> str:
    # compact: the 80-layer model's graphs stay a few MB; allow_nan=False: a NaN would make the file unreadable
    # to the browser's JSON.parse, so one slipping through is a bug to raise, not a broken file to write
    return json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _label(op: str) -> str:
    # aten.add.Tensor stays whole (the overload matters), aten.linear.default shows as aten.linear
    return op[:-len(".default")] if op.endswith(".default") else op


def _shape_text(shape: Sequence[Any]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _attr_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, allow_nan=True)
    return text if len(text) <= MAX_ATTR_CHARS else text[:MAX_ATTR_CHARS - 1] + "…"


__all__ = ["GRAPHS_FILE", "OVERLAY_DIR", "SYNC_DIR", "ExplorerMissingError", "graph_collection", "graph_json",
           "namespace_path", "node_data_json", "overlay_file_name", "serve", "sync_mapping", "write_explorer"]
