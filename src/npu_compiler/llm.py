"""``compile_lm``: one LLM IR with a KV cache -> a prefill program and a decode program sharing weights and state.

The IR comes from ``torch_ir.frontends.hf.extract_lm`` (or any export of ``StaticCacheLM``): inputs
``input_ids [1, seq]`` and ``cache_position [seq]``, the KV cache as buffers written by ``KV_UPDATE``, the
sequence length ``seq`` symbolic. It is specialized (``torch_ir.ir.specialize``) for:

* **prefill**, ``seq`` = each prefill bucket (default: the chunk, 16, doubled up to the cache length): one
  ``DynamicProgram`` of static variants (``npu_compiler.llm_prefill``). A prompt of any length up to the
  largest bucket runs in one call of the smallest bucket that holds it, padded; a longer one as chunks of
  the largest (``npu_runtime.Generator``; see its docstring);
* **decode**, ``seq = 1``: one token, a ``CompiledProgram``.

Every program names each cache slot by the buffer's state-dict key, so one ``npu_runtime.State`` serves
all, and all read one weight table. Positions, the rotary tables and the causal mask are computed in
the programs from ``cache_position``: nothing is done on the host per token but copying two inputs in.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from npu_program.dynamic import DynamicProgram
from npu_program.kernel_record import BLOCK_WEIGHT_INPUTS
from npu_program.kernels import KERNELS
from npu_program.lm import prefill_variant, prefill_variants
from npu_program.lm import tokens_of as lm_tokens
from npu_program.program import CompiledProgram, TensorSpec
from torch_ir.errors import IRValidationError
from torch_ir.fileio import atomic_write, read_input
from torch_ir.ir import NPU_IR, specialize
from torch_ir.quant.spec import BLOCK_CODES, QuantSpec, check_fits

from .compiler import CompileError, CompileOptions, compile, load_source
from .kvcache import kv_code_dtype, quantize_kv_cache
from .library import Target
from .llm_prefill import compile_prefill
from .passes import normalize

#: The two inputs of an LLM program.
LM_INPUTS = ("input_ids", "cache_position")
#: Default prefill chunk: long enough for a GEMM to beat a GEMV, short enough to pad cheaply.
DEFAULT_CHUNK = 16


@dataclass
class LMPrograms:
    """A compiled LLM: the prefill program (a ``DynamicProgram`` of prompt-length buckets; a static one of
    ``chunk`` tokens from an older directory), the decode program (one token) and what the generator needs."""

    prefill: DynamicProgram | CompiledProgram
    decode: CompiledProgram
    #: the smallest prefill bucket (the tokens of the prefill program the dispatch table and cost model show)
    chunk: int
    max_cache_len: int
    num_layers: int

    @property
    def prefill_buckets(self) -> list[int]:
        """The prompt lengths the prefill variants take, ascending."""
        return prefill_buckets_of(self.prefill)

    def prefill_program(self, tokens: int | None = None) -> CompiledProgram:
        """The static prefill variant of the smallest bucket holding ``tokens`` (None: of ``chunk`` tokens, the
        smallest); the largest when none holds them (a longer prompt runs as chunks of it)."""
        return prefill_variant(self.prefill, self.chunk if tokens is None else tokens)

    def programs(self) -> list[CompiledProgram]:
        """Every static program: the prefill variants, smallest first, then decode."""
        return [*prefill_variants(self.prefill), self.decode]

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``prefill.npubin`` (one file holding every bucket), ``decode.npubin`` and ``lm.json`` (chunk, buckets,
        cache length) in ``directory``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.prefill.save(out / "prefill.npubin")
        self.decode.save(out / "decode.npubin")
        atomic_write(out / "lm.json", json.dumps(
            {"chunk": self.chunk, "prefill_buckets": self.prefill_buckets, "max_cache_len": self.max_cache_len,
             "num_layers": self.num_layers}).encode(), what="LLM description")
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> LMPrograms:
        """The programs ``save`` wrote; an older directory (a static ``prefill.npubin`` of ``chunk`` tokens)
        loads as it is."""
        return load_lm_programs(directory)

    def dispatch_table(self) -> str:
        """Seed 004's per-phase table: dispatches per run, per token and per layer (bind-time work excluded), for
        the prefill of ``chunk`` tokens and the decode step."""
        rows = [("prefill", self.prefill_program(), self.chunk), ("decode", self.decode, 1)]
        lines = [f"{'phase':<8} {'tokens/run':>10} {'dispatches/run':>14} {'per token':>10} {'per layer':>10}"]
        for phase, program, tokens in rows:
            n = run_dispatches(program)
            lines.append(f"{phase:<8} {tokens:>10} {n:>14} {n / tokens:>10.1f} {n / self.num_layers:>10.1f}")
        return "\n".join(lines)


#: What "unfused" switches off: the transformer fusions, attention and residual folding, and the compiler's own
#: kernel fusion (seed 004's "unfused"); kept are the cache write, without which there is no program, and
#: SDPA's plain rewrite into ATTN_SCORE + ATTN_OUTPUT, which the CPU target has kernels for.
UNFUSED_FAMILIES = ("llm", "attention", "residual")
KEPT_RULES = ("kv_update", "sdpa")


def unfused_options() -> CompileOptions:
    """Compile options of the unfused baseline of the dispatch table (see ``UNFUSED_FAMILIES``)."""
    from npu_compiler.passes import NormalizeOptions
    from npu_compiler.passes.pipeline import ALL_RULES

    off = {r.name for r in ALL_RULES if r.family in UNFUSED_FAMILIES and r.name not in KEPT_RULES}
    return CompileOptions(fuse=False, normalize_options=NormalizeOptions(disabled_rules=off))


def fusion_table(unfused: LMPrograms, fused: LMPrograms) -> str:
    """Seed 004's table: dispatches per run, per token and per layer of each phase, unfused and fused."""
    lines = [f"{'phase':<8} {'tokens':>6} | {'unfused/run':>11} {'/token':>7} {'/layer':>7} | "
             f"{'fused/run':>9} {'/token':>7} {'/layer':>7}"]
    for phase, tokens in (("prefill", fused.chunk), ("decode", 1)):
        cells = []
        for programs in (unfused, fused):
            n = run_dispatches(programs.prefill_program(tokens) if phase == "prefill" else programs.decode)
            cells.append((n, n / tokens, n / programs.num_layers))
        (a, at, al), (b, bt, bl) = cells
        lines.append(f"{phase:<8} {tokens:>6} | {a:>11} {at:>7.1f} {al:>7.1f} | {b:>9} {bt:>7.1f} {bl:>7.1f}")
    return "\n".join(lines)


