"""GB/s of the weight-only quantized decode GEMV (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K GGUF blocks; each with x as int8 too)
against fp32 and bf16, and the floor.

    .venv/bin/python bench/gemv/qgemv.py                      # Qwen2.5-0.5B decode shapes, one row of x
    .venv/bin/python bench/gemv/qgemv.py --reps 30 --rows 4 --json qgemv.json
    .venv/bin/python bench/gemv/qgemv.py --isa avx2           # the quantized kernel capped at AVX2

For each decode GEMV of Qwen2.5-0.5B (``K x N``: the fused QKV 896 x 1152, o_proj 896 x 896, fused gate+up
896 x 9728, down 4864 x 896, LM head 896 x 151936) times ``y = x · Wᵀ`` by the runtime's kernels:
``cpu_gemv.Gemv`` with fp32 and bf16 weights, ``cpu_qgemv.QGemv`` with Q8_0, Q4_0, Q5_0, Q4_K and Q6_K blocks and
the same with ``activations="int8"`` (``q8_0/i8`` ...: as the runtime runs them, on the 16-row interleaved copies
where the CPU reads them faster (``QGemv.interleave``); ``q8_0/i8g`` ...: on the GGUF layout), each with its
default thread choice (k-quants only
where K is a multiple of 256: the down projection; a cell of "-" elsewhere: llama.cpp's q4_K_M file of the model
stores those rows as Q5_0), and reports weight bytes / median time.
Every call reads the next copy of a ring of
at least ``--pool-mb`` MiB (decode reads weights from memory, not cache), the methods alternate call by call
in a rotating order so that a neighbour's load hits all alike. The floor is ``bandwidth.measure_stream_bandwidth``
(a plain C read loop with all threads and one, and fp32 ``torch.mv``), measured before and after, the better
used: ``x floor`` is the time over the floor's time for the same bytes (1.00 = at memory bandwidth).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bandwidth import measure_stream_bandwidth  # noqa: E402  (bench/gemv, the script's folder)

from npu_runtime.backends import cpu_gemv, cpu_qgemv  # noqa: E402

#: (name, K, N, per token) of Qwen2.5-0.5B (hidden 896, intermediate 4864, K/V 2 x 64, vocab 151936, 24 layers)
SHAPES = [("qkv", 896, 1152, 24), ("o_proj", 896, 896, 24), ("gate+up", 896, 9728, 24), ("down", 4864, 896, 24),
          ("lm_head", 896, 151936, 1)]
METHODS = ("fp32", "bf16", "q8_0", "q8_0/i8", "q8_0/i8g", "q4_0", "q4_0/i8", "q4_0/i8g", "q5_0", "q5_0/i8",
           "q5_0/i8g", "q4_K", "q4_K/i8", "q4_K/i8g", "q6_K", "q6_K/i8", "q6_K/i8g")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def packed(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """``n`` rows of random ``qtype`` blocks, fp16 scales finite (normal * 0.02)."""
    q = cpu_qgemv.QTYPES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // q.block, q.nbytes), dtype=np.uint8)
    for at in {"q4_K": (0, 2), "q6_K": (208,)}.get(qtype, (0,)):  # where the layout keeps its fp16 scales
        d = (rng.standard_normal((n, k // q.block, 1)) * 0.02).astype(np.float16)
        blocks[..., at:at + 2] = d.view(np.uint8)
    return torch.from_numpy(blocks.reshape(n, -1))


def plans(method: str, n: int, k: int, pool: int, isa: str | None) -> tuple[int, list[Callable], Callable]:
    """(weight bytes, one call per copy of the ring, the float64 reference of copy 0 for ``x``)."""
    if method in ("fp32", "bf16"):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
        w = w if method == "fp32" else w.bfloat16()
        copies = [w] + [w.clone() for _ in range(max(1, math.ceil(pool / w.nbytes)) - 1)]
        gemvs = [cpu_gemv.Gemv(c) for c in copies]
        return w.nbytes, [lambda x, y, g=g: g(x, out=y) for g in gemvs], lambda x: x.double() @ w.double().t()
    qtype, _, act = method.partition("/")
    layout, act = act, "int8" if act else "float32"
    w = packed(qtype, n, k, n + k)
    copies = [w] + [w.clone() for _ in range(max(1, math.ceil(pool / w.nbytes)) - 1)]
    gemvs = [cpu_qgemv.QGemv(c, qtype) for c in copies]
    if layout == "i8":  # as the runtime's linear layers do: the 16-row interleaved copy where the CPU reads it
        for g in gemvs:
            g.interleave()
    ref = cpu_qgemv.dequantize(w, qtype).double()
    xq = cpu_qgemv.quantize_x if act == "int8" else (lambda x: x)  # the int8 contract's x, for the check
    return w.nbytes, [lambda x, y, g=g: g(x, out=y, isa=isa, activations=act) for g in gemvs], \
        lambda x: xq(x).double() @ ref.t()


def applies(method: str, k: int) -> bool:
    """k-quants hold rows of whole 256-weight super-blocks only."""
    return cpu_qgemv.QTYPES.get(method.split("/")[0]) is None or k % cpu_qgemv.QTYPES[method.split("/")[0]].block == 0


def time_shape(n: int, k: int, reps: int, pool: int, rows: int, isa: str | None) -> dict[str, tuple[int, list]]:
    """Per method: (weight bytes, seconds of each timed call)."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    y = torch.empty(rows, n)
    methods = tuple(m for m in METHODS if applies(m, k))
    calls, nbytes, samples = {}, {}, {m: [] for m in methods}
    for method in methods:
        nbytes[method], calls[method], ref = plans(method, n, k, pool, isa)
        calls[method][0](x, y)
        want = ref(x)
        if not torch.allclose(y.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item()):
            raise SystemExit(f"{method} [{n}, {k}]: wrong result, max error {(y.double() - want).abs().max():.3g}")
    for rep in range(reps + 3):  # warm-up rounds: page faults, thread pools, the thread policy's first tries
        for method in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            ring = calls[method]
            start = time.perf_counter()
            ring[rep % len(ring)](x, y)
            if rep >= 3:
                samples[method].append(time.perf_counter() - start)
    return {m: (nbytes[m], samples[m]) for m in methods}


