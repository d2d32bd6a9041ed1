"""Prefill (many rows of x) over GGUF block weights: the quantized GEMV, the tiled path, and torch.mm on fp32.

    .venv/bin/python bench/gemv/qprefill.py                       # rows 1, 8, 16, 32, 128; q8_0, q4_0, q4_K
    .venv/bin/python bench/gemv/qprefill.py --threads 1 --reps 15 --rows 16 32 --tile-rows 64 128 256

For Qwen2.5-0.5B's down (K 4864 -> N 896) and gate+up (896 -> 9728) and Qwen2.5-1.5B's QKV (1536 -> 2048) and down
(8960 -> 1536), ``y = x · dequant(W)ᵀ`` is timed by three methods, call by call in a rotating order so that a
neighbour's load hits all alike:

* ``gemv``: ``cpu_qgemv.QGemv`` forced onto its GEMV kernel (``path="gemv"``): passes of up to 8 rows of x over
  the blocks, each pass decoding every weight again;
* ``tiled``: the same object forced onto its prefill path (``path="tiled"``): rows of W dequantized into a tile,
  then ``torch.mm`` into the tile's columns, for each ``--tile-rows`` (``TILE_ROWS``);
* ``default``: what a call runs (the GEMV below ``PREFILL_ROWS`` rows, else the path its policy measured faster),
  with the first ``--tile-rows``;
* ``mm``: ``torch.mm`` with the weights dequantized to fp32 beforehand (4x-7.5x the bytes in memory): the float
  path an LLM program takes without blocks;
* with ``--int8``, llama.cpp's int8 activations two ways: ``int8 gemv``, the integer kernel
  (``activations="int8"``: x quantized per group of 32, up to 8 rows of x per pass over the blocks), and ``int8
  rounded``, x rounded to int8 groups by torch (``quantize_x``) then the default float path, as an LLM's prefill
  ran them before the integer kernel took several rows per pass (both checked against the rounded x's product);
  and ``int8 copy``, the integer kernel on the 16-row interleaved copy (``QGemv.interleave(always=True)``; what the
  runtime reads where the CPU has AVX-512 VNNI, and on AVX2 for ``cpu_qgemv.X16_AVX2_QTYPES``: from 4 rows of x
  each group of 16 rows decoded once per call, ``gemv_q_x16t.c``); and ``int8 groups``, that kernel reading the
  GGUF layout itself 16 rows at a time (``path="groups"``: Q8_0 and Q6_K, which keep no copy on AVX2; the copy's
  results bit for bit, without its memory).

Every call reads the next copy of a ring of at least ``--pool-mb`` MiB per method (a prefill reads each layer's
weights from memory, not from cache). The results are checked against the float64 product first. The
crossover printed is the fewest rows from which the tiled path is faster than the GEMV in every shape and type.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from qgemv import packed  # noqa: E402  (bench/gemv, the script's folder)

from npu_runtime.backends import cpu_qgemv  # noqa: E402

#: (name, K, N)
SHAPES = [("0.5B down", 4864, 896), ("0.5B gate+up", 896, 9728), ("1.5B qkv", 1536, 2048), ("1.5B down", 8960, 1536)]


def ring(make: Callable[[], object], nbytes: int, pool: int) -> list:
    return [make() for _ in range(max(1, math.ceil(pool / nbytes)))]


def methods(qtype: str, n: int, k: int, pool: int, tiles: list[int],
            int8: bool = False) -> tuple[dict[str, list[Callable]], Callable]:
    """Per method, one call per copy of its ring; and the float64 reference for x."""
    w = packed(qtype, n, k, n + k)
    wf = cpu_qgemv.dequantize(w, qtype)
    gemvs = [cpu_qgemv.QGemv(c, qtype) for c in ring(w.clone, w.nbytes, pool)]
    floats = ring(wf.clone, wf.nbytes, pool)

    def tiled(g: cpu_qgemv.QGemv, tile: int, x: torch.Tensor, y: torch.Tensor) -> None:
        cpu_qgemv.TILE_ROWS = tile or None
        g(x, out=y, path="tiled")

    calls = {"gemv": [lambda x, y, g=g: g(x, out=y, path="gemv") for g in gemvs]}
    for tile in tiles:
        calls[f"tiled {tile}"] = [lambda x, y, g=g, t=tile: tiled(g, t, x, y) for g in gemvs]
    calls["default"] = [lambda x, y, g=g, t=tiles[0]: (setattr(cpu_qgemv, "TILE_ROWS", t or None), g(x, out=y))
                        for g in gemvs]
    calls["mm fp32"] = [lambda x, y, f=f: torch.mm(x, f.t(), out=y) for f in floats]
    if int8:
        calls["int8 gemv"] = [lambda x, y, g=g: g(x, out=y, activations="int8") for g in gemvs]
        calls["int8 rounded"] = [lambda x, y, g=g: g(cpu_qgemv.quantize_x(x), out=y) for g in gemvs]
        copies = [cpu_qgemv.QGemv(c, qtype) for c in ring(w.clone, w.nbytes, pool)]
        if all(g.interleave(always=True) for g in copies):  # a CPU with AVX2 or better
            calls["int8 copy"] = [lambda x, y, g=g: g(x, out=y, activations="int8") for g in copies]
        if gemvs[0].groups():  # Q8_0, Q6_K on AVX2: the copy's prefill kernel on the GGUF layout
            calls["int8 groups"] = [lambda x, y, g=g: g(x, out=y, activations="int8", path="groups") for g in gemvs]
    ref = wf.double()
    return calls, lambda x: x.double() @ ref.t()


def time_case(qtype: str, n: int, k: int, m: int, args: argparse.Namespace) -> dict[str, list[float]]:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = torch.empty(m, n)
    calls, ref = methods(qtype, n, k, args.pool_mb << 20, args.tile_rows, args.int8)
    want, want8 = ref(x), ref(cpu_qgemv.quantize_x(x))
    for name, ring_ in calls.items():
        ring_[0](x, y)
        expect = want8 if name.startswith("int8") else want
        if not torch.allclose(y.double(), expect, rtol=1e-4, atol=1e-4 * expect.abs().max().item()):
            raise SystemExit(f"{name} {qtype} [{m}, {k}] x [{n}]: wrong result")
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps + 2):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            call = calls[name][rep % len(calls[name])]
            start = time.perf_counter()
            call(x, y)
            if rep >= 2:
                samples[name].append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 128], help="rows of x (M)")
    parser.add_argument("--types", nargs="+", default=["q8_0", "q4_0", "q4_K"], choices=list(cpu_qgemv.QTYPES))
    parser.add_argument("--tile-rows", type=int, nargs="+", default=[0],
                        help="TILE_ROWS of the tiled path (several: one column each; 0: by K, the default)")
    parser.add_argument("--reps", type=int, default=9, help="timed calls per method and case (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (the kernels use it)")
    parser.add_argument("--pool-mb", type=int, default=64, help="each method's ring of weight copies, MiB")
    parser.add_argument("--shapes", nargs="+", default=None, help="a subset of the shapes, by name")
    parser.add_argument("--int8", action="store_true", help="also time the int8-activation paths")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = f"{os.getloadavg()[0]:.2f}"
    shapes = [s for s in SHAPES if args.shapes is None or s[0] in args.shapes]
    print(f"# Prefill over block weights: ms per call (median of {args.reps}, min in brackets), "
          f"{torch.get_num_threads()} threads; {cpu_qgemv.native_status()}; load average {load} before\n")
    names = None
    faster: dict[int, bool] = {m: True for m in args.rows}
    for label, k, n in shapes:
        for qtype in args.types:
            if k % cpu_qgemv.QTYPES[qtype].block:
                continue
            for m in args.rows:
                print(f"{label} {qtype} M={m} ...", file=sys.stderr, flush=True)
                s = time_case(qtype, n, k, m, args)
                if names is None:
                    names = list(s)
                    print("| shape (K -> N) | type | M | " + " | ".join(names) + " | best tiled / gemv |")
                    print("|---|---|---:|" + "---:|" * (len(names) + 1))
                med = {name: statistics.median(v) * 1e3 for name, v in s.items()}
                best = min(med[name] for name in names if name.startswith("tiled"))
                faster[m] &= best < med["gemv"]
                cells = " | ".join(f"{med[name]:.3f} ({min(s[name]) * 1e3:.3f})" for name in names)
                print(f"| {label} ({k} -> {n}) | {qtype} | {m} | {cells} | {best / med['gemv']:.2f} |", flush=True)
    wins = [m for m in sorted(faster) if faster[m] and all(faster[r] for r in faster if r >= m)]
    print(f"\nload average after: {os.getloadavg()[0]:.2f}; the tiled path is faster in every case from M = "
          f"{wins[0] if wins else '(none of these)'} (cpu_qgemv.PREFILL_ROWS = {cpu_qgemv.PREFILL_ROWS})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
