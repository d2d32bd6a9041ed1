"""The int8 dot-product peak of this CPU: the compute floor of an int8 convolution, exact and saturating.

    .venv/bin/python bench/runtime/int8_peak.py                 # torch's threads, and one
    .venv/bin/python bench/runtime/int8_peak.py --threads 2

``int8_peak.c`` (built like the runtime's kernels by ``npu_runtime.backends.cpu_gemv_build``) runs register-resident
loops of each way to sum int8 products, and this module turns them into multiply-adds per second (GMAC/s), on
``threads`` threads at once (ctypes releases the GIL, so the Python threads run the loops in parallel):

* ``exact_avx2``: ``vpmaddwd`` on int16 pairs plus ``vpaddd``, 16 products a pair: our QCONV's AVX2 tile;
* ``saturating_avx2``: ``vpmaddubsw``, ``vpmaddwd`` by ones, ``vpaddd``, 32 products: onnxruntime's and OpenVINO's
  AVX2 int8 kernels, whose int16 pair sums clip (their result on such a CPU is not the exact one);
* ``exact_vnni``: ``vpdpbusd``, 64 products an instruction, where the CPU has AVX-512 VNNI.

Each loop's checksum is checked against the products it was asked for, so a rate is of work done. Imported by
``precision.py`` (its int8 notes) and ``tests/bench/test_int8_peak.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SOURCE = Path(__file__).with_name("int8_peak.c")
#: probe kind -> (name, products per instruction group); ``int8_peak_run``'s kinds
KINDS = {0: ("exact_avx2", 16), 1: ("saturating_avx2", 32), 2: ("exact_vnni", 64)}
ACCS = 6  # instruction groups per round (``ACCS`` of the C file)
PRODUCT = 3 * -2  # every product the loops compute
_MIN = -(2 ** 63)


@dataclass(frozen=True)
class Int8Peak:
    """GMAC/s (1e9 multiply-adds a second) of each probe this CPU runs, on ``threads`` threads; absent probes are
    missing from ``rates`` (no AVX2, or no VNNI)."""

    rates: dict[str, float]
    threads: int

    def line(self) -> str:
        if not self.rates:
            return "int8 dot-product peak: no probe for this CPU (needs AVX2)"
        parts = ", ".join(f"{name} {gmacs:.0f}" for name, gmacs in self.rates.items())
        return f"int8 dot-product peak, {self.threads} threads, GMAC/s: {parts}"


def _library() -> ctypes.CDLL | None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    if src not in sys.path:  # run as a script: the kernels' build helper from this checkout
        sys.path.insert(0, src)
    from npu_runtime.backends import cpu_gemv_build

    try:
        lib, _ = cpu_gemv_build.open_library(SOURCE.read_text(encoding="utf-8"), "int8_peak")
    except cpu_gemv_build.BuildError:
        return None
    lib.int8_peak_run.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.int8_peak_run.restype = ctypes.c_int64
    lib.int8_peak_isa.restype = ctypes.c_int
    return lib


def _rate(lib: ctypes.CDLL, kind: int, iters: int, threads: int) -> float | None:
    """GMAC/s of ``threads`` concurrent runs of probe ``kind``; None when the CPU lacks it. Raises when a checksum
    is not the products asked for (a probe that skipped work would report a false peak)."""
    per_group = KINDS[kind][1]
    want = iters * ACCS * per_group * PRODUCT
    sums: list[int] = []
    workers = [threading.Thread(target=lambda: sums.append(lib.int8_peak_run(kind, iters))) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    if any(s == _MIN for s in sums):
        return None
    if any(s != want for s in sums):
        raise RuntimeError(f"int8_peak.c probe {KINDS[kind][0]}: checksums {sums}, expected {want}")
    return threads * iters * ACCS * per_group / seconds / 1e9


def measure_int8_peak(threads: int = 1, iters: int = 10_000_000, reps: int = 5) -> Int8Peak:
    """The best of ``reps`` rounds of every probe this CPU runs (best: the rate a neighbour did not slow).
    ``iters`` at most 5e7, so no int32 lane of the C loops can overflow."""
    if not 1 <= iters <= 50_000_000:
        raise ValueError(f"iters must be in 1..50,000,000 (int32 lanes), got {iters}")
    lib = _library()
    if lib is None or lib.int8_peak_isa() == 0:
        return Int8Peak({}, threads)
    best: dict[str, float] = {}
    for _ in range(reps):
        for kind, (name, _) in KINDS.items():
            rate = _rate(lib, kind, iters, threads)
            if rate is not None:
                best[name] = max(best.get(name, 0.0), rate)
    return Int8Peak(best, threads)


def contraction_macs(model: torch.nn.Module, args: tuple) -> int:
    """Multiply-adds of ``model(*args)`` in its ``Conv2d`` and ``Linear`` layers (forward hooks: every output element
    is one dot product of the layer's fan-in), the work an int8 program runs as QCONV/QGEMM; a BERT's attention
    products are left out."""
    import torch

    total = 0

    def hook(module: torch.nn.Module, _inputs: tuple, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, torch.nn.Conv2d):
            fan_in = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        else:
            fan_in = module.in_features
        total += out.numel() * fan_in

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="threads at once (default: torch's, and one)")
    args = parser.parse_args(argv)
    import torch

    counts = [args.threads] if args.threads else sorted({1, torch.get_num_threads()})
    print("| threads | " + " | ".join(name for name, _ in KINDS.values()) + " |")
    print("|---:|" + "---:|" * len(KINDS))
    for threads in counts:
        peak = measure_int8_peak(threads)
        cells = [f"{peak.rates[name]:.1f}" if name in peak.rates else "—" for name, _ in KINDS.values()]
        print(f"| {threads} | " + " | ".join(cells) + " |")
    print("\nGMAC/s, the best of 5 rounds; a multiply-add is one int8 product summed exactly (exact_*) or into a "
          "saturating int16 pair (saturating_avx2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
