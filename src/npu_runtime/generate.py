"""``Generator``: run an LLM's prefill and decode programs (``npu_compiler.compile_lm``) token by token.

    gen = Generator(prefill_program, decode_program, weights)        # weights: load_weights(...)
    result = gen.generate([1, 15, 27], max_new_tokens=32)             # greedy
    result = gen.generate(ids, 32, temperature=0.8, top_k=40, seed=0) # sampled, reproducibly
    print(result.tokens, result.summary())

The programs share the weights and one ``State`` holding the KV cache. The prefill program is a
``DynamicProgram`` of prompt-length buckets (or, from an older directory, one static program of ``chunk``
tokens: a single bucket). A prompt of ``n`` tokens runs through it at its position offset ``p``
(``cache_position``) in one call of the smallest bucket ``b >= n`` with ``p + b`` within the cache; a prompt
longer than the largest bucket runs as whole chunks of the largest, then its rest so. A one-token rest (a
one-token prompt) is a decode step.

Padding: the ids are padded with the last token, and the padded rows' keys and values are written at positions
``p + n .. p + b - 1`` (such a program writes the cache at ``cache_position[0] + arange(b)`` and masks by the
same). Those positions lie after the prompt, so the causal mask hides them from every real token, and each is
overwritten (by the next decode step or prefill run) before any query at that position exists. Which row holds
the last real token's logits depends on the program:

* ``compile_lm`` rewrites an ``extract_lm`` IR's last-row logits into the row at the largest
  ``cache_position`` (``npu_program.lm.ROW_AT_LARGEST_POSITION``): the padded rows get position ``p``, which
  only sets their own rotary phase, so the last real token's position ``p + n - 1`` is the largest;
* a program computing every row's logits (the zoo's ``llama_kv``) gets positions continuing to ``p + b - 1``
  and row ``n - 1`` is read;
* a program computing only its last row's logits, without that rewrite (an older directory), is never padded
  at the end: a rest shorter than the bucket runs shifted back to end at the prompt's end, overlapping the run
  before it (those tokens are computed again at the same positions and write the same keys and values again);
  a prompt shorter than the smallest bucket runs all but its last token padded, then its last token as a
  decode step.

Then each decode run takes one token at the next position. Nothing is copied per token but the two small
inputs and the logits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npu_program.dynamic import DynamicProgram
from npu_program.lm import prefill_variants, selects_prompt_row
from npu_program.program import CompiledProgram

from .device import Device, RuntimeInputError, as_device
from .executor import Executor
from .state import State


@dataclass
class Generation:
    """The result of ``Generator.generate``: the new tokens and the timings of each phase."""

    prompt: list[int]
    tokens: list[int]
    prefill_s: float
    # Wall time of each decode step (the first new token comes from prefill, so one fewer than tokens).
    decode_s: list[float] = field(default_factory=list)
    prefill_runs: int = 0
    # dispatches of one prefill run and of one decode step (what each phase costs a GPU backend in launches)
    prefill_dispatches: int = 0
    decode_dispatches: int = 0
    stopped_by_eos: bool = False
    # Logits that chose each new token (float32, [vocab]); kept only with ``keep_logits=True``.
    logits: list[np.ndarray] = field(default_factory=list)

    @property
    def ms_per_token(self) -> float:
        """Median decode time per token in milliseconds (0 when no decode step ran)."""
        return statistics.median(self.decode_s) * 1e3 if self.decode_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.ms_per_token if self.decode_s else 0.0

    def summary(self) -> str:
        lines = [f"prompt: {len(self.prompt)} tokens, prefill {self.prefill_s * 1e3:.1f} ms "
                 f"({self.prefill_runs} prefill run{'s' if self.prefill_runs != 1 else ''} of "
                 f"{self.prefill_dispatches} dispatches)",
                 f"generated: {len(self.tokens)} tokens" + (" (stopped at end of sequence)" if self.stopped_by_eos
                                                            else "")]
        if self.decode_s:
            lines.append(f"decode: {self.ms_per_token:.2f} ms/token (median), {self.tokens_per_s:.1f} tokens/s, "
                         f"{self.decode_dispatches} dispatches/token")
        return "\n".join(lines)


class Generator:
    """Prefill and decode programs of one LLM, bound to one set of weights and one KV cache (see the module
    docstring)."""

    def __init__(self, prefill: DynamicProgram | CompiledProgram, decode: CompiledProgram, weights: Any,
                 device: Device | Any = None) -> None:
        self.device = as_device(device if device is not None else prefill.target)
        variants = prefill_variants(prefill)
        #: the prompt lengths the prefill variants take, ascending
        self.buckets = [_tokens(p, "prefill") for p in variants]
        #: the length a prompt longer than every bucket is cut into (the largest bucket)
        self.chunk = self.buckets[-1]
        if _tokens(decode, "decode") != 1:
            raise RuntimeInputError(f"program {decode.model_name!r} is not a one-token decode program "
                                    f"(input_ids is {decode.input_specs[0].shape})")
        self.max_cache_len = _cache_len(variants[0])
        self.padding = _padding(variants)
        self.state = State(variants[0], self.device)
        self.prefill_exec = Executor(prefill, self.device)  # a DynamicExecutor for buckets
        self.decode_exec = Executor(decode, self.device)
        self.prefill_exec.bind(weights, self.state)
        self.decode_exec.bind(self.prefill_exec.bound, self.state)
        self.dispatches = {b: sum(1 for d in p.dispatches if not d.at_bind) for b, p in zip(self.buckets, variants)}
        self.prefill_dispatches = self.dispatches[self.buckets[0]]  # updated to the last prefill run's bucket
        self.decode_dispatches = sum(1 for d in decode.dispatches if not d.at_bind)

    def reset(self) -> None:
        """Empty the KV cache (a new conversation)."""
        self.state.reset()

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = None, eos_token_ids: Iterable[int] = (),
                 on_token: Callable[[int], None] | None = None, keep_logits: bool = False) -> Generation:
        """New tokens after ``prompt`` (token ids): greedy with ``temperature=0``, else sampled from the
        softmax at ``temperature`` over the ``top_k`` most likely tokens (all when None), reproducibly for
        a ``seed``. Stops after ``max_new_tokens`` or at a token of ``eos_token_ids``; ``on_token`` sees
        each token as it comes (to stream it)."""
        prompt = self._check(prompt, max_new_tokens, temperature, top_k)
        rng = np.random.default_rng(seed)
        eos = set(eos_token_ids)
        self.reset()
        start = time.perf_counter()
        logits, runs = self._prefill(prompt)
        result = Generation(list(prompt), [], time.perf_counter() - start, prefill_runs=runs,
                            prefill_dispatches=self.prefill_dispatches, decode_dispatches=self.decode_dispatches)
        position = len(prompt)
        while True:
            token = pick(logits, temperature, top_k, rng)
            result.tokens.append(token)
            if keep_logits:
                result.logits.append(logits)
            if on_token is not None:
                on_token(token)
            if token in eos:
                result.stopped_by_eos = True
                break
            if len(result.tokens) == max_new_tokens:
                break
            start = time.perf_counter()
            logits = self._run(self.decode_exec, [token], [position])[0]
            result.decode_s.append(time.perf_counter() - start)
            position += 1
        return result

    def forced_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """The next-token logits after ``prompt`` and after each token of ``continuation`` fed in turn (teacher
        forcing), float32 ``[len(continuation) + 1, vocab]``: another runner's tokens scored by this model, to
        compare the two distributions step by step (a KLD) without one's choices steering the other."""
        self._check(prompt, len(continuation) + 1, 0.0, None)  # a prompt, and room in the cache for every token
        ids = self._check([*prompt, *continuation], 1, 0.0, None)  # every id inside the vocabulary
        self.reset()
        rows = [self._prefill(ids[:len(prompt)])[0]]
        for position, token in enumerate(ids[len(prompt):], start=len(prompt)):
            rows.append(self._run(self.decode_exec, [token], [position])[0])
        return np.stack(rows)

    # -- steps ------------------------------------------------------------------------------------

    def _prefill(self, prompt: list[int]) -> tuple[np.ndarray, int]:
        """Logits of the prompt's last position, and the number of prefill runs (see the module docstring)."""
        n, largest, begin, runs = len(prompt), self.buckets[-1], 0, 0
        while n - begin > largest:  # whole chunks of the largest bucket; their logits are not needed
            self._prefill_run(prompt[begin:begin + largest], begin)
            begin, runs = begin + largest, runs + 1
        rest = n - begin
        if rest == 1:
            return self._run(self.decode_exec, prompt[-1:], [n - 1])[-1], runs
        fits = [b for b in self.buckets if b >= rest and begin + b <= self.max_cache_len]
        if fits and (fits[0] == rest or self.padding is not None):
            return self._prefill_run(prompt[begin:], begin, fits[0])[0], runs + 1
        bucket = next(b for b in self.buckets if b >= rest)
        if n >= bucket:  # shifted back to end at the prompt's end, overlapping the tokens before
            return self._prefill_run(prompt[n - bucket:], n - bucket)[0], runs + 1
        # a short prompt and no row to read but the last: all but its last token padded, then a decode step
        self._prefill_run(prompt[:-1], 0, next(b for b in self.buckets if b >= n - 1), positions="continue")
        return self._run(self.decode_exec, prompt[-1:], [n - 1])[-1], runs + 1

    def _prefill_run(self, ids: list[int], begin: int, bucket: int | None = None,
                     positions: str | None = None) -> np.ndarray:
        """One prefill run of ``ids`` at ``begin``, padded to ``bucket`` (default: their length) with the last
        token; the logits of the last of ``ids``, [1, vocab]."""
        n = len(ids)
        bucket = n if bucket is None else bucket
        pad = bucket - n
        how = positions or self.padding
        tail = [begin] * pad if how == "first" else list(range(begin + n, begin + bucket))
        logits = self._run(self.prefill_exec, ids + ids[-1:] * pad, list(range(begin, begin + n)) + tail)
        self.prefill_dispatches = self.dispatches[bucket]
        return logits[n - 1:n] if logits.shape[0] == bucket else logits[-1:]

    def _run(self, executor: Executor, ids: list[int], positions: list[int]) -> np.ndarray:
        """Logits [rows, vocab] (float32) of one run: the last row is the last token's."""
        out = executor.run({"input_ids": np.asarray([ids], dtype=np.int64),
                            "cache_position": np.asarray(positions, dtype=np.int64)})
        logits = next(iter(out.values())).to_numpy()
        return np.asarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])

    def _check(self, prompt: Sequence[int], max_new_tokens: int, temperature: float,
               top_k: int | None) -> list[int]:
        ids = [int(t) for t in prompt]
        if not ids:
            raise RuntimeInputError("the prompt is empty: give at least one token")
        vocab = self.decode_exec.program.output_specs[0].shape[-1]
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RuntimeInputError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab}); the "
                                    "tokenizer does not match the model")
        if max_new_tokens < 1:
            raise RuntimeInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        need = len(ids) + max_new_tokens - 1  # the last new token is never fed back
        if need > self.max_cache_len:
            raise RuntimeInputError(
                f"a prompt of {len(ids)} tokens plus {max_new_tokens} new tokens needs a KV cache of {need} "
                f"positions; the programs were compiled with {self.max_cache_len}: recompile with a longer "
                "cache (--max-cache-len) or ask for fewer tokens")
        if temperature < 0 or (top_k is not None and top_k < 1):
            raise RuntimeInputError(f"temperature must be >= 0 and top_k >= 1 (got {temperature}, {top_k})")
        return ids


