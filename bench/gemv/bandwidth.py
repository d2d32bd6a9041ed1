"""The machine's streaming-read bandwidth: the floor ``run.py`` compares the decode GEMVs with.

:func:`measure_stream_bandwidth` times a plain C read loop (``stream_read.c``, built like the runtime's GEMV
kernel by ``npu_runtime.backends.cpu_gemv_build``) with all threads and with one, and fp32 ``torch.mv``.
Imported by ``run.py`` (which puts ``src`` on the path) and by ``tests/runtime/test_gemv.py``.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from npu_runtime.backends import cpu_gemv, cpu_gemv_build

SOURCE = Path(__file__).with_name("stream_read.c")


@dataclass(frozen=True)
class StreamReader:
    """The compiled read loop: ``lib.stream_read(pointer, floats, threads, isa)`` returns their sum."""

    lib: ctypes.CDLL
    path: Path
    isa: int  # 1: the AVX2 loop, 0: the portable one


def stream_reader() -> StreamReader | None:
    """``stream_read.c`` compiled (once per machine, in the GEMV kernel's cache) and loaded; None where the
    GEMV kernel is unavailable (no compiler, or ``TORCH_IR_NATIVE_GEMV=0``): then only ``torch.mv`` is
    measured, as the floor of the torch path the GEMV then runs."""
    if not cpu_gemv.native_available():
        return None
    try:
        lib, path = cpu_gemv_build.open_library(SOURCE.read_text(encoding="utf-8"), "stream_read")
    except cpu_gemv_build.BuildError:
        return None
    lib.stream_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.stream_read.restype = ctypes.c_double
    lib.stream_isa.restype = ctypes.c_int
    return StreamReader(lib, path, int(lib.stream_isa()))


@dataclass(frozen=True)
class StreamBandwidth:
    """The memory bandwidth a GEMV can reach on this machine, GB/s (1e9 bytes/s), medians of ``reps`` passes.

    ``c_read``: the compiled plain read loop, 8 sequential streams per 256 KiB chunk, with ``threads``
    threads (``c_read_1``: with one; both 0 when the kernel is unavailable); ``torch_mv``: ``torch.mv`` of an
    fp32 matrix (BLAS's own streaming GEMV) — all over ``nbytes``, far larger than the caches. ``gbs``, the
    best of them, is the floor's bandwidth: a decode step cannot read its weight bytes faster than
    bytes / ``gbs``.
    """

    gbs: float
    c_read: float
    c_read_1: float
    torch_mv: float
    nbytes: int
    threads: int


def measure_stream_bandwidth(nbytes: int = 1 << 30, reps: int = 20, threads: int | None = None) -> StreamBandwidth:
    """Measure :class:`StreamBandwidth` over an fp32 buffer of ``nbytes`` (default 1 GiB, ten times a
    large server L3): every pass reads it all from memory. The readers alternate, one pass each per
    round, so a neighbour's load affects them alike; one thread is measured too because on a 2-core
    machine a busy neighbour can make two threads slower than one (then one is the machine's best)."""
    threads = threads or torch.get_num_threads()
    cols = 4096
    rows = max(1, nbytes // (4 * cols))
    buf = torch.ones(rows, cols)  # written once, so every page is mapped before the first timed pass
    vec = torch.ones(cols)
    reader = stream_reader()
    times: dict[str, list[float]] = {"c": [], "c1": [], "mv": []}
    readers = {"mv": lambda: torch.mv(buf, vec)}
    if reader is not None:
        readers["c"] = lambda: reader.lib.stream_read(buf.data_ptr(), buf.numel(), threads, reader.isa)
        readers["c1"] = lambda: reader.lib.stream_read(buf.data_ptr(), buf.numel(), 1, reader.isa)
    for rep in range(reps + 1):
        for name, read in readers.items():
            start = time.perf_counter()
            read()
            if rep:  # the first round warms the thread pool and the page tables
                times[name].append(time.perf_counter() - start)
    size = buf.numel() * 4
    gbs = {name: size / statistics.median(t) / 1e9 if t else 0.0 for name, t in times.items()}
    return StreamBandwidth(max(gbs.values()), gbs["c"], gbs["c1"], gbs["mv"], size, threads)
