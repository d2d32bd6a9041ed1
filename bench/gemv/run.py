"""GB/s of one-token decode GEMMs (GEMV) on the CPU: PyTorch's call paths against the runtime's kernel.

    .venv/bin/python bench/gemv/run.py                               # Qwen2.5-0.5B and 1.5B shapes, fp32 and bf16
    .venv/bin/python bench/gemv/run.py --models 0.5b --dtypes bfloat16 --reps 50
    .venv/bin/python bench/gemv/run.py --hot                         # weights left in cache (not decode)
    .venv/bin/python bench/gemv/run.py --threads 1 --json gemv.json

For every weight of a Qwen2.5 decoder layer and the LM head (``[N, K]``, ``nn.Linear`` layout), times
``y = x · Wᵀ`` with one row of ``x`` by ``F.linear``, ``torch.mv`` (``torch.mm`` for ``--rows`` > 1),
``npu_runtime.backends.cpu_gemv`` as the CPU backend's ``GEMM`` kernel runs it for decode ("ours": one
thread or all, whichever ran faster lately) and the same kernel forced to one thread, and reports weight
bytes / median time.

Decode reads every weight once per token, from memory, never from cache (a 0.5B model is 1-2 GB). So by
default each call reads a different copy of the weight, from a ring of copies of at least ``--pool-mb``
MiB (several times the last-level cache): a GEMV that fits in L3 would otherwise show cache speed.
The callers alternate call by call, in an order that rotates, so a neighbour's load hits all alike.

The floor: ``bandwidth.measure_stream_bandwidth`` (the best of a plain C read loop with all threads and
with one, and fp32 ``torch.mv``, over a 1 GiB matrix, medians), measured before and after; the better of
the two runs is used. ``vs floor`` is our time over the floor's time for the same bytes (1.00 = at memory
bandwidth). The last table weights the layers by how many a token runs (the decoder layers and the LM
head): the decode step's GEMVs, as the end-to-end benchmark sees them. The load average is printed: on
the shared 2-core machine other processes move every number, two-thread ones most.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from bandwidth import measure_stream_bandwidth  # noqa: E402  (bench/gemv, the script's folder)

from npu_runtime.backends import cpu_gemv  # noqa: E402

# Qwen2.5 configs (config.json of the checkpoints): hidden, intermediate, vocab, kv heads * head dim, layers
MODELS = {
    "0.5b": dict(hidden=896, intermediate=4864, vocab=151936, kv=128, layers=24),
    "1.5b": dict(hidden=1536, intermediate=8960, vocab=151936, kv=256, layers=28),
}
METHODS = ("F.linear", "torch.mv", "ours", "ours 1t")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def shapes(cfg: dict[str, int]) -> list[tuple[str, int, int, int]]:
    """(name, N, K, how many a token runs) of one model's weights."""
    h, i, v, kv, layers = cfg["hidden"], cfg["intermediate"], cfg["vocab"], cfg["kv"], cfg["layers"]
    return [("q_proj", h, h, layers), ("k_proj/v_proj", kv, h, 2 * layers), ("o_proj", h, h, layers),
            ("gate/up_proj", i, h, 2 * layers), ("down_proj", h, i, layers), ("lm_head", v, h, 1)]


@dataclass
class Row:
    model: str
    layer: str
    n: int
    k: int
    dtype: str
    count: int  # per token
    nbytes: int
    copies: int
    gbs: dict[str, float]  # method -> weight bytes / median time
    samples_us: dict[str, list[float]]