def pick(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> int:
    """The next token: the argmax at temperature 0, else a sample from softmax(logits / temperature) over the
    ``top_k`` largest logits. NaN logits are refused: argmax would pick token 0 and sampling would fail later,
    where eager generation gives no token either."""
    if np.isnan(logits).any():
        raise RuntimeInputError(f"the model's next-token logits hold {int(np.isnan(logits).sum())} NaN(s): the "
                                "weights or a hyper-parameter are broken: check the checkpoint's weights and "
                                "config.json (torch-ir bisect finds the op that makes them)")
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scaled.size:
        cutoff = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled >= cutoff, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


def _tokens(program: CompiledProgram, phase: str) -> int:
    specs = {s.name: s for s in program.input_specs}
    if set(specs) != {"input_ids", "cache_position"} or not program.state_specs:
        raise RuntimeInputError(f"program {program.model_name!r} is not an LLM {phase} program (inputs input_ids "
                                "and cache_position, a KV cache as state): compile it with npu_compiler.compile_lm")
    return int(specs["input_ids"].shape[-1])


def _cache_len(program: CompiledProgram) -> int:
    return int(program.state_specs[0].shape[2])


def _padding(variants: list[CompiledProgram]) -> str | None:
    """How a prompt is padded to a bucket: ``"first"`` (padded rows at the prompt's first position) when every
    variant's logits are the row at the largest position, ``"continue"`` (positions continue) when every
    variant computes every row's logits, None when only the last row's (see the module docstring)."""
    if all(selects_prompt_row(p) for p in variants):
        return "first"
    if all(_logit_rows(p) == _tokens(p, "prefill") for p in variants):
        return "continue"
    return None


def _logit_rows(program: CompiledProgram) -> int:
    shape = program.output_specs[0].shape
    return int(shape[-2]) if len(shape) >= 2 else 1


__all__ = ["Generation", "Generator", "pick"]
