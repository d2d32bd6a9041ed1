"""An LLM's prefill as shape buckets: one static program per prompt length bucket, sharing weights and the cache.

``compile_lm`` compiles the prefill for several sequence lengths (the buckets, default: the chunk doubled up to
the cache length) into one ``npu_program.DynamicProgram``, so a prompt of any length up to the largest bucket
runs in one call of the smallest bucket that holds it (``npu_runtime.Generator`` pads it).

Padding a prompt needs the logits of the last *real* token, not of the last row. An IR from ``extract_lm``
computes the logits of the last row only (the vocabulary projection of every row would be ``bucket x vocab``
floats: 2.4 GiB for Qwen2.5's 151,936-token vocabulary at a 4,096-token bucket, twenty times the rest of that
variant's arena). So the prefill's "last row" slice is rewritten here (``select_prompt_row``) into the row where
``cache_position`` is largest: the generator gives the padded rows the prompt's first position, which leaves
the last real token the one largest. The padded rows' positions matter to nothing else: such an IR writes
the cache at ``cache_position[0] + arange(seq)`` and masks by the same (checked here before rewriting), so a
position only sets its own row's rotary phase, and the padded rows' keys and values land after the prompt, where
the causal mask hides them from every real token and the next run overwrites them before anything reads them.
An IR that computes the logits of every row is left as it is (the generator reads the row it needs); one whose
cache writes read other positions is left as it is too, and the generator runs it as before (no padding).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from npu_program.dynamic import DynamicProgram, SymbolPadding
from npu_program.lm import ROW_AT_LARGEST_POSITION
from npu_program.program import CompiledProgram
from torch_ir.ir import NPU_IR, OpNode, TensorMeta

from .dynamic import Buckets, compile_dynamic
from .errors import CompileError

#: The most arena (activation memory) the default buckets may give their largest variant. The arena grows
#: with the bucket (about 30 KiB a token for a Qwen2.5-0.5B: 122 MiB at 4,096 tokens, the attention fused and
#: the logits of one row), so the cap only cuts the default list for large models and long caches; buckets given
#: explicitly are compiled as given.
PREFILL_ARENA_CAP = 1 << 30

_SLICE = "aten.slice.Tensor"
_WHOLE = 2 ** 62  # an ``end`` at least this large is "to the end" (torch.export writes INT64_MAX)


def default_buckets(chunk: int, max_cache_len: int) -> list[int]:
    """``chunk``, doubled while it fits the cache: 16, 32, ..., up to ``max_cache_len``."""
    sizes = [chunk]
    while sizes[-1] * 2 <= max_cache_len:
        sizes.append(sizes[-1] * 2)
    return sizes


def check_buckets(buckets: Sequence[int], max_cache_len: int, model: str) -> list[int]:
    """The bucket sizes sorted, each a whole number from 1 to the cache length; else a ``CompileError``."""
    sizes = sorted({int(b) for b in buckets})
    bad = [b for b in sizes if not 1 <= b <= max_cache_len]
    if not sizes or bad:
        raise CompileError(f"IR {model!r}: prefill bucket {bad[0] if bad else '(none)'} must be between 1 and the "
                           f"cache length {max_cache_len} (prefill_buckets / --prefill-buckets): give token counts "
                           "in that range, or extract with a longer cache")
    return sizes


def compile_prefill(ir: NPU_IR, seq: str, buckets: Sequence[int] | None, chunk: int, max_cache_len: int,
                    compile_one: Callable[[NPU_IR], CompiledProgram]) -> DynamicProgram:
    """The prefill of ``ir`` as a dynamic program over ``seq``: for ``buckets``, or, when None, for the default
    buckets from ``chunk`` whose arena stays within ``PREFILL_ARENA_CAP`` (the smallest is always kept)."""
    prefill_ir = select_prompt_row(ir, seq) or ir
    compiled: dict[int, CompiledProgram] = {}
    if buckets is None:
        sizes = []
        for size in default_buckets(chunk, max_cache_len):
            compiled[size] = _compile_at(prefill_ir, seq, size, compile_one)
            if sizes and compiled[size].arena_bytes > PREFILL_ARENA_CAP:
                break
            sizes.append(size)
    else:
        sizes = check_buckets(buckets, max_cache_len, ir.model_name)

    def one(specialized: NPU_IR) -> CompiledProgram:  # the variants compiled while choosing the buckets, reused
        size = int(next(t for t in specialized.graph_inputs if t.name == "input_ids").shape[1])
        return compiled.pop(size) if size in compiled else compile_one(specialized)

    # an LLM writes its cache: the generic runtime never pads it (the generator pads, see the module docstring)
    program = compile_dynamic(prefill_ir, Buckets({seq: sizes}, padding=False), one)
    program.padding[seq] = SymbolPadding(reason="the model writes its KV cache; npu_runtime.Generator pads a prompt "
                                                "itself (see npu_compiler.llm_prefill)")
    row = ROW_AT_LARGEST_POSITION if prefill_ir is not ir else None
    for variant in program.variants:
        variant.program.metadata["llm"] = {"phase": "prefill", "tokens": variant.sizes[seq],
                                           "max_cache_len": max_cache_len, "logits_row": row}
    program.metadata["llm"] = {"phase": "prefill", "buckets": sizes, "max_cache_len": max_cache_len,
                               "logits_row": row}
    return program


def _compile_at(ir: NPU_IR, seq: str, size: int, compile_one: Callable[[NPU_IR], CompiledProgram]) -> CompiledProgram:
    from torch_ir.ir import specialize

    return compile_one(specialize(ir, {seq: size}))


def select_prompt_row(ir: NPU_IR, seq: str) -> NPU_IR | None:
    """A copy of ``ir`` whose last-row slice before the vocabulary projection (``hidden[:, -1:]``) takes the row
    at ``argmax(cache_position)`` instead (see the module docstring); None when ``ir`` has no such slice (it
    computes every row's logits) or its cache writes do not depend on ``cache_position[0]`` alone."""
    slices = [n for n in ir.nodes if n.op_type == _SLICE and n.attrs.get("dim") in (1, -2)
              and n.attrs.get("start") == -1 and int(n.attrs.get("end") or _WHOLE) >= _WHOLE
              and int(n.attrs.get("step", 1)) == 1 and len(n.inputs[0].shape) == 3 and n.inputs[0].shape[1] == seq]
    if len(slices) != 1 or not _writes_from_first_position(ir):
        return None
    out = copy.deepcopy(ir)
    at = next(i for i, n in enumerate(out.nodes) if n.name == slices[0].name)
    old = out.nodes[at]
    positions = next(t for t in out.graph_inputs if t.name == "cache_position")
    row = TensorMeta(f"{old.name}_prompt_row", [1], "int64", role="activation")
    argmax = OpNode(f"{old.name}_argmax", "aten.argmax.default", [copy.deepcopy(positions)], [row],
                    {"dim": 0, "keepdim": True}, provenance=old.provenance)
    pick = OpNode(old.name, "aten.index_select.default", [old.inputs[0], copy.deepcopy(row)], old.outputs,
                  {"dim": 1}, provenance=old.provenance)
    out.nodes[at:at + 1] = [argmax, pick]
    return out


def _writes_from_first_position(ir: NPU_IR) -> bool:
    """Whether every cache write is an ``index_copy`` whose index reads ``cache_position`` only through
    ``cache_position[0]`` (``StaticCacheLM``'s ``cumulative_length + arange(seq)``)."""
    producers = {o.name: n for n in ir.nodes for o in n.outputs}
    writers = [producers.get(value) for value in ir.mutations.values()]
    if not writers or any(w is None or not w.op_type.startswith("aten.index_copy") for w in writers):
        return False
    seen: set[str] = set()
    todo = [w.inputs[1].name for w in writers if len(w.inputs) > 1]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == "cache_position":
            return False  # reached other than through cache_position[0]
        node = producers.get(name)
        if node is None:
            continue
        if node.op_type == "aten.select.int" and node.inputs[0].name == "cache_position" \
                and node.attrs.get("dim") == 0 and node.attrs.get("index") == 0:
            continue
        todo.extend(t.name for t in node.inputs)
    return True


__all__ = ["PREFILL_ARENA_CAP", "check_buckets", "compile_prefill", "default_buckets",
           "select_prompt_row"]
