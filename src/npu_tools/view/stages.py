"""One model as graphs of every pipeline stage, with the same node identities: what the viewers draw.

``pipeline_graphs(ir)`` gives four ``StageGraph``s: the extracted IR, the normalized IR (NPU ops), the
kernel-fused IR and the compiled program's dispatches. Every node carries ``sources``, the names of the
extracted-IR nodes it computes (its provenance, ``torch_ir.ir.core.Provenance.nodes``), so a value known for
one node (a dispatch's cycles, an extracted node's error) can be shown on the nodes of every other stage
(``npu_tools.view.overlays``), and ``namespace``, the model's module path (``layers.3.self_attn``), by which a
viewer folds a transformer into its blocks.

Plain data: the Model Explorer writer (``npu_tools.view.explorer``) and the HTML report (``npu_tools.view.report``)
read these and nothing of the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from npu_program.program import CompiledProgram
from torch_ir.ir import NPU_IR, OpNode
from torch_ir.ir.core import provenance_of

#: The stages, in pipeline order.
STAGES = ("extracted", "normalized", "fused", "compiled")


@dataclass
class GraphNode:
    """One node of a stage: an IR node, or a dispatch of the compiled program."""

    id: str
    op: str
    namespace: str  # the module path, "" at the top
    inputs: list[str]  # ids of the nodes whose outputs it reads (graph inputs and weights are not nodes)
    outputs: list[tuple[str, list[Any], str]]  # (tensor name, shape, dtype)
    attrs: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # extracted-IR node names (provenance)
    rules: list[str] = field(default_factory=list)  # the rewrite rules that made it


@dataclass
class StageGraph:
    stage: str
    nodes: list[GraphNode]
    inputs: list[tuple[str, list[Any], str]] = field(default_factory=list)  # the graph's inputs


def ir_graph(ir: NPU_IR, stage: str) -> StageGraph:
    """An IR as a stage graph: one node per IR node, an edge per tensor read from another node."""
    producer = {t.name: n.name for n in ir.nodes for t in n.outputs}
    nodes = [GraphNode(n.name, n.op_type, _namespace(n), _readers(n, producer), _outputs(n), dict(n.attrs),
                       list(provenance_of(n).nodes), list(provenance_of(n).rules)) for n in ir.nodes]
    return StageGraph(stage, nodes, [(t.name, list(t.shape), t.dtype) for t in ir.graph_inputs])


def program_graph(program: CompiledProgram) -> StageGraph:
    """The compiled program as a stage graph: one node per dispatch (``d<index>``), an edge per activation or
    state slot a dispatch reads that an earlier one wrote."""
    producer: dict[str, str] = {}
    nodes = []
    for i, d in enumerate(program.dispatches):
        node_id = f"d{i}"
        prov = d.provenance
        attrs = {**d.params, **({"host": d.host} if d.host else {}), **({"at_bind": True} if d.at_bind else {})}
        outputs = [(name, list(program.tensors[name].shape), program.tensors[name].dtype)
                   for name in d.outputs if name in program.tensors]
        nodes.append(GraphNode(node_id, d.kernel, (prov.module or "") if prov else "",
                               sorted({producer[n] for n in d.inputs if n in producer}), outputs, attrs,
                               list(prov.nodes) if prov else [d.node], list(prov.rules) if prov else []))
        for name in d.outputs:
            producer[name] = node_id
    return StageGraph("compiled", nodes, [(s.name, list(s.shape), s.dtype) for s in program.input_specs])


def ir_stages(ir: NPU_IR) -> tuple[list[StageGraph], NPU_IR]:
    """The graphs of the three IR stages (extracted, normalized, kernel-fused) and the kernel-fused IR."""
    from npu_compiler.passes import normalize
    from npu_compiler.passes.kernel_fusion import fuse_kernels

    normalized = normalize(ir)
    fused = fuse_kernels(normalized)
    return [ir_graph(ir, "extracted"), ir_graph(normalized, "normalized"), ir_graph(fused, "fused")], fused


def compile_fused(fused: NPU_IR) -> CompiledProgram:
    """The kernel-fused IR compiled without normalizing or fusing it again, for the CPU target with host fallback."""
    from npu_compiler import CompileOptions, compile

    return compile(fused, options=CompileOptions(normalize=False, fuse=False), fallback="cpu")


def pipeline_graphs(ir: NPU_IR, *, compile_ir: Callable[[NPU_IR], CompiledProgram] | None = None,
                    ) -> tuple[list[StageGraph], CompiledProgram]:
    """The four stage graphs of an extracted IR and the compiled program; a stage that fails raises its own error
    (a compile error names the nodes). ``compile_ir`` compiles the kernel-fused IR (default ``compile_fused``)."""
    graphs, fused = ir_stages(ir)
    program = (compile_ir or compile_fused)(fused)
    return [*graphs, program_graph(program)], program


def _namespace(node: OpNode) -> str:
    return provenance_of(node).module or ""


def _readers(node: OpNode, producer: dict[str, str]) -> list[str]:
    return sorted({producer[t.name] for t in node.inputs if t.name in producer})


def _outputs(node: OpNode) -> list[tuple[str, list[Any], str]]:
    return [(t.name, list(t.shape), t.dtype) for t in node.outputs]


__all__ = ["STAGES", "GraphNode", "StageGraph", "compile_fused", "ir_graph", "ir_stages", "pipeline_graphs",
           "program_graph"]