def time_shape(n: int, k: int, dtype: torch.dtype, reps: int, pool_bytes: int, rows: int) -> tuple[int, dict, dict]:
    """Median time of each method on ``[n, k]``, each call on the next copy of a ring of weights."""
    nbytes = n * k * torch.empty((), dtype=dtype).element_size()
    copies = max(1, math.ceil(pool_bytes / nbytes))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, k, generator=gen).to(dtype)
    out = torch.empty(rows, n, dtype=dtype)
    plans = [cpu_gemv.Gemv(w) for w in weights]
    for plan in plans:  # decode calls a plan every token: its first call's one-off scan of a bf16 weight is no token's
        plan(x, out=out)
    calls: dict[str, Callable[[int], object]] = {
        "F.linear": lambda c: F.linear(x, weights[c]),
        "torch.mv": lambda c: torch.mv(weights[c], x[0]) if rows == 1 else torch.mm(x, weights[c].t()),
        "ours": lambda c: plans[c](x, out=out),
        "ours 1t": lambda c: plans[c](x, out=out, threads=1),
    }
    want = F.linear(x.double(), weights[0].double())
    got = plans[0](x, out=out).double()
    if not torch.allclose(got, want, rtol=1e-2 if dtype != torch.float32 else 1e-4, atol=1e-2):
        raise SystemExit(f"wrong result for [{n}, {k}] {dtype}: max error {(got - want).abs().max():.3g}")
    samples: dict[str, list[float]] = {m: [] for m in METHODS}
    turn = 0
    for rep in range(reps + 4):  # warm-up rounds: thread pools, page faults, the thread policy's first tries
        # the order rotates: torch's OpenMP threads keep spinning for a while after its call and slow down
        # whatever runs next when a neighbour holds the other core, so no method may always follow another
        for method in METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]:
            copy = turn % copies
            turn += 1
            start = time.perf_counter()
            calls[method](copy)
            if rep >= 4:
                samples[method].append(time.perf_counter() - start)
    gbs = {m: nbytes / statistics.median(s) / 1e9 for m, s in samples.items()}
    return copies, gbs, {m: [round(t * 1e6, 1) for t in s] for m, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--reps", type=int, default=20, help="timed calls per method and shape (median)")
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1 = one-token decode)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (our kernel uses it too)")
    parser.add_argument("--pool-mb", type=int, default=512, help="each shape's ring of weight copies, MiB")
    parser.add_argument("--hot", action="store_true", help="one copy per shape: weights stay in cache")
    parser.add_argument("--stream-mb", type=int, default=1024, help="buffer of the bandwidth measurement, MiB")
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.reps < 1 or args.rows < 1:
        parser.error("--reps and --rows must be positive")

    log(f"kernel: {cpu_gemv.native_status()}")
    load_before = f"{os.getloadavg()[0]:.2f}"
    log("measuring the streaming bandwidth ...")
    stream = measure_stream_bandwidth(args.stream_mb << 20, reps=max(10, args.reps))
    pool = 0 if args.hot else args.pool_mb << 20
    rows: list[Row] = []
    for model in args.models:
        for dtype_name in args.dtypes:
            for layer, n, k, count in shapes(MODELS[model]):
                log(f"{model} {layer} [{n}, {k}] {dtype_name} ...")
                copies, gbs, samples = time_shape(n, k, DTYPES[dtype_name], args.reps, pool, args.rows)
                nbytes = n * k * DTYPES[dtype_name].itemsize
                rows.append(Row(model, layer, n, k, dtype_name, count, nbytes, copies, gbs, samples))
    stream_after = measure_stream_bandwidth(args.stream_mb << 20, reps=max(10, args.reps))

    print(f"# GEMV bandwidth, {args.rows} row(s) of x, {torch.get_num_threads()} threads, "
          f"{'hot (one copy)' if args.hot else f'cold (ring of >= {args.pool_mb} MiB)'}\n")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
          f"kernel: {cpu_gemv.native_status()}\n")
    print(f"load average before / after: {load_before} / {os.getloadavg()[0]:.2f} (other processes on the cores "
          "make every number here lower, the two-thread ones most)\n")
    print(f"streaming bandwidth (the floor), GB/s: {stream.gbs:.1f} before, {stream_after.gbs:.1f} after; "
          f"C read loop {stream.c_read:.1f} / {stream_after.c_read:.1f} ({stream.threads} threads), "
          f"{stream.c_read_1:.1f} / {stream_after.c_read_1:.1f} (1 thread), fp32 torch.mv {stream.torch_mv:.1f} / "
          f"{stream_after.torch_mv:.1f}; {stream.nbytes >> 20} MiB\n")
    floor = max(stream.gbs, stream_after.gbs)
    print("| model | weight | N x K | dtype | MiB | F.linear GB/s | torch.mv GB/s | ours GB/s | ours 1 thread GB/s "
          "| ours vs floor |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.model} | {r.layer} | {r.n} x {r.k} | {r.dtype} | {r.nbytes / 2**20:.1f} | "
              + " | ".join(f"{r.gbs[m]:.1f}" for m in METHODS) + f" | {floor / r.gbs['ours']:.2f}x |")
    print("\nPer token (every layer's GEMVs and the LM head, weighted by count; time = sum of bytes / GB/s):\n")
    print("| model | dtype | weight MB/token | floor ms | F.linear ms | torch.mv ms | ours ms | ours 1 thread ms "
          "| ours vs floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        for dtype_name in args.dtypes:
            sel = [r for r in rows if r.model == model and r.dtype == dtype_name]
            total = sum(r.nbytes * r.count for r in sel)
            ms = {m: sum(r.nbytes * r.count / r.gbs[m] for r in sel) / 1e6 for m in METHODS}
            floor_ms = total / floor / 1e6
            print(f"| {model} | {dtype_name} | {total / 1e6:.0f} | {floor_ms:.1f} | "
                  + " | ".join(f"{ms[m]:.1f}" for m in METHODS) + f" | {ms['ours'] / floor_ms:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"stream": [asdict(stream), asdict(stream_after)], "floor_gbs": floor,
                                         "threads": torch.get_num_threads(), "hot": args.hot,
                                         "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
