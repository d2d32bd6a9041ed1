"""``Generator``: run an LLM's prefill and decode programs (``npu_compiler.compile_lm``) token by token.

    gen = Generator(prefill_program, decode_program, weights)        # weights: load_weights(...)
    result = gen.generate([1, 15, 27], max_new_tokens=32)             # greedy
    result = gen.generate(ids, 32, temperature=0.8, top_k=40, seed=0) # sampled, reproducibly
    print(result.tokens, result.summary())

The two programs share the weights and one ``State`` holding the KV cache. The prompt runs through the
prefill program in chunks of its fixed length, each at its position offset (``cache_position``):

* a prompt of ``chunk`` tokens or more runs as whole chunks; a last partial chunk is shifted back to end
  at the prompt's end, so it overlaps the chunk before it: those tokens are computed again at the same
  positions, which writes the same keys and values into the cache again;
* a shorter prompt runs all but its last token as one chunk padded at the end (positions ``0..chunk-1``),
  then its last token through the decode program. The padding's keys and values sit at positions the
  causal mask hides from every real token, and each is overwritten by a decode step before any query
  at that position exists. (A one-token prompt is a decode step only.)

Either way the prompt's last token is the last row of its run, and the programs compute the logits of
the last row only (``extract_lm``), which is all generation reads. Then each decode run takes one token
at the next position. Nothing is copied per token but the two small inputs and the logits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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

    def __init__(self, prefill: CompiledProgram, decode: CompiledProgram, weights: Any,
                 device: Device | Any = None) -> None:
        self.device = as_device(device if device is not None else prefill.target)
        self.chunk = _tokens(prefill, "prefill")
        if _tokens(decode, "decode") != 1:
            raise RuntimeInputError(f"program {decode.model_name!r} is not a one-token decode program "
                                    f"(input_ids is {decode.input_specs[0].shape})")
        self.max_cache_len = _cache_len(prefill)
        self.state = State(prefill, self.device)
        self.prefill_exec = Executor(prefill, self.device)
        self.decode_exec = Executor(decode, self.device)
        self.prefill_exec.bind(weights, self.state)
        self.decode_exec.bind(self.prefill_exec.bound, self.state)
        self.prefill_dispatches = sum(1 for d in prefill.dispatches if not d.at_bind)
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
        """Logits of the prompt's last position, and the number of prefill runs."""
        n, chunk = len(prompt), self.chunk
        if n < chunk:  # all but the last token padded to a chunk (hidden, overwritten later), then the last
            if n > 1:
                head = prompt[:-1]
                self._run(self.prefill_exec, head + [head[-1]] * (chunk - len(head)), list(range(chunk)))
            return self._run(self.decode_exec, prompt[-1:], [n - 1])[-1], int(n > 1)
        starts = list(range(0, n - chunk + 1, chunk))
        if starts[-1] + chunk < n:
            starts.append(n - chunk)  # the last chunk ends at the prompt's end, overlapping the one before
        for begin in starts:
            logits = self._run(self.prefill_exec, prompt[begin:begin + chunk], list(range(begin, begin + chunk)))
        return logits[-1], len(starts)

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


__all__ = ["Generation", "Generator", "pick"]
