"""Where a one-token decode step's time goes, by kernel kind: the GEMVs against the small ops around them.

    python bench/llm/decode_ops.py [--dtype float32|bfloat16] [--position 128] [--rounds 3]

A Qwen2.5-0.5B-shaped model (seeded random weights) is saved as a checkpoint in a temporary folder, loaded with
``npu_tools.lm_source.load_lm`` and run by a ``Generator`` up to ``--position``. There the decode program is
profiled (``Executor.profile``, at ``--threads`` or torch's count) and its steps timed as ``Generator`` runs them
(``Executor.run``, which picks one thread or all per run), with the native decode kernels (``cpu_decode_ops``)
off and on, alternating, ``--rounds`` times; the medians are printed: ms by kernel kind, the non-GEMV share, the
runtime's own time per dispatch. Timings of a shared machine: compare only the two columns of one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

GEMV_KINDS = ("GEMM", "QKV_PROJ", "GATE_UP")
STEPS = 15


def save_model(folder: Path, dtype: torch.dtype) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    model.save_pretrained(folder, safe_serialization=True)


def profile_once(generator, position: int, native: bool) -> dict:
    from npu_runtime.backends import cpu_decode_ops

    cpu_decode_ops.set_native_enabled(native)
    inputs = {"input_ids": np.array([[7]]), "cache_position": np.array([position])}
    steps = []
    for _ in range(STEPS):  # decode steps as Generator runs them (its thread choice included)
        t0 = time.perf_counter()
        generator.decode_exec.run(inputs)
        steps.append((time.perf_counter() - t0) * 1e3)
    step_ms = statistics.median(steps)
    prof = generator.decode_exec.profile(inputs, runs=10, warmup=None)
    kinds = {k: us / 1e3 for k, _, us, _ in prof.by_kernel()}
    gemv = sum(v for k, v in kinds.items() if k.split()[0] in GEMV_KINDS)
    return {"run_ms": prof.run_ms, "step_ms": step_ms, "kinds": kinds, "kernel_ms": prof.kernel_ms, "gemv_ms": gemv,
            "own_ms": prof.own_ms, "host_us": prof.host_us_per_dispatch, "n": prof.dispatch_count,
            "counts": {k: n for k, n, _, _ in prof.by_kernel()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--position", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from npu_runtime import Device, load_weights
    from npu_runtime.backends import cpu_decode_ops
    from npu_runtime.generate import Generator
    from npu_tools.lm_source import load_lm

    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp), getattr(torch, args.dtype))
        lm = load_lm(tmp, max_cache_len=256)
    device = Device()
    generator = Generator(lm.programs.prefill, lm.programs.decode,
                          load_weights(lm.weights, lm.programs.prefill, device), device)
    generator.generate(list(range(1, args.position + 1)), 2)  # fills the cache up to the position
    print(f"native decode ops: {cpu_decode_ops.native_status()}")
    results: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(args.rounds):
        for native in (False, True):
            results[native].append(profile_once(generator, args.position, native))
    med = lambda rows, f: statistics.median(f(r) for r in rows)  # noqa: E731
    kinds = sorted({k for rows in results.values() for r in rows for k in r["kinds"]},
                   key=lambda k: -med(results[False], lambda r, k=k: r["kinds"].get(k, 0.0)))
    print(f"\n{args.dtype}, decode at position {args.position}, {torch.get_num_threads()} threads, medians of "
          f"{args.rounds} alternating profiles (10 runs each)\n")
    print(f"{'kernel':<24} {'count':>5} {'torch ms':>9} {'native ms':>9}")
    for k in kinds:
        ms = [med(results[native], lambda r, k=k: r["kinds"].get(k, 0.0)) for native in (False, True)]
        print(f"{k:<24} {results[False][0]['counts'].get(k, 0):>5} {ms[0]:>9.3f} {ms[1]:>9.3f}")
    for label, f in (("kernels", lambda r: r["kernel_ms"]), ("GEMV kinds", lambda r: r["gemv_ms"]),
                     ("non-GEMV kernels", lambda r: r["kernel_ms"] - r["gemv_ms"]),
                     ("runtime's own (timed runs)", lambda r: r["own_ms"]),
                     ("run (profile median)", lambda r: r["run_ms"]),
                     ("decode step ms (Executor.run)", lambda r: r["step_ms"])):
        print(f"{label:<30} {med(results[False], f):>9.3f} {med(results[True], f):>9.3f}")
    for native in (False, True):
        rows = results[native]
        share = med(rows, lambda r: (r["kernel_ms"] - r["gemv_ms"]) / r["run_ms"])
        own = med(rows, lambda r: r["own_ms"] / r["run_ms"])
        print(f"{'native' if native else 'torch'}: non-GEMV kernels {share:.1%} of a run; runtime's own "
              f"{own:.1%}; loop {med(rows, lambda r: r['host_us']):.2f} µs/dispatch × {rows[0]['n']} dispatches")


if __name__ == "__main__":
    main()
