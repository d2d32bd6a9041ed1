"""Where a chained decode step's time goes: each dispatch timed inside the one C call that makes it.

    .venv/bin/python bench/llm/chain_profile.py bench/llm/llamacpp/models/0.5b/qwen2.5-0.5b-q4_0.gguf --int8-activations

``Executor.profile`` times each dispatch from Python, so it runs a step dispatch by dispatch; this one runs the step
as ``Executor.run`` does, its native dispatches chained (``npu_runtime.backends.cpu_chain``), with each call timed in
C (``Chains.run(seconds)``: one clock read per call) and the other dispatches from Python. The model (a GGUF file or a
checkpoint folder, as ``load_lm`` takes it) is prefilled up to ``--position``, then ``--runs`` decode steps at that
position are timed; printed: per kernel kind the dispatches, ms per step (sum of per-dispatch medians) and share; per
weight of the contractions its bytes, µs and GB/s; the step's ms (``Executor.run``, median) and the floor (the
weight bytes read per step over the C stream-read bandwidth of ``bench/gemv/bandwidth.py``, measured before and
after). A shared machine's timings: compare rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gemv"))


def weight_bytes(kernel) -> int:
    """The bytes a contraction kernel's decode call reads: each part's interleaved copy where the int8 path reads
    one, else its weight (blocks or floats)."""
    linear = getattr(kernel, "linear", None)
    if linear is None:
        return 0
    if hasattr(linear, "parts"):  # cpu_blocks.BlockLinear
        total = 0
        for part in linear.parts:
            gemv = part.gemv
            if gemv is None:
                total += part.matrix.nbytes
            else:
                copy = gemv._w16 if linear.int8 else None
                total += (copy if copy is not None else gemv.weight).nbytes
        return total
    return linear.gemv.weight.nbytes  # cpu_kernels._Linear


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--int8-activations", action="store_true")
    p.add_argument("--position", type=int, default=128)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from bandwidth import measure_stream_bandwidth

    from npu_runtime import Device, load_weights
    from npu_runtime.generate import Generator
    from npu_tools.lm_source import load_lm

    lm = load_lm(args.model, max_cache_len=args.position + 8, chunk=args.position,
                 int8_activations=args.int8_activations)
    device = Device()
    generator = Generator(lm.programs.prefill, lm.programs.decode,
                          load_weights(lm.weights, lm.programs.prefill, device), device)
    generator.generate(list(range(1, args.position + 1)), 1)
    ex = generator.decode_exec
    inputs = {"input_ids": np.array([[7]]), "cache_position": np.array([args.position])}
    floor_gbs = measure_stream_bandwidth(threads=args.threads, reps=10).gbs
    steps, per_dispatch = [], [[] for _ in ex.steps]
    for _ in range(3):  # warm: the plan is made on the first run
        ex.run(inputs)
    for _ in range(args.runs):
        start = time.perf_counter()
        ex.run(inputs)
        steps.append((time.perf_counter() - start) * 1e3)
        seconds = [0.0] * len(ex.steps)
        ex.copy_in(inputs)
        ex.chains.run(seconds)
        for i, s in enumerate(seconds):
            per_dispatch[i].append(s)
    floor_gbs = max(floor_gbs, measure_stream_bandwidth(threads=args.threads, reps=10).gbs)
    med_us = [statistics.median(t) * 1e6 for t in per_dispatch]
    kinds: dict[str, list[float]] = defaultdict(list)
    weights: dict[tuple[str, int], list[float]] = defaultdict(list)
    for dispatch, kernel, us in zip(ex.program.dispatches, ex.kernels, med_us):
        kind = dispatch.kernel if not dispatch.kernel.startswith("aten.") else "host ops (aten.*)"
        kinds[kind].append(us)
        nbytes = weight_bytes(kernel)
        if nbytes:
            weights[(dispatch.kernel, nbytes)].append(us)
    total_us = sum(med_us)
    read = sum(n * len(v) for (_, n), v in weights.items())
    print(f"{args.model.name}{' (int8 x)' if args.int8_activations else ''}: decode at position {args.position}, "
          f"{args.threads} threads, {args.runs} runs; {ex.chains.chained()} of {len(ex.steps)} dispatches chained\n")
    print("| kernel | dispatches | ms / step | share |")
    print("|---|---:|---:|---:|")
    for kind, us in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {kind} | {len(us)} | {sum(us) / 1e3:.3f} | {sum(us) / total_us:.1%} |")
    print("\n| contraction | weight MB | calls | µs each (median) | GB/s |")
    print("|---|---:|---:|---:|---:|")
    for (kind, nbytes), us in sorted(weights.items(), key=lambda kv: -kv[0][1] * len(kv[1])):
        each = statistics.median(us)
        print(f"| {kind} | {nbytes / 1e6:.2f} | {len(us)} | {each:.0f} | {nbytes / each / 1e3:.1f} |")
    gemv_us = sum(sum(v) for v in weights.values())
    floor_ms = read / floor_gbs / 1e6
    print(f"\ndispatches timed: {total_us / 1e3:.2f} ms a step (contractions {gemv_us / 1e3:.2f} ms, reading "
          f"{read / 1e6:.0f} MB at {read / gemv_us / 1e3:.1f} GB/s); Executor.run: {statistics.median(steps):.2f} ms "
          f"(median; min {min(steps):.2f}); floor {floor_ms:.2f} ms ({floor_gbs:.1f} GB/s C stream read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
