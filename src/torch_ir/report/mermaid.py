"""An IR as a Mermaid flowchart, readable on GitHub or in any Markdown viewer with Mermaid.

Graph inputs are parallelograms, nodes are boxes labelled with the short op name and output
shape, graph outputs are stadiums. Weights and constants are not drawn (a model has hundreds);
a node counts them in its label instead. A buffer the graph writes back (KV cache, running stat)
is drawn as a cylinder, read by solid edges and written by a dashed one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..ir import NPU_IR, OpNode, TensorMeta

_SAFE_ID = re.compile(r"[A-Za-z0-9_]+")
# Characters that end a quoted label or start markup in Mermaid; '#' first, as the codes use it.
_ENTITIES = {c: f"#{ord(c)};" for c in '#"<>&|`'}
_MORE = "more"


def to_mermaid(ir: NPU_IR, max_nodes: int = 200, *, highlight: Iterable[str] = ()) -> str:
    """A ``flowchart TD`` of ``ir``: one box per node, at most ``max_nodes`` of them.

    Example::

        print(to_mermaid(ir))  # for Linear(4, 8) then ReLU:
        # flowchart TD
        #     in_x[/"x<br/>float32[2,4]"/]
        #     n_linear["linear<br/>[2,8] +2 weights"]
        #     in_x --> n_linear
        #     n_relu["relu<br/>[2,8]"]
        #     ...

    Nodes past ``max_nodes`` are collapsed into one box that says how many there are; edges into
    and out of them attach to it. Mermaid ids are the IR names behind a prefix (``n_relu``), so a
    node named in a verification report can be found; ``highlight`` colours those nodes red.
    """
    chart = _Chart(ir)
    chart.inputs()
    chart.buffers()
    for node in ir.nodes[:max_nodes]:
        chart.node(node)
    hidden = ir.nodes[max_nodes:]
    if hidden:
        chart.collapse(hidden)
    chart.outputs()
    for name in highlight:
        if name in chart.node_ids:
            chart.lines.append(f"    style {chart.node_ids[name]} fill:#fdd,stroke:#c00,stroke-width:2px")
    return "\n".join(chart.lines)


class _Chart:
    """The lines of the chart and which Mermaid id stands for each tensor."""

    def __init__(self, ir: NPU_IR):
        self.ir = ir
        self.lines = ["flowchart TD", f"    %% {_one_line(ir.model_name)}: {len(ir.nodes)} nodes"]
        self.source: dict[str, str] = {}  # tensor name -> id of the box that produces it
        self.node_ids: dict[str, str] = {}  # node name -> its box
        self.edges: set[tuple[str, str]] = set()
        self.stored = {t.name for t in (*ir.weights, *ir.constants)} - set(ir.mutations)

    def inputs(self) -> None:
        for i, t in enumerate(self.ir.graph_inputs):
            box = _id("in", t.name, i)
            self.source[t.name] = box
            self.lines.append(f'    {box}[/"{escape(t.name)}<br/>{escape(_type(t))}"/]')

    def buffers(self) -> None:
        if not self.ir.mutations:
            return
        tensors: dict[str, TensorMeta] = {}  # what ir.tensor(name) finds, for all names at once (not a scan each)
        for t in self.ir.tensors():
            tensors.setdefault(t.name, t)
        for i, name in enumerate(self.ir.mutations):
            box = _id("buf", name, i)
            self.source[name] = box
            if name not in tensors:
                self.ir.tensor(name)  # raises the KeyError that names the IR, as before
            self.lines.append(f'    {box}[("{escape(name)}<br/>{escape(_type(tensors[name]))}")]')

    def node(self, node: OpNode) -> None:
        box = _id("n", node.name, len(self.node_ids))
        self.node_ids[node.name] = box
        self.lines.append(f'    {box}["{escape(node_label(node, self.stored))}"]')
        for t in node.inputs:
            if t.name in self.source:
                self.edge(self.source[t.name], box)
        for t in node.outputs:
            self.source[t.name] = box

    def collapse(self, hidden: list[OpNode]) -> None:
        self.lines.append(f'    {_MORE}[["{len(hidden)} more nodes not shown"]]')
        for node in hidden:
            for t in node.inputs:
                if t.name in self.source:
                    self.edge(self.source[t.name], _MORE)
            for t in node.outputs:
                self.source[t.name] = _MORE

    def outputs(self) -> None:
        for i, t in enumerate(self.ir.graph_outputs):
            box = f"out{i}"
            self.lines.append(f'    {box}(["output {i}: {escape(t.name)}<br/>{escape(_type(t))}"])')
            if t.name in self.source:
                self.edge(self.source[t.name], box)
        for buffer, value in self.ir.mutations.items():
            if value in self.source:
                self.lines.append(f"    {self.source[value]} -.->|writes| {self.source[buffer]}")

    def edge(self, src: str, dst: str) -> None:
        if src != dst and (src, dst) not in self.edges:  # one edge however often a value is read
            self.edges.add((src, dst))
            self.lines.append(f"    {src} --> {dst}")


def node_label(node: OpNode, stored: set[str]) -> str:
    """``"linear<br/>[2,8] +2 weights"``; the ``<br/>`` is Mermaid's line break, the rest is escaped."""
    shapes = " ".join(_shape(t) for t in node.outputs)
    weights = len({t.name for t in node.inputs if t.name in stored})
    extra = f" +{weights} weight{'s' if weights > 1 else ''}" if weights else ""
    return f"{short_op(node.op_type)}\n{shapes}{extra}"


def short_op(op_type: str) -> str:
    """``"aten.relu.default"`` -> ``"relu"``; other namespaces keep theirs: ``"my_ns.scaled_add"``."""
    parts = op_type.split(".")
    if len(parts) != 3:
        return op_type
    return parts[1] if parts[0] == "aten" else f"{parts[0]}.{parts[1]}"


def escape(text: str) -> str:
    """Text for a quoted Mermaid label: quotes, markup and pipes as entity codes, newlines as ``<br/>``."""
    return "".join(_ENTITIES.get(c, c) for c in text).replace("\n", "<br/>")


def _id(prefix: str, name: str, index: int) -> str:
    # the IR name where it is a plain identifier (searchable), else a counter; the prefix keeps
    # Mermaid keywords such as "end" from being ids
    return f"{prefix}_{name}" if _SAFE_ID.fullmatch(name) else f"{prefix}{index}"


def _shape(t: TensorMeta) -> str:
    return "[" + ",".join(str(d) for d in t.shape) + "]"


def _type(t: TensorMeta) -> str:
    return f"{t.dtype}{_shape(t)}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