def is_lm(ir: NPU_IR) -> bool:
    """Whether ``ir`` is an LLM with a KV cache that ``compile_lm`` compiles (inputs ``input_ids`` and
    ``cache_position`` with a symbolic length, buffers written in place)."""
    return sorted(t.name for t in ir.graph_inputs) == sorted(LM_INPUTS) and bool(ir.mutations) \
        and any(not t.is_static for t in ir.graph_inputs)


def run_dispatches(program: CompiledProgram) -> int:
    """Dispatches of one run (those done once at bind time excluded)."""
    return sum(1 for d in program.dispatches if not d.at_bind)


def compile_lm(ir_or_path: NPU_IR | dict | str | os.PathLike, *, chunk: int = DEFAULT_CHUNK,
               target: str | Target = "cpu", options: CompileOptions | None = None,
               fallback: str | None = None, kv_bits: int | None = None,
               prefill_buckets: Sequence[int] | None = None) -> LMPrograms:
    """Compile an LLM IR with a KV cache into prefill and decode programs (see the module docstring).

    ``prefill_buckets``: the prompt lengths the prefill is compiled for (one variant each, in one
    ``DynamicProgram``); None: ``chunk`` doubled up to the cache length, as long as the largest variant's arena
    stays within ``npu_compiler.llm_prefill.PREFILL_ARENA_CAP`` (1 GiB). ``chunk``: the smallest default bucket
    (at most the cache length; unused when buckets are given). ``kv_bits=8`` holds the cache as int8 codes with a
    float32 scale per head and position (``npu_compiler.kvcache``); None: the model's float dtype. Raises
    ``CompileError`` when the IR is not such an LLM: other inputs, no symbolic sequence length, no cache; for a
    bucket outside 1..cache length; or for another ``kv_bits``.
    """
    kv_code_dtype(kv_bits)  # refuses an unsupported width before any work
    ir = load_source(ir_or_path)
    seq = sequence_symbol(ir)
    max_cache_len = _cache_len(ir, seq)
    if prefill_buckets is None and not 1 <= chunk <= max_cache_len:
        raise CompileError(f"IR {ir.model_name!r}: prefill chunk {chunk} must be between 1 and the cache length "
                           f"{max_cache_len}")

    def one(specialized: NPU_IR) -> CompiledProgram:
        return _compile_phase(specialized, target, options, fallback, kv_bits)

    prefill = compile_prefill(ir, seq, prefill_buckets, chunk, max_cache_len, one)
    decode = one(specialize(ir, {seq: 1}))
    decode.metadata["llm"] = {"phase": "decode", "tokens": 1, "max_cache_len": max_cache_len}
    for program in (prefill, *prefill_variants(prefill), decode):
        program.metadata["llm"]["kv_bits"] = kv_bits
    smallest = prefill_variants(prefill)[0]
    # one cache write per key and per value cache and layer (a quantized cache has two slots per cache)
    num_layers = sum(1 for d in smallest.dispatches if writes_state_kernel(d.kernel)) // 2
    return LMPrograms(prefill, decode, prefill_buckets_of(prefill)[0], max_cache_len, num_layers=num_layers)


