"""An LLM costed per phase: its prefill program (``chunk`` prompt tokens a run) and its decode program (one
token a run), as ``npu_compiler.compile_lm`` makes them, each costed by ``cost_program``. Tokens/s follow from
the latencies: prefill processes ``chunk`` tokens per run, decode one.

Attention reads only the live rows of the KV cache, and how many there are is known only at run time (from
``cache_position``), so both phases are costed at one ``context``: the decode step that attends over ``context``
positions, and the prefill chunk that ends there. The default is the whole cache: the slowest step."""

from __future__ import annotations

from dataclasses import dataclass

from npu_program.dynamic import DynamicProgram
from npu_program.lm import prefill_variant
from npu_program.program import CompiledProgram

from .hardware import Hardware
from .model import CostModelError, CostReport, cost_program


@dataclass(frozen=True)
class LMCost:
    """The two phases' reports and the rates they give."""

    prefill: CostReport
    decode: CostReport
    chunk: int
    #: The live KV-cache positions both phases were costed at (the whole cache unless ``cost_lm`` was given one).
    context: int | None = None

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.chunk / (self.prefill.latency_ms / 1e3) if self.prefill.latency_ms else 0.0

    @property
    def kv_cache_bytes(self) -> int | None:
        """The KV cache's bytes as the programs hold it (int8 codes and float32 scales when quantized)."""
        return self.decode.cache_bytes

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 / self.decode.latency_ms if self.decode.latency_ms else 0.0

    def summary(self, top: int = 5) -> str:
        return "\n".join([
            f"prefill: {self.chunk} tokens a run, {self.prefill.latency_ms:.3f} ms a run "
            f"({self.prefill_tokens_per_s:,.1f} tokens/s)",
            f"decode: {self.decode.latency_ms:.3f} ms/token ({self.decode_tokens_per_s:,.1f} tokens/s)"
            + (f" at context {self.context}" if self.context else ""),
            *([f"KV cache: {self.kv_cache_bytes:,} bytes ({self.decode.cache_dtypes})"]
              if self.kv_cache_bytes is not None else []),
            "", "== prefill ==", self.prefill.summary(top=top), "", "== decode ==", self.decode.summary(top=top)])


def tokens_per_run(program: CompiledProgram) -> int:
    """The tokens one run of an LLM program takes: the length of its ``input_ids`` input."""
    spec = next((s for s in program.input_specs if s.name == "input_ids"), None)
    if spec is None or not spec.shape:
        raise CostModelError(f"program {program.model_name!r} has no input_ids input: it is not an LLM phase "
                             "program (compile the model with npu_compiler.llm.compile_lm)")
    return int(spec.shape[-1])


def cost_lm(prefill: CompiledProgram | DynamicProgram, decode: CompiledProgram, hw: Hardware,
            dtype: str | None = None, context: int | None = None, precision: str | None = None,
            prefill_tokens: int | None = None) -> LMCost:
    """Both phases of an LLM on ``hw``; the decode program must take one token a run. A prefill of prompt-length
    buckets (``compile_lm``'s ``DynamicProgram``) is costed at its bucket for ``prefill_tokens`` (the smallest
    holding them; None: the smallest bucket, the chunk). ``context``: the live KV-cache positions to cost both
    phases at (see the module docstring); None: the whole cache. ``dtype`` and ``precision``: as
    ``cost_program``'s."""
    prefill = prefill_variant(prefill, prefill_tokens or 1)
    if isinstance(decode, DynamicProgram) or tokens_per_run(decode) != 1:
        runs = "prompt-length buckets" if isinstance(decode, DynamicProgram) else f"{tokens_per_run(decode)} tokens"
        raise CostModelError(f"program {decode.model_name!r} takes {runs} a run: the decode program takes one (give "
                             "compile_lm's decode program)")
    decode_cost = cost_program(decode, hw, dtype, context=context, precision=precision)
    prefill_cost = cost_program(prefill, hw, dtype, context=context, precision=precision)
    return LMCost(prefill_cost, decode_cost, tokens_per_run(prefill),
                  context if context is not None else decode_cost.cache_length)


__all__ = ["LMCost", "cost_lm", "tokens_per_run"]
