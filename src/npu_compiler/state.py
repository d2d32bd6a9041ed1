"""Buffers an IR writes in place (``ir.mutations``) become the program's *state slots*.

An LLM exported with a static KV cache (``torch_ir.frontends.hf.StaticCacheLM``) reads each cache as a
buffer and writes it with ``KV_UPDATE`` (``index_copy``); the IR records the new value in
``ir.mutations`` (buffer -> the tensor holding its new value). In the program the cache is a
``StateSpec``: it lives outside the arena in an ``npu_runtime.State`` that survives from one run to the
next and that the prefill and decode programs share (``shared_key`` = the buffer's state-dict key). The
KV_UPDATE dispatch writes the slot in place, and every later reader of the new value reads the slot.

Only that shape of write is compiled: the new value made by one KV_UPDATE of the buffer, with nothing
reading the old value afterwards (an in-place write would change what it reads). Any other mutation
(batch-norm running statistics, a step counter) is refused with the node that makes it.
"""

from __future__ import annotations

from npu_program.kernels import KERNELS, kernels_where
from npu_program.program import StateSpec
from torch_ir.ir import NPU_IR, OpNode

from .errors import CompileError
from .lower import spec_of


def writes_state(node: OpNode) -> bool:
    """Whether ``node``'s kernel writes its first inputs in place (output i into input i), so may write state slots
    (its record's ``writes_state``: KV_UPDATE, KVQ_UPDATE)."""
    record = KERNELS.get(node.op_type)
    return record is not None and record.writes_state


def _state_writers() -> str:
    return " or ".join(sorted(kernels_where(writes_state=True), key=lambda k: (len(k), k)))  # KV_UPDATE first


def state_slots(ir: NPU_IR) -> dict[str, str]:
    """Tensor holding a buffer's new value -> the buffer (its state slot); raises ``CompileError`` for a
    mutation the program cannot carry (see the module docstring)."""
    weights = {w.name for w in ir.weights}
    producer = {t.name: (i, n) for i, n in enumerate(ir.nodes) for t in n.outputs}
    outputs = {t.name for t in ir.graph_outputs}
    slots: dict[str, str] = {}
    for buffer, value in sorted(ir.mutations.items()):
        where = f"IR {ir.model_name!r} writes buffer {buffer!r}"
        index, node = producer.get(value, (None, None))
        if buffer not in weights or node is None:
            raise CompileError(f"{where} with {value!r}, which no node computes; the IR is inconsistent: "
                               "re-extract the model")
        position = next(i for i, t in enumerate(node.outputs) if t.name == value)  # output i writes input i
        if not writes_state(node) or position >= len(node.inputs) or node.inputs[position].name != buffer:
            raise CompileError(
                f"{where} through {node.op_type} (node {node.name!r}); programs carry state only as a KV cache "
                f"written in place by {_state_writers()} (index_copy into the buffer). Run the graph with "
                "torch_ir.IRExecutor, or keep the buffer out of forward()'s writes (eval mode for batch norm).")
        late = [n.name for n in ir.nodes[index + 1:] if any(t.name == buffer for t in n.inputs)]
        if late:
            raise CompileError(f"{where} in place with node {node.name!r}, but {late[0]!r} reads the old value "
                               "afterwards; an in-place write would change what it reads")
        if value in outputs:
            raise CompileError(f"{where} and returns its new value {value!r}; programs keep state inside: "
                               "return what is computed from it instead")
        slots[value] = buffer
    return slots


def state_specs(ir: NPU_IR, slots: dict[str, str]) -> list[StateSpec]:
    """The program's state slots, keyed for sharing by the buffer's state-dict key."""
    buffers = {w.name: w for w in ir.weights}
    specs = []
    for buffer in sorted(set(slots.values())):
        spec = spec_of(buffers[buffer])
        specs.append(StateSpec(buffer, spec.shape, spec.dtype, shared_key=ir.weight_name_mapping.get(buffer, buffer)))
    return specs


__all__ = ["state_slots", "state_specs", "writes_state"]