def prefill_buckets_of(prefill: DynamicProgram | CompiledProgram) -> list[int]:
    """The prompt lengths of the prefill variants, ascending."""
    return [tokens_of(p) for p in prefill_variants(prefill)]


def tokens_of(program: CompiledProgram) -> int:
    """The tokens one run of an LLM program takes (its ``input_ids``' length)."""
    tokens = lm_tokens(program)
    if tokens is None:
        raise CompileError(f"program {program.model_name!r} has no input_ids [1, tokens] input: it is not an LLM "
                           "phase program (compile the model with npu_compiler.llm.compile_lm)")
    return tokens


def load_lm_programs(directory: str | os.PathLike[str]) -> LMPrograms:
    """``LMPrograms.load``: ``prefill.npubin`` of either kind (a dynamic file of buckets, or an older static one),
    ``decode.npubin`` and ``lm.json``; a missing or bad file is a ``CompileError`` naming it."""
    from npu_program.npubin_dynamic import load_program

    root = Path(directory)
    prefill = load_program(root / "prefill.npubin")
    decode = CompiledProgram.load(root / "decode.npubin")
    try:
        info = json.loads(read_input(root / "lm.json", "LLM description", "save the programs again"))
        max_cache_len, num_layers = int(info["max_cache_len"]), int(info["num_layers"])
    except (ValueError, KeyError, TypeError) as err:
        raise CompileError(f"{root / 'lm.json'}: not an LLM description ({err}); it needs max_cache_len and "
                           "num_layers: save the programs again (LMPrograms.save)") from None
    return LMPrograms(prefill, decode, prefill_buckets_of(prefill)[0], max_cache_len, num_layers)


