"""A prefill's GEMMs over float weights (fp32, bf16, fp16): the runtime's own against oneDNN's, MKL's and PyTorch's
half GEMM, with the FMA units' peak as the floor.

    .venv/bin/python bench/gemv/prefill.py                        # 128 rows; Qwen2.5-0.5B / 1.5B and BERT-base shapes
    .venv/bin/python bench/gemv/prefill.py --rows 32 128 --dtypes float16 --reps 9 --threads 1

``y = x · Wᵀ + b`` with ``x [rows, K]``, ``W [N, K]`` and ``y`` of one dtype, timed call by call in a rotating order
(a neighbour's load hits every method alike), by:

* ``ours``: ``cpu_gemv.Gemv(W, b).tiled_mm(x, y)``, the prefill GEMM of ``gemm_tiles.c`` (panels of 24 columns of W
  widened to fp32 as they are packed, 4 x 24 blocks of fp32 sums in registers, one rounding), what the CPU backend's
  contractions run for a prefill where AVX2 is the CPU's best kernel;
* ``widened tiles`` (bf16, fp16): ``Gemv.widened_mm``, fp32 tiles of the widened weight multiplied by ``torch.mm``
  (what a half prefill ran before, and still runs on AVX-512 CPUs without the dtype's dot products);
* ``oneDNN fp32``: ``torch.ops.mkldnn._linear_pointwise`` on fp32 x and W (a half W widened beforehand: twice its
  bytes), what an fp32 prefill ran before;
* ``torch.mm fp32``: ``torch.addmm`` on the same fp32 tensors (MKL's GEMM in PyTorch's CPU build);
* ``torch half``: ``torch.addmm`` in bf16 / fp16, PyTorch's own half GEMM.

GMAC/s are multiply-adds over the median time of ``--reps`` calls (after two warm-up rounds). The floor is the FMA
units' peak on the same threads (``fma_peak.c``: twelve register-resident chains of 8-lane FMAs per thread, the best
of three runs), and ``ours / peak`` the share of it a call reaches; ``ours / best peer`` is our time over the fastest
other method's (below 1.00: ours is faster). Every method's result is first checked against the float64 product.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_runtime.backends import cpu_gemv, cpu_gemv_build  # noqa: E402

#: (name, K, N): Qwen2.5-0.5B (hidden 896, intermediate 4864), Qwen2.5-1.5B (1536, 8960), BERT-base (768, 3072)
SHAPES = [("0.5B qkv", 896, 1152), ("0.5B gate+up", 896, 9728), ("0.5B down", 4864, 896),
          ("1.5B gate+up", 1536, 17920), ("1.5B down", 8960, 1536),
          ("BERT qkv", 768, 2304), ("BERT up", 768, 3072), ("BERT down", 3072, 768)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: relative error each dtype's result may have against float64, beyond fp32's sums
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
FMA_SOURCE = Path(__file__).resolve().parent / "fma_peak.c"


def fma_peak(threads: int, seconds: float = 0.3) -> float | None:
    """The FMA units' fp32 multiply-adds per second on ``threads`` threads at once (GMAC/s, best of three), or None
    where ``fma_peak.c`` cannot be built or the CPU has no AVX2/FMA."""
    try:
        lib, _ = cpu_gemv_build.open_library(FMA_SOURCE.read_text(encoding="utf-8"), "fma_peak")
    except cpu_gemv_build.BuildError as exc:
        print(f"no FMA peak: {exc}", file=sys.stderr)
        return None
    lib.fma_peak_run.argtypes, lib.fma_peak_run.restype = [ctypes.c_int64], ctypes.c_float
    if not lib.fma_peak_isa():
        return None
    iters = 1 << 16
    start = time.perf_counter()
    lib.fma_peak_run(iters)
    iters = max(iters, int(iters * seconds / max(time.perf_counter() - start, 1e-6)))
    best = 0.0
    for _ in range(3):  # ctypes releases the GIL: the threads run the loop on as many cores
        workers = [threading.Thread(target=lib.fma_peak_run, args=(iters,)) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, threads * iters * 96 / (time.perf_counter() - start) / 1e9)
    return best


def methods(dtype: torch.dtype, w: torch.Tensor, b: torch.Tensor, x: torch.Tensor
            ) -> dict[str, Callable[[], torch.Tensor]]:
    """The calls timed for one shape and dtype, each returning ``y``."""
    gemv, out = cpu_gemv.Gemv(w, b), torch.empty(x.shape[0], w.shape[0], dtype=dtype)
    x32, w32, b32 = x.float(), w.float().contiguous(), b.float()

    def ours() -> torch.Tensor:
        if not gemv.tiled_mm(x, out):
            raise SystemExit("the prefill GEMM does not run here: it needs gcc and AVX2 as the CPU's best kernel "
                             "(on an AVX-512 CPU set TORCH_IR_GEMV_ISA=avx2 to time it)")
        return out

    calls = {"ours": ours}
    if dtype != torch.float32:
        calls["widened tiles"] = lambda: out if gemv.widened_mm(x, out) else torch.addmm(b, x, w.t(), out=out)
    if torch.backends.mkldnn.is_available():
        calls["oneDNN fp32"] = lambda: torch.ops.mkldnn._linear_pointwise(x32, w32, b32, "none", [], "")
    calls["torch.mm fp32"] = lambda: torch.addmm(b32, x32, w32.t())
    if dtype != torch.float32:
        calls["torch half"] = lambda: torch.addmm(b, x, w.t())
    return calls


def check(name: str, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    exact = x.double() @ w.double().t() + b.double()
    sums = (x.shape[1] + 1) * 2.0 ** -24 * (x.double().abs() @ w.double().abs().t() + b.double().abs())
    bound = sums + exact.abs() * TOLERANCE[dtype] + 1e-30
    if not ((y.double() - exact).abs() <= bound).all():
        raise SystemExit(f"{name}: result off the float64 product by more than its bound")


def bench_shape(dtype: torch.dtype, rows: int, k: int, n: int, reps: int) -> dict[str, float]:
    """Median seconds per call of each method."""
    g = torch.Generator().manual_seed(k * n)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((rows, k), (n, k), (n,)))
    calls = methods(dtype, w, b, x)
    for name, call in calls.items():
        check(name, call(), x, w, b, dtype)
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for rep in range(reps + 2):
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            start = time.perf_counter()
            calls[name]()
            if rep >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[128], help="rows of x (a prefill's tokens)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--shapes", nargs="+", choices=[s[0] for s in SHAPES], default=None, metavar="SHAPE",
                        help=f"of: {', '.join(s[0] for s in SHAPES)} (default all)")
    parser.add_argument("--reps", type=int, default=7, help="timed calls per method (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: as set)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    print(f"prefill GEMM: {cpu_gemv.native_status()}; {threads} threads", file=sys.stderr)
    peak = fma_peak(threads)
    print(f"# Prefill GEMMs, GMAC/s ({threads} threads; FMA peak "
          f"{'n/a' if peak is None else f'{peak:.1f}'} GMAC/s, fma_peak.c)\n")
    shapes = [s for s in SHAPES if args.shapes is None or s[0] in args.shapes]
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        header = None
        for rows in args.rows:
            for name, k, n in shapes:
                print(f"{dtype_name} {name} rows {rows} ...", file=sys.stderr)
                med = bench_shape(dtype, rows, k, n, args.reps)
                if header is None:
                    header = list(med)
                    print(f"## {dtype_name}\n")
                    print("| shape (K -> N) | rows | " + " | ".join(header) + " | ours / peak | ours / best peer |")
                    print("|---|---:|" + "---:|" * (len(header) + 2))
                rate = {m: rows * k * n / t / 1e9 for m, t in med.items()}
                best_peer = min(t for m, t in med.items() if m != "ours")
                share = "n/a" if peak is None else f"{rate['ours'] / peak:.0%}"
                print(f"| {name} ({k} -> {n}) | {rows} | " + " | ".join(f"{rate[m]:.1f}" for m in header)
                      + f" | {share} | {med['ours'] / best_peer:.2f} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