def report(results: dict, floor: float, stream: tuple, args: argparse.Namespace, load: str) -> None:
    print(f"# Quantized GEMV, Qwen2.5-0.5B decode shapes, {args.rows} row(s) of x, {torch.get_num_threads()} "
          f"threads, cold (ring of >= {args.pool_mb} MiB), median of {args.reps}\n")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; fp32/bf16: "
          f"{cpu_gemv.native_status()}; quantized: {cpu_qgemv.native_status()}"
          f"{f' (capped at {args.isa})' if args.isa else ''}\n")
    print(f"load average before / after: {load} / {os.getloadavg()[0]:.2f}; streaming floor {floor:.1f} GB/s "
          f"(before {stream[0].gbs:.1f}, after {stream[1].gbs:.1f}; C read loop {stream[0].c_read:.1f} all threads, "
          f"{stream[0].c_read_1:.1f} one; fp32 torch.mv {stream[0].torch_mv:.1f})\n")
    print("| weight | K x N | " + " | ".join(f"{m} MiB | {m} µs | {m} GB/s | {m} x floor" for m in METHODS) + " |")
    print("|---|---|" + "---:|" * 4 * len(METHODS))
    for name, k, n, _ in SHAPES:
        cells = []
        for m in METHODS:
            if m not in results[name]:
                cells.append("- | - | - | -")
                continue
            nbytes, s = results[name][m]
            t = statistics.median(s)
            gbs = nbytes / t / 1e9
            cells.append(f"{nbytes / 2**20:.1f} | {t * 1e6:.0f} | {gbs:.1f} | {floor / gbs:.2f}")
        print(f"| {name} | {k} x {n} | " + " | ".join(cells) + " |")
    print("\nPer token (24 layers of qkv, o_proj, gate+up, down, and the LM head; sum of medians; the types that"
          " hold every shape):\n")
    print("| weights | MB/token | floor ms | ms | x floor | speed-up over fp32 | over bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    every = [m for m in METHODS if all(m in results[s[0]] for s in SHAPES)]
    tot = {m: (sum(results[s[0]][m][0] * s[3] for s in SHAPES),
               sum(statistics.median(results[s[0]][m][1]) * s[3] for s in SHAPES)) for m in every}
    for m in every:
        nbytes, t = tot[m]
        floor_s = nbytes / floor / 1e9
        print(f"| {m} | {nbytes / 1e6:.0f} | {floor_s * 1e3:.2f} | {t * 1e3:.2f} | {t / floor_s:.2f}"
              f" | {tot['fp32'][1] / t:.2f}x | {tot['bf16'][1] / t:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="timed calls per method and shape (median)")
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1 = one-token decode)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (the kernels use it)")
    parser.add_argument("--pool-mb", type=int, default=512, help="each shape's ring of weight copies, MiB")
    parser.add_argument("--stream-mb", type=int, default=1024, help="buffer of the bandwidth measurement, MiB")
    parser.add_argument("--isa", choices=list(cpu_qgemv.ISAS), default=None, help="cap the quantized kernel")
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.reps < 1 or args.rows < 1:
        parser.error("--reps and --rows must be positive")
    load = f"{os.getloadavg()[0]:.2f}"
    log("measuring the streaming bandwidth ...")
    before = measure_stream_bandwidth(args.stream_mb << 20, reps=max(10, args.reps))
    results = {}
    for name, k, n, _ in SHAPES:
        log(f"{name} K={k} N={n} ...")
        results[name] = time_shape(n, k, args.reps, args.pool_mb << 20, args.rows, args.isa)
    after = measure_stream_bandwidth(args.stream_mb << 20, reps=max(10, args.reps))
    floor = max(before.gbs, after.gbs)
    report(results, floor, (before, after), args, load)
    if args.json:
        args.json.write_text(json.dumps({"floor_gbs": floor, "threads": torch.get_num_threads(), "rows": args.rows,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