def _compile_phase(ir: NPU_IR, target: str | Target, options: CompileOptions | None, fallback: str | None,
                   kv_bits: int | None) -> CompiledProgram:
    """One phase; with ``kv_bits`` the cache is quantized between normalizing (which makes KV_UPDATE and ATTENTION)
    and lowering, so the program, its embedded IR and its cost all see the int8 cache."""
    if kv_bits is None:
        return compile(ir, target=target, options=options, fallback=fallback)
    options = options or CompileOptions()
    if options.normalize:
        ir = normalize(ir, options.normalize_options)
    options = dataclasses.replace(options, normalize=False)
    return compile(quantize_kv_cache(ir, kv_bits), target=target, options=options, fallback=fallback)


def writes_state_kernel(kernel: str) -> bool:
    """Whether dispatches of ``kernel`` write a state slot (a cache write)."""
    record = KERNELS.get(kernel)
    return record is not None and record.writes_state


def sequence_symbol(ir: NPU_IR) -> str:
    """The symbol of the sequence length: ``input_ids``' last dimension, which ``cache_position`` shares."""
    inputs = {t.name: t for t in ir.graph_inputs}
    if sorted(inputs) != sorted(LM_INPUTS):
        raise CompileError(f"IR {ir.model_name!r} takes inputs {sorted(inputs)}; an LLM program takes "
                           f"{list(LM_INPUTS)}: extract it with torch_ir.frontends.hf.extract_lm (or export "
                           "StaticCacheLM)")
    ids, positions = inputs["input_ids"], inputs["cache_position"]
    if len(ids.shape) != 2 or not isinstance(ids.shape[1], str) or positions.shape != [ids.shape[1]]:
        raise CompileError(f"IR {ir.model_name!r}: input_ids is {ids.shape} and cache_position {positions.shape}; "
                           "an LLM IR has input_ids [1, seq] and cache_position [seq] with a symbolic seq "
                           "(export with dynamic_shapes, as extract_lm does)")
    if ids.shape[1] not in ir.symbols:
        raise CompileError(f"IR {ir.model_name!r}: the sequence length {ids.shape[1]!r} is an expression, not a "
                           "symbol; export with one torch.export.Dim for it")
    return ids.shape[1]


def _cache_len(ir: NPU_IR, seq: str) -> int:
    written = {w.name: w for w in ir.weights if w.name in ir.mutations}
    if not written:
        raise CompileError(f"IR {ir.model_name!r} has no KV cache (no buffer is written in place); extract the LLM "
                           "with torch_ir.frontends.hf.extract_lm, or compile it as an ordinary program")
    lengths = {w.shape[2] for w in written.values() if len(w.shape) == 4}
    if len(lengths) != 1:
        raise CompileError(f"IR {ir.model_name!r}: the KV cache buffers are not all [batch, heads, length, "
                           f"head_dim] of one length: {[w.shape for w in written.values()]}")
    return int(lengths.pop())


__all__ = ["DEFAULT_CHUNK", "LMPrograms", "compile_lm", "fusion_table", "is_lm", "load_lm_programs",
           "prefill_buckets_of", "prefill_variant", "prefill_variants", "run_dispatches", "sequence_symbol",
           "tokens_of", "unfused_options"]


#: Targets whose backends give any dispatch a block-quantized weight (dequantized once where no kernel reads the
#: blocks); another target keeps a weight in blocks only where ``BLOCK_WEIGHT_INPUTS`` says its kernels read them.
ANY_READER_TARGETS = ("cpu",)


