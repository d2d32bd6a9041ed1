"""One decode token's attention over a KV cache: the runtime's C kernel against PyTorch's fused attention.

    .venv/bin/python bench/llm/decode_attention.py [--positions 128 512 2048] [--dtypes float32 bfloat16 float16]

Qwen2.5-0.5B's heads (14 query heads over 2 key/value heads of 64), one query token, the cache filled up to each
``--positions`` count (a bool mask of the positions seen, as a decode program passes it). Timed, alternating call by
call, ``--reps`` times each: ``cpu_decode_ops.attention`` (what a chained decode step runs, one thread) and
PyTorch's ``scaled_dot_product_attention`` on the seen positions (``enable_gqa``, torch's threads). Printed: medians
in µs, ours over PyTorch's, the cache bytes read per token over the C stream-read bandwidth
(``bench/gemv/bandwidth.py``: the floor were the kernel bound by memory; it is not, the products are), and the
largest difference from float64 (checked first: beyond one rounding to the dtype it stops).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemv"))

HEADS, KV_HEADS, DIM = 14, 2, 64
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the largest |ours - float64| accepted: fp32 sums, then one rounding of a |value| < 4 to the dtype
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9}


def time_pair(ours, theirs, reps: int) -> tuple[float, float]:
    """Median µs of each, alternating call by call (after two warm-up calls each)."""
    times: tuple[list[int], list[int]] = ([], [])
    for _ in range(2):
        ours(), theirs()
    for _ in range(reps):
        for fn, out in ((ours, times[0]), (theirs, times[1])):
            start = time.perf_counter_ns()
            fn()
            out.append(time.perf_counter_ns() - start)
    return statistics.median(times[0]) / 1e3, statistics.median(times[1]) / 1e3


def row(dtype: torch.dtype, positions: int, cache: int, reps: int, gbs: float | None) -> str:
    from npu_runtime.backends import cpu_decode_ops

    g = torch.Generator().manual_seed(positions)
    q = torch.randn(1, HEADS, 1, DIM, generator=g).to(dtype)
    k, v = (torch.randn(1, KV_HEADS, cache, DIM, generator=g).to(dtype) for _ in range(2))
    mask = (torch.arange(cache) < positions).view(1, 1, 1, cache)
    out = torch.empty(1, 1, HEADS * DIM, dtype=dtype)
    scale = DIM ** -0.5

    def ours() -> None:
        if not cpu_decode_ops.attention(q, k, v, mask, out, scale):
            raise SystemExit(f"no native decode attention here: {cpu_decode_ops.native_status()}")

    def theirs() -> None:
        F.scaled_dot_product_attention(q, k[:, :, :positions], v[:, :, :positions], scale=scale, enable_gqa=True)

    ours()
    want = F.scaled_dot_product_attention(q.double(), k[:, :, :positions].double(), v[:, :, :positions].double(),
                                          scale=scale, enable_gqa=True)
    err = (out.double().view_as(want) - want).abs().max().item()
    if err > TOLERANCE[dtype]:  # fp32 arithmetic, one rounding to the dtype: a wrong kernel is not timed
        raise SystemExit(f"decode attention, {dtype}, {positions} positions: off by {err:.2e} from float64")
    us, torch_us = time_pair(ours, theirs, reps)
    cache_bytes = 2 * KV_HEADS * positions * DIM * dtype.itemsize
    floor = f"{cache_bytes / (gbs * 1e3):.1f}" if gbs else "-"
    return (f"| {str(dtype).removeprefix('torch.')} | {positions} | {us:.0f} | {torch_us:.0f} | {us / torch_us:.2f} | "
            f"{floor} | {err:.1e} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16", "float16"])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--no-floor", action="store_true", help="skip the stream-read measurement")
    args = parser.parse_args(argv)
    if any(p < 1 for p in args.positions) or args.reps < 1:
        parser.error("--positions and --reps must be at least 1")
    gbs = None
    if not args.no_floor:
        from bandwidth import measure_stream_bandwidth

        gbs = measure_stream_bandwidth(nbytes=256 << 20).gbs
    print(f"# Decode attention, {HEADS} heads over {KV_HEADS} KV heads of {DIM}, one token, {torch.get_num_threads()} "
          f"torch threads, medians of {args.reps}\n")
    print("| dtype | positions | ours µs | PyTorch SDPA µs | ours / PyTorch | cache-read floor µs | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.dtypes:
        for positions in args.positions:
            print(row(DTYPES[name], positions, max(args.positions), args.reps, gbs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
