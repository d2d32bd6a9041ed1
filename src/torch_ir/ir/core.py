"""The IR: three small data classes and nothing else.

Serialization lives in ``serialize.py``, checking in ``validate.py``; the frontends build these
objects, the executor and the passes read them. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..quant.spec import QuantSpec

Dim = int | str  # an int, or the name of a symbol (``"s0"``) or an expression of symbols (``"2*s0"``)

#: Roles a tensor can play. ``kv`` is a buffer the graph writes back (a KV cache, a running stat).
ROLES = ("input", "weight", "embedding", "buffer", "constant", "activation", "kv", "output")


@dataclass
class TensorMeta:
    """Shape and dtype of one named value; never the data itself."""

    name: str
    shape: list[Dim]
    dtype: str  # torch's name without the prefix: "float32", "int64", "bool", ...
    role: str | None = None
    layout: str | None = None  # e.g. "NCHW", "[B,T,H]"; filled by passes that can infer it
    quant: QuantSpec | None = None  # a quantized tensor: its type, scales and zero points (torch_ir.quant)
    bits: int | None = None  # the width the tensor table plans for it (seed 003's qbits; annotate), or its spec's

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        """Element count, or None when a dimension is symbolic."""
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                return None
            n *= d
        return n

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"%{self.name}:{self.dtype}[{dims}]"


@dataclass
class Provenance:
    """Where a node came from, kept through every pass so a wrong value can be traced to its cause.

    ``nodes`` are the nodes of the extracted IR this node computes (a fused GEMM + ReLU lists both);
    ``module`` is the model's module path when the frontend knows it; ``origin`` is the frontend step that
    made the extracted node (``"torch.export"``, ``"onnx:Gemm torch_ir.frontends.onnx.converters.nn.gemm"``,
    ``"tinygrad:ADD"``); ``rules`` are the rewrite rules that made it, in order, the last one made this node.
    """

    nodes: list[str]
    module: str | None = None
    origin: str | None = None
    rules: list[str] = field(default_factory=list)


@dataclass
class OpNode:
    """One operation. ``attrs`` holds the non-tensor arguments by their schema name.

    A tensor-list argument (``aten.cat``'s ``tensors``) appears in ``attrs`` as a list of indices
    into ``inputs`` (``None`` for an absent optional entry), so ``inputs`` stays a flat list.
    """

    name: str
    op_type: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    attrs: dict[str, Any] = field(default_factory=dict)
    # None: the node is its own source, as extracted by a frontend that records none (see ``provenance_of``)
    provenance: Provenance | None = None

    def __str__(self) -> str:
        outs = ", ".join(str(t) for t in self.outputs)
        ins = ", ".join(f"%{t.name}" for t in self.inputs)
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())
        sep = ", " if ins and attrs else ""
        return f"{outs} = {self.op_type}({ins}{sep}{attrs})"


def provenance_of(node: OpNode) -> Provenance:
    """The node's provenance; a node without one is its own source."""
    return node.provenance or Provenance(nodes=[node.name])


def merged_provenance(nodes: list[OpNode], rule: str) -> Provenance:
    """The provenance of a node that ``rule`` made from ``nodes`` (the ones it replaces, root first): all their
    source nodes, the module that holds all of theirs (``layers.0.self_attn`` for its q, k and v projections),
    and the rules that made them followed by ``rule``."""
    parts = [provenance_of(n) for n in nodes]
    sources = list(dict.fromkeys(s for p in parts for s in p.nodes))
    rules = list(dict.fromkeys(r for p in parts for r in p.rules if r != rule)) + [rule]
    origin = next((p.origin for p in parts if p.origin), None)
    return Provenance(nodes=sources, module=_common_module([p.module for p in parts if p.module]), origin=origin,
                      rules=rules)


def _common_module(paths: list[str]) -> str | None:
    """The longest dotted prefix of ``paths`` (the first path when they share none)."""
    if not paths:
        return None
    common = paths[0].split(".")
    for path in paths[1:]:
        parts = path.split(".")
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common) or paths[0]


@dataclass
class NPU_IR:  # noqa: N801 - the seed's name, kept so the seeds' code runs as written
    """A whole graph: inputs, weights, constants, nodes in topological order, outputs."""

    model_name: str
    graph_inputs: list[TensorMeta]
    graph_outputs: list[TensorMeta]
    weights: list[TensorMeta]
    nodes: list[OpNode]
    weight_name_mapping: dict[str, str] = field(default_factory=dict)  # IR name -> state-dict key
    weight_aliases: dict[str, list[str]] = field(default_factory=dict)  # state-dict key -> tied keys
    constants: list[TensorMeta] = field(default_factory=list)
    constant_values: dict[str, Any] = field(default_factory=dict)  # name -> nested list (small ones)
    symbols: dict[str, dict[str, Any]] = field(default_factory=dict)  # "s0" -> {min, max[, expr]}
    # buffer (weight) name, or graph input written in place (1.1), -> the tensor holding its new value
    mutations: dict[str, str] = field(default_factory=dict)
    # state-dict key of each non-persistent buffer -> how to rebuild its value without weights, or None (1.1)
    non_persistent_buffers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # inline constant's name -> the key it was lifted from (``lifted_tensor_0``, ``head.anchors``) (1.1)
    inlined_constant_keys: dict[str, str] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    # -- lookups -------------------------------------------------------------------------------
    def tensors(self) -> Iterator[TensorMeta]:
        """Every defined tensor once: inputs, weights, constants, then node outputs."""
        yield from self.graph_inputs
        yield from self.weights
        yield from self.constants
        for node in self.nodes:
            yield from node.outputs

    def tensor(self, name: str) -> TensorMeta:
        for t in self.tensors():
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in IR {self.model_name!r}")

    def node(self, name: str) -> OpNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in IR {self.model_name!r}")

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.op_type] = hist.get(n.op_type, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- I/O (thin wrappers so ``ir.save(path)`` reads as in the seeds) ---------------------------
    def save(self, path: str, *, indent: int | None = None) -> None:
        from .serialize import save_ir

        save_ir(self, path, indent=indent)

    def to_dict(self) -> dict[str, Any]:
        from .serialize import ir_to_dict

        return ir_to_dict(self)

    # -- text form ---------------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.model_name}("]
        lines += [f"    {t}," for t in self.graph_inputs]
        lines.append(f") weights={len(self.weights)} constants={len(self.constants)} {{")
        lines += [f"  {n.name}: {n}" for n in self.nodes]
        for buf, val in self.mutations.items():
            lines.append(f"  %{buf} <- %{val}")
        lines.append(f"  return ({', '.join('%' + t.name for t in self.graph_outputs)})")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"NPU_IR(model_name={self.model_name!r}, nodes={len(self.nodes)}, "
            f"inputs={len(self.graph_inputs)}, outputs={len(self.graph_outputs)}, "
            f"weights={len(self.weights)})"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
