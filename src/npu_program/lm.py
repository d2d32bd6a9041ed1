"""What the compiler (``npu_compiler.compile_lm``) and the runtime (``npu_runtime.Generator``) both read of an LLM's
programs: the prefill's variants (prompt-length buckets of a ``DynamicProgram``, or one static program from an
older directory) and the tokens each takes."""

from __future__ import annotations

from .dynamic import DynamicProgram
from .program import CompiledProgram

#: ``metadata["llm"]["logits_row"]`` of a prefill program whose logits are those of the row at the largest
#: ``cache_position`` (``npu_compiler.llm_prefill.select_prompt_row``), not of its last row: the generator pads a
#: prompt by giving the padded rows the prompt's first position.
ROW_AT_LARGEST_POSITION = "argmax(cache_position)"


def tokens_of(program: CompiledProgram) -> int | None:
    """The tokens one run of an LLM program takes (its ``input_ids [1, tokens]``), None for another program."""
    spec = next((s for s in program.input_specs if s.name == "input_ids"), None)
    if spec is None or len(spec.shape) != 2 or not isinstance(spec.shape[1], int):
        return None
    return int(spec.shape[1])


def prefill_variants(prefill: DynamicProgram | CompiledProgram) -> list[CompiledProgram]:
    """The static prefill programs, fewest tokens first (a static prefill is its only one)."""
    if isinstance(prefill, DynamicProgram):
        return [v.program for v in sorted(prefill.variants, key=lambda v: tokens_of(v.program) or 0)]
    return [prefill]


def prefill_variant(prefill: DynamicProgram | CompiledProgram, tokens: int) -> CompiledProgram:
    """The variant of the smallest bucket of at least ``tokens``, or the largest."""
    variants = prefill_variants(prefill)
    return next((p for p in variants if (tokens_of(p) or 0) >= tokens), variants[-1])


def selects_prompt_row(program: CompiledProgram) -> bool:
    """Whether ``program``'s logits are those of the row at the largest ``cache_position``. A program file is
    untrusted: its metadata's claim counts only for a prefill whose logits are one row (``[..., 1, vocab]``), the
    shape the compiler gives a selected row; any other claim, or metadata of the wrong type, is ignored."""
    llm = program.metadata.get("llm")
    if not isinstance(llm, dict) or llm.get("logits_row") != ROW_AT_LARGEST_POSITION or not program.output_specs:
        return False
    shape = program.output_specs[0].shape
    return len(shape) >= 2 and shape[-2] == 1


__all__ = ["ROW_AT_LARGEST_POSITION", "prefill_variant", "prefill_variants", "selects_prompt_row", "tokens_of"]
