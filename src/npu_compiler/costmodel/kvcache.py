"""A KV cache read at its live length (see ``model``'s docstring): an attention kernel reading a cache costed
over the ``context`` positions live in the run, not the whole cache."""

from __future__ import annotations

from npu_program.kernels import KERNELS
from npu_program.program import CompiledProgram, Dispatch, TensorSpec

from .costs import CostModelError

#: Attention kernels, and for each tensor with an axis over the KV cache's positions when the kernel reads a cache:
#: (inputs or outputs, its index, that axis). Keys and values are [B, H, S, D]; masks and scores [..., T, S].
CACHE_AXES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "ATTENTION": (("in", 1, -2), ("in", 2, -2), ("in", 3, -1)),  # k and v rows, the mask's columns
    "ATTN_SCORE": (("in", 1, -2), ("in", 2, -1), ("out", 0, -1)),  # k rows, the mask's and the scores' columns
    "ATTN_OUTPUT": (("in", 0, -1), ("in", 1, -2)),  # the scores' columns, v rows
    # a quantized cache (npu_compiler.kvcache): k and v codes' rows, their scales, the mask's columns
    "KVQ_ATTENTION": (("in", 1, -2), ("in", 2, -1), ("in", 3, -2), ("in", 4, -1), ("in", 5, -1)),
}


def kv_cache_length(program: CompiledProgram) -> int | None:
    """The positions a program's KV cache holds: the length of the state slots KV_UPDATE writes, along the axis
    it writes (None for a program without a KV cache)."""
    slots = {s.name: s for s in program.state_specs}
    lengths = []
    for d in program.dispatches:
        if _writes_state(d) and d.outputs and d.outputs[0] in slots:
            shape = slots[d.outputs[0]].shape
            axis = d.params.get("dim", 2)
            if isinstance(axis, int) and -len(shape) <= axis < len(shape):
                lengths.append(int(shape[axis]))
    return max(lengths, default=None)


def _writes_state(d: Dispatch) -> bool:
    """A KV_UPDATE, or any kernel whose record says it writes a state slot in place."""
    record = KERNELS.get(d.kernel)
    return d.host is None and record is not None and record.writes_state


def _check_context(program: CompiledProgram, context: int | None, length: int | None) -> None:
    if context is None:
        return
    if isinstance(context, bool) or not isinstance(context, int):
        raise CostModelError(f"context {context!r} is not a whole number; fix: give the live KV-cache positions")
    if length is None:
        raise CostModelError(f"context {context}: program {program.model_name!r} has no KV cache; fix: give a "
                             "context only for an LLM (its prefill and decode programs)")
    if not 1 <= context <= length:
        raise CostModelError(f"context {context} is outside the KV cache of program {program.model_name!r}, which "
                             f"holds {length} positions; fix: give a context from 1 to {length}")


def _at_live_length(d: Dispatch, ins: list[TensorSpec], outs: list[TensorSpec], caches: set[str], context: int
                    ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """``d``'s tensors as an attention kernel reading a KV cache at ``context`` live positions sees them: the rows
    past the live length hold nothing yet (the mask hides them), so a kernel that knows the length reads,
    multiplies and writes over the live ones only. A run's own tokens (q's rows) are always live."""
    axes = CACHE_AXES.get(d.kernel)
    cache = next((ins[i] for i, name in enumerate(d.inputs) if name in caches), None)
    if axes is None or cache is None or len(cache.shape) < 2 or len(ins[0].shape) < 2:
        return ins, outs
    length = int(cache.shape[-2])
    live = min(length, max(context, int(ins[0].shape[-2])))
    tensors = {"in": list(ins), "out": list(outs)}
    for side, i, axis in axes:
        if i < len(tensors[side]) and len(tensors[side][i].shape) >= -axis \
                and int(tensors[side][i].shape[axis]) == length:
            tensors[side][i] = _cut(tensors[side][i], axis, live)
    return tensors["in"], tensors["out"]


def _cut(t: TensorSpec, axis: int, size: int) -> TensorSpec:
    """``t`` with ``axis`` cut to ``size``."""
    shape = list(t.shape)
    shape[axis] = size
    return TensorSpec(t.name, shape, t.dtype, t.layout)
