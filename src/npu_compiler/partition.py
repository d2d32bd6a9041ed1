"""``partition``: split a graph into NPU parts and CPU parts, for ``npu_runtime.DAGExecutor``.

Each node is placed on the NPU when the predicate accepts its op type *and* the target can run it
(dtypes, static shapes); otherwise on the CPU, with the reason. Nodes are then grouped so that every
path through the graph switches device as few times as possible: a node's *level* is the number of
device switches on the longest path that reaches it, and the nodes of one level and device form one
partition. A partition only reads graph inputs and outputs of lower levels, so running partitions in
order of level is a valid schedule, and no two partitions of one device at one level exist to merge.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from npu_compiler.passes import normalize as normalize_ir
from npu_program.program import CompiledProgram
from torch_ir.ir import NPU_IR, OpNode, subgraph

from .compiler import CompileError, CompileOptions, IRSource, compile, load_source, with_public_output_names
from .cost import node_flops
from .library import Target, get_target, is_op_supported, unsupported_reason

NPU, CPU = "npu", "cpu"


@dataclass
class Placement:
    node: str
    op: str
    device: str  # "npu" or "cpu"
    flops: int
    reason: str | None = None  # why a CPU node is on the CPU


@dataclass
class Partition:
    """A connected run of the graph on one device: a sub-IR whose inputs come from outside it."""

    index: int
    device: str
    ir: NPU_IR
    level: int
    #: The compiled program of an NPU part (``PartitionPlan.compiled``); None for a CPU part or until compiled.
    program: CompiledProgram | None = None

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.ir.nodes]

    @property
    def inputs(self) -> list[str]:
        return [t.name for t in self.ir.graph_inputs]

    @property
    def outputs(self) -> list[str]:
        return [t.name for t in self.ir.graph_outputs]


@dataclass
class PartitionPlan:
    """The partitions in execution order, the placement of every node, and the (normalized) whole IR."""

    ir: NPU_IR
    target: str
    partitions: list[Partition]
    placements: list[Placement]
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The NPU description whose kernel list the target was narrowed to (``Target.described_in``), or "".
    described_in: str = ""

    def totals(self) -> dict[str, dict[str, int]]:
        """``{"npu": {"nodes": .., "flops": ..}, "cpu": {...}}``."""
        out = {d: {"nodes": 0, "flops": 0} for d in (NPU, CPU)}
        for p in self.placements:
            out[p.device]["nodes"] += 1
            out[p.device]["flops"] += p.flops
        return out

    def cpu_placements(self) -> list[Placement]:
        return [p for p in self.placements if p.device == CPU]

    def summary(self) -> str:
        """The placement summary: nodes and FLOPs per device, why each CPU node is there, the partitions."""
        totals = self.totals()
        all_flops = sum(t["flops"] for t in totals.values()) or 1
        kinds = {d: sum(1 for p in self.partitions if p.device == d) for d in (NPU, CPU)}
        where = (f"the NPU described in {self.described_in} (its parts run by target {self.target!r})"
                 if self.described_in else f"target {self.target!r}")
        lines = [f"placement of {self.ir.model_name!r} on {where}: {len(self.placements)} nodes, "
                 f"{len(self.partitions)} partitions (NPU {kinds[NPU]}, CPU {kinds[CPU]})",
                 f"  {'':<4} {'nodes':>6} {'MFLOPs':>12} {'share':>7}"]
        for d in (NPU, CPU):
            t = totals[d]
            lines.append(f"  {d.upper():<4} {t['nodes']:>6} {t['flops'] / 1e6:>12.2f} {t['flops'] / all_flops:>7.1%}")
        cpu = self.cpu_placements()
        if cpu:
            lines.append("CPU nodes and why:")
            lines += [f"  {p.node} ({p.op}): {p.reason}" for p in cpu]
        lines.append("partitions, in execution order:")
        for part in self.partitions:
            lines.append(f"  {part.index}: {part.device.upper()} {len(part.nodes)} nodes; reads "
                         f"{_names(part.inputs)}; gives {_names(part.outputs)}")
        return "\n".join(lines)

    def compiled(self, target: str) -> PartitionPlan:
        """This plan with every NPU part's program compiled for ``target``: what ``npu_runtime.DAGExecutor``
        runs, so that the runtime need not import the compiler. A plan made for another target (seed 004's
        ``partition(ir, is_op_supported)``, target cpu, given to ``DAGExecutor(plan, MetalBackend())``) is placed
        again for ``target`` first, with a warning; nodes the first plan kept off the NPU stay off it."""
        plan = self if target == self.target else self._placed_for(target)
        options = CompileOptions(normalize=False, public_output_names=False)
        for part in plan.partitions:
            if part.device == NPU and (part.program is None or part.program.target != target):
                part.program = compile(part.ir, target=target, options=options)
        return plan

    def _placed_for(self, target: str) -> PartitionPlan:
        refused = {p.node for p in self.placements if p.device != NPU}
        kept_off = {n.op_type for n in self.ir.nodes if n.name in refused}
        warnings.warn(f"the partition plan of {self.ir.model_name!r} was made for target {self.target!r}; placed "
                      f"again for {target!r} (partition(..., target={target!r}) avoids this)", stacklevel=4)
        return partition(self.ir, lambda op: is_op_supported(op, target) and op not in kept_off, target=target,
                         normalize=False, public_output_names=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.ir.model_name, "target": self.target,
            **({"described_in": self.described_in} if self.described_in else {}), "totals": self.totals(),
            "placements": [vars(p) for p in self.placements],
            "partitions": [{"index": p.index, "device": p.device, "level": p.level, "nodes": p.nodes,
                            "inputs": p.inputs, "outputs": p.outputs} for p in self.partitions],
        }


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "nothing"


def partition(ir_dict_or_ir: IRSource, is_op_supported: Callable[[str], bool], *, target: str | Target = "cpu",
              normalize: bool = True, public_output_names: bool = True) -> PartitionPlan:
    """Split the IR (an ``NPU_IR``, its JSON dict or a path) into NPU and CPU partitions.

    ``is_op_supported(op_type) -> bool`` decides which ops may go to the NPU: the kernel library's own
    ``npu_compiler.is_op_supported`` or any user predicate (which can only narrow what the target runs).
    ``target`` may be an NPU's own kernel list: ``target_for_hardware(load_hardware("my_npu.toml"))`` places
    what its ``[kernels] supported`` list leaves out on the CPU, saying so.
    The IR is normalized first (so that ops are NPU ops), as ``compile`` does.
    """
    target = get_target(target)
    ir = load_source(ir_dict_or_ir)
    written_inputs = sorted(set(ir.mutations) & {t.name for t in ir.graph_inputs})
    if written_inputs:
        raise CompileError(f"IR {ir.model_name!r} writes its inputs in place ({', '.join(written_inputs)}); "
                           "partitioned execution does not write back into inputs")
    if ir.mutations:
        raise CompileError(f"IR {ir.model_name!r} writes buffers in place ({', '.join(sorted(ir.mutations))}); "
                           "partitioned execution does not carry buffer mutations yet")
    if normalize:
        ir = normalize_ir(ir)
    if public_output_names:
        ir = with_public_output_names(ir)
    placements = [_place(node, is_op_supported, target) for node in ir.nodes]
    levels = _levels(ir, placements)
    parts = _partitions(ir, placements, levels)
    return PartitionPlan(ir, target.name, parts, placements, described_in=target.described_in)


def _place(node: OpNode, predicate: Callable[[str], bool], target: Target) -> Placement:
    flops = node_flops(node)
    reason = unsupported_reason(node, target)
    if reason is None and not predicate(node.op_type):
        name = getattr(predicate, "__name__", type(predicate).__name__)
        reason = f"the predicate {name} rejected {node.op_type}"
    return Placement(node.name, node.op_type, CPU if reason else NPU, flops, reason)


def _levels(ir: NPU_IR, placements: list[Placement]) -> list[int]:
    """Device switches on the longest path reaching each node."""
    producer: dict[str, int] = {}
    levels: list[int] = []
    for i, node in enumerate(ir.nodes):
        level = 0
        for t in node.inputs:
            j = producer.get(t.name)
            if j is not None:
                level = max(level, levels[j] + (placements[j].device != placements[i].device))
        levels.append(level)
        for t in node.outputs:
            producer[t.name] = i
    return levels


def _partitions(ir: NPU_IR, placements: list[Placement], levels: list[int]) -> list[Partition]:
    groups: dict[tuple[int, str], list[OpNode]] = {}
    for node, place, level in zip(ir.nodes, placements, levels):
        groups.setdefault((level, place.device), []).append(node)
    order = sorted(groups, key=lambda key: (key[0], key[1] != NPU))
    needed_later = _readers_outside(ir, groups)
    return [Partition(i, device, subgraph(ir, groups[(level, device)], name=f"{ir.model_name}.part{i}",
                                          outputs=needed_later[(level, device)],
                                          metadata={"partition_of": ir.model_name}), level)
            for i, (level, device) in enumerate(order)]


def _readers_outside(ir: NPU_IR, groups: dict[tuple[int, str], list[OpNode]]) -> dict[tuple[int, str], set[str]]:
    """For each group, the tensors it defines that another group or the graph's outputs read."""
    owner = {t.name: key for key, nodes in groups.items() for n in nodes for t in n.outputs}
    needed: dict[tuple[int, str], set[str]] = {key: set() for key in groups}
    for key, nodes in groups.items():
        for n in nodes:
            for t in n.inputs:
                if owner.get(t.name, key) != key:
                    needed[owner[t.name]].add(t.name)
    for t in ir.graph_outputs:
        if t.name in owner:
            needed[owner[t.name]].add(t.name)
    return needed
