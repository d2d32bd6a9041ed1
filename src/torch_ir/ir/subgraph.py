"""Some nodes of an IR as a graph of their own: a partition of the DAG, the faulty group of a repro."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from .core import NPU_IR, OpNode, TensorMeta


def subgraph(ir: NPU_IR, nodes: Sequence[OpNode], *, name: str, outputs: Collection[str] | None = None,
             metadata: dict[str, Any] | None = None) -> NPU_IR:
    """``nodes`` (a subset of ``ir.nodes``, in its order) as an IR: the activations they read and do not make
    become graph inputs; weights and constants stay weights and constants, with their state-dict keys, aliases,
    values and rebuild recipes. ``outputs`` names the tensors it returns; None: those that other nodes, the
    graph's outputs or a buffer mutation read (for a group nothing else reads, what no node of it reads)."""
    chosen = {n.name for n in nodes}
    made = {t.name for n in nodes for t in n.outputs}
    params = {t.name for t in [*ir.weights, *ir.constants]}
    inputs: dict[str, TensorMeta] = {}
    for node in nodes:
        for t in node.inputs:
            if t.name not in made and t.name not in params:
                inputs.setdefault(t.name, replace(t, role="input", shape=list(t.shape)))
    read = {t.name for n in nodes for t in n.inputs}
    if outputs is None:
        outputs = {t.name for n in ir.nodes if n.name not in chosen for t in n.inputs}
        outputs |= {t.name for t in ir.graph_outputs} | set(ir.mutations.values())
        if not made & outputs:  # a dead group: what none of its own nodes reads
            outputs = made - read
    used = read | made
    weights = [t for t in ir.weights if t.name in used]
    constants = [t for t in ir.constants if t.name in used]
    keys = {ir.weight_name_mapping.get(t.name, t.name) for t in weights}
    constant_names = {t.name for t in constants}
    return NPU_IR(
        model_name=name,
        graph_inputs=list(inputs.values()),
        graph_outputs=[t for n in nodes for t in n.outputs if t.name in outputs],
        weights=weights,
        nodes=list(nodes),
        weight_name_mapping={t.name: ir.weight_name_mapping[t.name] for t in weights
                             if t.name in ir.weight_name_mapping},
        weight_aliases={k: list(v) for k, v in ir.weight_aliases.items() if k in keys},
        constants=constants,
        constant_values={k: v for k, v in ir.constant_values.items() if k in constant_names},
        symbols={k: dict(v) for k, v in ir.symbols.items()},
        non_persistent_buffers={k: v for k, v in ir.non_persistent_buffers.items() if k in keys},
        inlined_constant_keys={k: v for k, v in ir.inlined_constant_keys.items() if k in constant_names},
        producer=dict(ir.producer),
        metadata=dict(metadata or {}),
    )


__all__ = ["subgraph"]