def with_block_weights(programs: LMPrograms, layouts: Mapping[str, str], *,
                       int8_activations: bool = False) -> dict[str, str]:
    """Hold each weight slot whose state-dict key (or a key tied to it) is in ``layouts`` in that GGUF block layout
    (``QuantSpec.block``: ``q8_0``, ``q4_K``, ...), as a GGUF file stores it, in both programs (changed in place).

    The slot keeps its float dtype and shape (it is what its blocks dequantize to), so every dispatch reading it
    means the same thing; its bytes become the blocks (``TensorSpec.storage``). On the CPU any dispatch may read
    one (its linear layers and embeddings read the blocks, any other kernel is given them dequantized at bind
    time); on another target a weight stays blocks only if every dispatch reading it is a contraction reading it
    as its ``[N, K]`` weight (``npu_program.kernel_record.BLOCK_WEIGHT_INPUTS``). Returns the layouts kept, by
    key: the caller dequantizes the other tensors. A slot the layout does not fit (not 2-D, the last dim not whole
    blocks) is a ``CompileError`` naming it.

    ``int8_activations``: the contractions reading blocks round x to int8 in groups of 32 first (their
    ``x_int8_group`` parameter), as llama.cpp computes its quantized dot products: faster integer kernels (Q8_0,
    Q4_0, Q5_0, Q4_K, Q6_K), results within that rounding of the float ones. The CPU backend runs it; another
    target is refused."""
    kept = {k: v for k, v in layouts.items() if all(_reads_blocks(p, k) for p in programs.programs())}
    for program in programs.programs():
        if int8_activations and program.target not in X_INT8_TARGETS:
            raise CompileError(f"int8 activations run on the {' or '.join(X_INT8_TARGETS)} backend, not "
                               f"{program.target!r}: leave them off (x stays float, the weights stay blocks)")
        tied = _tied_keys(program)
        program.weight_specs = [_block_slot(program, spec, kept, tied) for spec in program.weight_specs]
        if int8_activations:
            _round_x_to_int8(program)
    return kept


#: Targets whose contraction kernels take ``x_int8_group`` (``with_block_weights(int8_activations=True)``).
X_INT8_TARGETS = ("cpu",)
#: llama.cpp's activation groups (its Q8_0 / Q8_K blocks of x are 32 wide per scale).
X_INT8_GROUP = 32


def _round_x_to_int8(program: CompiledProgram) -> None:
    """``x_int8_group`` on every contraction reading a block-quantized weight."""
    blocked = {s.name for s in program.weight_specs if s.quant is not None and s.quant.block is not None}
    for d in program.dispatches:
        if any(d.inputs[i] in blocked for i in BLOCK_WEIGHT_INPUTS.get(d.kernel, ()) if i < len(d.inputs)):
            d.params["x_int8_group"] = X_INT8_GROUP


def _reads_blocks(program: CompiledProgram, key: str) -> bool:
    """Whether every dispatch of ``program`` reading the weight of state-dict ``key`` reads it as blocks."""
    if program.target in ANY_READER_TARGETS:
        return True
    group = _tied_keys(program).get(key, {key})
    slots = {s.name for s in program.weight_specs if program.weight_keys.get(s.name, s.name) in group}
    for d in program.dispatches:
        as_blocks = d.host is None and d.params.get("trans_b", True)
        allowed = BLOCK_WEIGHT_INPUTS.get(d.kernel, ()) if as_blocks else ()
        if any(name in slots and i not in allowed for i, name in enumerate(d.inputs)):
            return False
    return True


def _tied_keys(program: CompiledProgram) -> dict[str, set[str]]:
    """state-dict key -> every key tied to it (``metadata["weight_aliases"]``, both ways)."""
    groups: dict[str, set[str]] = {}
    for key, others in program.metadata.get("weight_aliases", {}).items():
        group = {key, *others}
        for k in group:
            groups.setdefault(k, set()).update(group)
    return groups


def _block_slot(program: CompiledProgram, spec: TensorSpec, layouts: Mapping[str, str],
                tied: dict[str, set[str]]) -> TensorSpec:
    key = program.weight_keys.get(spec.name, spec.name)
    found = [layouts[k] for k in sorted(tied.get(key, {key})) if k in layouts]
    if not found:
        return spec
    quant = QuantSpec(BLOCK_CODES[found[0]], block=found[0])
    try:
        if len(spec.shape) != 2:
            raise IRValidationError(f"a block layout is kept for 2-D weights only, not {list(spec.shape)}")
        check_fits(quant, spec.shape, spec.dtype, f"weight {key!r} of program {program.model_name!r}")
    except IRValidationError as e:
        raise CompileError(str(e)) from None
    return replace(spec, quant=quant)
