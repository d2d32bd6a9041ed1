"""One-token decode GEMMs (GEMV, ``M`` of 1 to a few rows) at memory bandwidth, fp32 / bf16 / fp16 weights.

Decoding one token reads every weight once, so a decode step is bound by the bytes of the weights and
the machine's memory bandwidth, not by FLOPs. PyTorch's CPU paths do not get there for bfloat16:
``F.linear`` with a bf16 weight and one row moves 10-13 GB/s where fp32 moves 20-35, and ``torch.mv``
is fast for some shapes only, so the half-as-many bytes of bf16 weights would not make decode faster.

This module computes ``y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) (+ residual[M, N])`` with a small C
kernel (``gemv.c`` beside this file) compiled on first use:

* weights fp32, bf16 (widened by a 16-bit shift) or fp16 (F16C), accumulated in fp32; activations,
  bias, residual and output in any of the three (the output is rounded once, to nearest even);
* an AVX-512 F/BW/VL version for bf16/fp16 weights (16 fp32 lanes, K by 32, the rest of K one by one;
  fp32 weights run the AVX2 one, measured faster for them) and an AVX2/FMA one (8 lanes), the
  best the CPU has chosen at run time (``__builtin_cpu_supports``), so one ``.so`` runs on any x86-64
  of a CI pool, and a portable C version (auto-vectorized) for other CPUs. All three compute
  the same fp32 products of the exactly widened weights and sum them in fp32, in different orders;
  ``TORCH_IR_GEMV_ISA`` (``c``, ``avx2``, ``avx512``, ``avx512bf16``) caps the version a process runs (a
  test of the other paths, or a comparison), ``isa=`` does so per call;
* with AVX512-BF16, bf16 weights and an ``x`` whose every value is exactly a bf16 number (a bf16 program's
  activations; fp32 ``x`` is checked value by value, per call), ``vdpbf16ps`` multiplies the pairs
  without widening: the product of two bf16 is exact in fp32 and each sum is rounded to nearest even, as
  in the widening kernels, but the instruction reads subnormal inputs as 0 and flushes subnormal results
  to 0 (DAZ/FTZ). So it runs only where that cannot act: no subnormal ``x`` or weight, and the smallest
  nonzero ``|x|`` times the weight's (found once per :class:`Gemv`, on its first such call) at least
  2^-110, which keeps every product and partial sum a multiple of 2^-125, never subnormal. Its results are
  then the widening kernels' sums in another order; any other call (fp32 ``x`` that is not bf16 among
  them) gives the widening AVX-512 kernel's bits. Measured out of cache, one thread: 1.07-1.3x the
  bytes/s of the widening kernel (the memory streams wait on its shifts and FMAs);
* read the way a core reads memory fastest: 8 rows of W at once, taken from 8 places far apart in a
  chunk of ~256 KiB (8 long sequential streams, as a plain read of 8 streams moves ~1.6x the bytes/s of
  one), with a software prefetch 4 KiB ahead in each, into L2 (the hardware prefetcher restarts at every
  4 KiB page; into L1 the fills crowd out the loads: measured ~1.4x slower); for bf16 with K=896 (short
  rows) this reads ~1.5x the bytes/s of 4 adjacent rows. The decode GEMV is bound by these memory
  streams, not by the widening or the FMAs: out of cache the AVX-512 and AVX2 versions read bf16 at the
  same speed (in cache AVX-512 is 1.15-1.45x faster), ~1.05x the time of a plain read (bench/gemv);
* chunks handed out one at a time to the threads of torch's own OpenMP pool (the library links the
  ``libgomp.so.1`` torch has loaded: no second pool competes for the cores). One thread or all of
  them is chosen per call from the recent times of both (:class:`_ThreadPolicy`): on a quiet machine
  two threads read ~1.7x one thread's bytes/s, but while a neighbour process holds a core a two-thread
  call waits ~8 ms for the thread that did not get one.

How it is built, cached and loaded (``ctypes``, which releases the GIL): :mod:`.cpu_gemv_build`.

When the kernel cannot be had (no compiler, a failed build, ``TORCH_IR_NATIVE_GEMV=0``,
:func:`set_native_enabled(False) <set_native_enabled>`) every call runs :func:`torch_gemv`, the fastest
PyTorch call path measured for each case, and one warning says why (never an error).

Memory safety: the C code trusts the pointers and sizes it is given, so :class:`Gemv` checks every
tensor's device, dtype, contiguity and shape and that its storage holds the bytes the kernel will read
or write before each call, and refuses overlapping outputs (``docs/security.md``).

The machine's streaming-read bandwidth, the floor a decode step's GEMVs are compared with, is measured
by ``bench/gemv`` (``bandwidth.py``).
"""

from __future__ import annotations

import functools
import statistics
import struct
import threading
import time
from collections import deque

import torch

from . import cpu_gemv_build
from .cpu_gemv_build import Library, NativeCall, cache_dir

Tensor = torch.Tensor

#: dtype -> the kernel's dtype code (``enum`` in ``gemv.c``)
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: Bytes of weights below which one thread runs the GEMV: below it the parallel region costs what the
#: second thread saves (measured, out of cache: a 128x896 bf16 K/V projection, 224 KiB, 31 µs on one
#: thread and 47 µs on two; 256x1536 bf16, 768 KiB, about even).
SINGLE_THREAD_BYTES = 512 << 10

#: ``gemv_packed``'s argument block: M N K x x_dtype w w_dtype bias bias_dtype res res_dtype y y_dtype threads isa
#: wmin (the float bits of the weight's smallest nonzero magnitude, for the AVX512-BF16 kernel)
_ARGS = struct.Struct("<16q")
_FLOAT_BITS = struct.Struct("<f")

#: the kernel versions ``isa=`` / ``TORCH_IR_GEMV_ISA`` may cap a call at (``gemv_isa`` in ``gemv.c``): the x86
#: levels, and AVX512-BF16's ``vdpbf16ps`` for bf16 weights and x
ISAS: dict[str, int] = {**cpu_gemv_build.ISAS, "avx512bf16": 3}
_ISA_NAMES = {0: "portable C", 1: "AVX2/FMA", 2: "AVX-512", 3: "AVX-512 + AVX512-BF16"}
_BF16 = DTYPE_CODES[torch.bfloat16]

_kernel = cpu_gemv_build.NativeKernel(
    "GEMV", cpu_gemv_build.load, lambda library: _ISA_NAMES[min(library.isa, _isa_cap())],
    "one-token GEMMs run at PyTorch's speed")


_env_cap: list[int] = []  # TORCH_IR_GEMV_ISA's code, read on the first call (not once per call: decode's µs)


def _isa_cap(isa: str | None = None) -> int:
    """The highest kernel version a call may run: ``isa`` (a key of :data:`ISAS`), else ``TORCH_IR_GEMV_ISA``
    (read once per process), else the best; an unknown name is a ``ValueError`` naming the choices."""
    if isa is None:
        if not _env_cap:
            _env_cap.append(cpu_gemv_build.isa_cap("TORCH_IR_GEMV_ISA", ISAS))
        return _env_cap[0]
    if isa not in ISAS:
        raise ValueError(f"gemv: isa {isa!r} is not one of {', '.join(ISAS)}")
    return ISAS[isa]


def set_native_enabled(enabled: bool) -> bool:
    """Use the compiled kernels (True, the default unless ``TORCH_IR_NATIVE_GEMV=0``) or always the torch
    paths (False: a test of the fallback, or a comparison): one switch for this and the quantized GEMV.
    Returns the previous setting."""
    return cpu_gemv_build.set_enabled(enabled)


def native_status() -> str:
    """One line: which implementation :func:`gemv` runs here, and why."""
    return _kernel.status()


def native_available() -> bool:
    """Whether calls run the compiled kernel (building it now if it is not built yet)."""
    return cpu_gemv_build.NativeKernel.enabled and _kernel.load() is not None


def _load() -> Library | None:
    """The compiled kernel, built on first use; None when it cannot be had."""
    return _kernel.load()


# ------------------------------------------------------------------------------------------- checks


def _arg(t: Tensor, what: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(address, dtype code, bytes)`` of a tensor the kernel touches, checked (``cpu_gemv_build.tensor_arg``)."""
    return cpu_gemv_build.tensor_arg(t, "gemv", what, DTYPE_CODES, tuple(shape))


_overlap = cpu_gemv_build.overlaps


# -------------------------------------------------------------------------------------------- torch


def torch_gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
               out: Tensor | None = None) -> Tensor:
    """``x · weightᵀ + bias + residual`` with PyTorch: the fallback, and the comparison of the bench.

    For one row ``torch.mv`` (measured faster than ``F.linear`` for bf16: 29 against 13 GB/s on a
    8960x1536 weight), for more ``torch.mm``; computed in the weight's dtype, then stored in ``out``'s.
    """
    m, n = x.shape[0], weight.shape[0]
    xw = x if x.dtype == weight.dtype else x.to(weight.dtype)
    y = torch.mv(weight, xw[0]).unsqueeze(0) if m == 1 else torch.mm(xw, weight.t())
    if bias is not None:
        y = y.add_(bias) if bias.dtype == y.dtype else y.add(bias)
    if residual is not None:
        y = y.add_(residual) if residual.dtype == y.dtype else y.add(residual)
    if out is None:
        return y if y.dtype == x.dtype else y.to(x.dtype)
    if out.shape != (m, n):
        raise ValueError(f"gemv: out has shape {tuple(out.shape)}, expected {(m, n)}")
    return out.copy_(y)


# -------------------------------------------------------------------------------------------- gemv


class Gemv:
    """``y = x · Wᵀ (+ bias) (+ residual)`` for a weight ``W [N, K]`` checked once (decode: the same weight
    every token), then each call checks only ``x``, ``out`` and ``residual``.

    ``weight`` and ``bias`` are kept (referenced, not copied): holding them keeps their memory alive. Resizing
    their storage in place afterwards (``resize_``) is not supported: the per-call checks cover ``x``,
    ``out`` and ``residual`` only, so that a decode step does not check the same weights every token. For
    the same reason a bf16 weight's smallest magnitude (the AVX512-BF16 kernel's condition) is found once:
    weights edited in place to hold subnormals afterwards may lose them (counted as 0, ~1e-38 each).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError("gemv: weight must be a 2-D tensor [N, K]")
        self.n, self.k = int(weight.shape[0]), int(weight.shape[1])
        self.weight, self.bias = weight, bias
        self._w = _arg(weight, "weight", (self.n, self.k))
        self._b = _arg(bias, "bias", (self.n,)) if bias is not None else (0, 0, 0)
        self._wmin = -1  # the float bits of gemv_min_abs_bf16 of a bf16 weight, found on the first call that needs it

    def __call__(self, x: Tensor, out: Tensor | None = None, residual: Tensor | None = None,
                 threads: int | None = None, isa: str | None = None) -> Tensor:
        """``x [M, K]`` -> ``out [M, N]`` (a new tensor of ``x``'s dtype when None); ``residual [M, N]`` may be
        ``out`` itself (an in-place residual add). ``threads``: by default one for a weight under
        ``SINGLE_THREAD_BYTES``, else one or ``torch.get_num_threads()``, whichever ran faster lately
        (:class:`_ThreadPolicy`); a number forces it. ``isa``: at most this kernel version (a key of
        :data:`ISAS`; by default ``TORCH_IR_GEMV_ISA``, else the best the CPU runs)."""
        out, fields, cap = self._checked(x, out, residual, isa)
        library = _kernel.for_call()
        if library is None:
            return torch_gemv(x, self.weight, self.bias, residual, out)
        policy = None
        if threads is None:
            policy = _policy if self._w[2] >= SINGLE_THREAD_BYTES and torch.get_num_threads() > 1 else None
            threads = policy.pick(self._w[2], torch.get_num_threads()) if policy is not None else 1
        args = self._pack(library, fields, threads, min(library.isa, cap))
        start = time.perf_counter_ns()
        status = library.lib.gemv_packed(args)
        if policy is not None:
            policy.record(self._w[2], threads, time.perf_counter_ns() - start)
        if status != 0:  # no memory for the fp32 copy of x: torch needs less of it
            return torch_gemv(x, self.weight, self.bias, residual, out)
        return out

    def _checked(self, x: Tensor, out: Tensor | None, residual: Tensor | None,
                 isa: str | None) -> tuple[Tensor, tuple[int, ...], int]:
        """``out`` (made when None), the call's pointer and dtype fields and its ISA cap, after the checks."""
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError("gemv: x must be a 2-D tensor [M, K]")
        m = int(x.shape[0])
        xp, xc, xn = _arg(x, "x", (m, self.k))
        if out is None:
            out = torch.empty(m, self.n, dtype=x.dtype)
        yp, yc, yn = _arg(out, "out", (m, self.n))
        rp = rc = 0
        if residual is not None:
            rp, rc, rn = _arg(residual, "residual", (m, self.n))
            if _overlap(rp, rn, yp, yn) and (rp != yp or rc != yc):  # out is residual, or apart from it
                raise ValueError("gemv: residual overlaps out without being it")
        # the kernel reads x, W and bias while other threads write out: any overlap would give garbage
        for (p, _, size), what in ((self._w, "weight"), (self._b, "bias"), ((xp, xc, xn), "x")):
            if _overlap(yp, yn, p, size):
                raise ValueError(f"gemv: out overlaps {what}")
        return out, (m, xp, xc, rp, rc, yp, yc), _isa_cap(isa)

    def _pack(self, library: Library, fields: tuple[int, ...], threads: int, isa_code: int) -> bytes:
        """``gemv_packed``'s argument block: one pointer converts much faster than fifteen arguments."""
        m, xp, xc, rp, rc, yp, yc = fields
        w, b = self._w, self._b
        if isa_code == 3 and w[1] == _BF16 and self._wmin < 0:  # one pass over the weight, once
            min_abs = library.lib.gemv_min_abs_bf16(w[0], self.n * self.k)
            self._wmin = int.from_bytes(_FLOAT_BITS.pack(min_abs), "little")
        return _ARGS.pack(m, self.n, self.k, xp, xc, w[0], w[1], b[0], b[1], rp, rc, yp, yc, max(1, threads),
                          isa_code, max(self._wmin, 0))

    def tiled_mm(self, x: Tensor, out: Tensor, threads: int | None = None) -> bool:
        """Many rows of ``x [M, K]`` (a prefill) into ``out [M, N]`` by the prefill GEMM of ``gemm_tiles.c``: panels of
        24 columns of W widened to fp32 as they are packed, 4 x 24 blocks of fp32 sums held in registers, the bias
        added, one rounding to the dtype (PyTorch's half GEMM's arithmetic, and its fp32 GEMM's, in another order of
        sums). Only where AVX2/FMA is the best kernel the CPU runs (or an ``isa`` cap puts it there): there it ran
        1.0-1.3x the GMAC/s of oneDNN's and MKL's fp32 GEMMs at BERT-base's and Qwen2.5's prefill shapes, 67-87 of
        the FMA units' 102 (Zen 3, two threads: ``bench/gemv/prefill.py``); AVX-512 doubles their width. False,
        nothing written, where it does not run: x, W and out of different dtypes, no kernel, no memory for it."""
        library = tiles_library()
        if library is None or x.dtype != self.weight.dtype or out.dtype != x.dtype:
            return False
        out, (m, xp, *_), _ = self._checked(x, out, None, None)
        if x.dtype != torch.float32:  # widened once here (exact), not once per panel of W
            xp = scratch("x", m * self.k)[:m * self.k].view(m, self.k).copy_(x).data_ptr()
        bias = self.bias if self.bias is None or self.bias.dtype == torch.float32 else self.bias.float()
        return library.lib.gemm_tiles(m, self.n, self.k, xp, self._w[0], self._w[1],
                                      None if bias is None else bias.data_ptr(), out.data_ptr(), self.n,
                                      DTYPE_CODES[out.dtype], torch.get_num_threads() if threads is None else
                                      max(1, threads)) == 0

    def widened_mm(self, x: Tensor, out: Tensor) -> bool:
        """Many rows of bf16 or fp16 ``x [M, K]`` (a prefill) into ``out [M, N]`` of that dtype as PyTorch's half
        GEMM computes them (fp32 products and sums, the bias added, one rounding), but with the weight widened to
        fp32 a tile of rows at a time into a buffer kept in cache, each tile multiplied by PyTorch's fp32 GEMM,
        where the CPU has no dot products of that dtype (:func:`_half_dot_products`). There PyTorch's bf16 GEMM ran
        4.6-5.9x slower than its fp32 one at Qwen2.5-0.5B's prefill shapes, its fp16 GEMM 4.4-5.1x (Zen 3, 2
        threads); the tiles run within 1.1x of one fp32 GEMM. (oneDNN's fp32 GEMM on the tiles was faster alone but
        slower in the model: fp16 0.5B prefill 7.9 against 6.8 ms/token, alternated.) False, nothing written, for
        other dtypes, a weight of another dtype than x, or where the CPU has them (PyTorch's half GEMM uses them)."""
        if x.dtype not in _HALF or self.weight.dtype != x.dtype or _half_dot_products(x.dtype):
            return False
        rows = min(self.n, max(WIDE_TILE_ROWS, WIDE_TILE_BYTES // (4 * self.k)))
        m = int(x.shape[0])
        tile_w, tile_y = scratch("tile", rows * self.k), scratch("y", m * rows)
        x32 = x.float()
        bias = self.bias.float() if self.bias is not None else None
        for n0 in range(0, self.n, rows):
            n1 = min(self.n, n0 + rows)
            w = tile_w[:(n1 - n0) * self.k].view(n1 - n0, self.k)
            y = tile_y[:m * (n1 - n0)].view(m, n1 - n0)
            w.copy_(self.weight[n0:n1])
            if bias is None:
                torch.mm(x32, w.t(), out=y)
            else:
                torch.addmm(bias[n0:n1], x32, w.t(), out=y)
            out[:, n0:n1].copy_(y)  # rounded to nearest even, as the half GEMM rounds
        return True

    def native_call(self, x: Tensor, out: Tensor, residual: Tensor | None, threads: int) -> NativeCall | None:
        """The call of ``x`` into ``out`` on ``threads`` threads, checked and packed but not made (a link of a chain
        of native calls, ``cpu_chain``); None where the kernel cannot be had."""
        out, fields, cap = self._checked(x, out, residual, None)
        library = _kernel.for_call()
        return None if library is None else \
            NativeCall(library.lib.gemv_packed, self._pack(library, fields, threads, min(library.isa, cap)),
                       keep=(x, out, residual, self.weight, self.bias))


#: columns of W per panel of ``gemm_tiles.c`` (its ``TG_NR``; ``gemm_tiles_panel()``): a caller that cuts W into tiles
#: (``cpu_qgemv``'s dequantized rows) cuts them to whole panels
TILES_PANEL = 24


def tiles_library() -> Library | None:
    """The library whose ``gemm_tiles`` a prefill's contractions run (:meth:`Gemv.tiled_mm`, ``cpu_qgemv``'s tiles of
    dequantized rows), or None where they keep their own path: no kernel, or a best kernel other than AVX2's."""
    library = _kernel.for_call()
    return library if library is not None and min(library.isa, _isa_cap()) == 1 else None


#: a widened tile of a half prefill (:meth:`Gemv.widened_mm`): rows of W to fill this many fp32 bytes (with x's
#: panel it stays in L2), at least WIDE_TILE_ROWS (torch.mm's GEMM slows below ~128 columns of output). Zen 3, two
#: threads, 128 rows of x: 128-896 rows of K = 896 and 4864 within 10 % of each other and of one fp32 GEMM
WIDE_TILE_BYTES = 3 << 19
WIDE_TILE_ROWS = 128
_scratch = threading.local()


def scratch(slot: str, values: int) -> Tensor:
    """This thread's fp32 scratch ``slot``, grown to ``values``: ``"tile"`` a prefill's tile of W (widened here,
    dequantized by ``cpu_qgemv``), ``"y"`` a widened tile's columns of y, ``"x"`` half x widened for ``tiled_mm``. One
    per slot and thread: every layer's prefill reuses it, rather than each layer holding a tile of its own."""
    bufs = _scratch.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.numel() < values:
        buf = bufs[slot] = torch.empty(values, dtype=torch.float32)
    return buf


@functools.cache
def _bf16_dot_products() -> bool:
    """Whether this CPU multiplies bf16 itself (AVX512-BF16 or AMX), so that PyTorch's bf16 GEMM is fast."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


_HALF = (torch.bfloat16, torch.float16)


def _half_dot_products(dtype: torch.dtype) -> bool:
    """Whether PyTorch's GEMM of ``dtype`` (bf16, fp16) runs this CPU's own dot products of it: bf16 by
    :func:`_bf16_dot_products`, fp16 where oneDNN has them (AVX512-FP16, AMX-FP16: PyTorch's own check, which
    routes its fp16 GEMM to oneDNN)."""
    if dtype == torch.bfloat16:
        return _bf16_dot_products()
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


class _ThreadPolicy:
    """One thread or all of torch's, per size class of weights (a power of two), by the recent times of both.

    On a quiet machine all threads win (two cores read ~1.7x the bytes/s of one). When a neighbour process
    holds a core, a two-thread call often waits a scheduler tick for the thread that did not get one:
    measured 0.1-2 GB/s for 0.2-16 MB of weights against 10-15 GB/s with one thread. So each class keeps
    the last ``SAMPLES`` times of each choice, runs the one with the lower mean, and tries the other after
    ``PROBE_NS``, then twice as long after each try that changed nothing (up to ``MAX_PROBE_NS``): a
    stalled two-thread try costs ~8 ms here, so what the tries cost stays a fraction of a percent.
    """

    SAMPLES = 5
    PROBE_NS = 200_000_000
    MAX_PROBE_NS = 1_600_000_000

    def __init__(self) -> None:
        self.samples: dict[tuple[int, int], deque[float]] = {}  # (class, threads) -> ns per byte, latest
        self.many: dict[int, int] = {}  # class -> the thread count "all" meant at its last pick
        self.best: dict[int, int] = {}  # class -> the faster choice
        self.probed: dict[int, int] = {}  # class -> when the slower choice last ran
        self.interval: dict[int, int] = {}  # class -> time between probes
        self.probing: set[int] = set()  # classes whose last pick was a probe
        self.explored: set[int] = set()  # classes with three samples of each choice

    def pick(self, nbytes: int, threads: int) -> int:
        size = nbytes.bit_length()
        self.many[size] = threads
        if size not in self.explored:
            for choice in (1, threads):  # three calls of each first
                if len(self.samples.get((size, choice), ())) < 3:
                    return choice
            self.explored.add(size)
        best = self.best.get(size, threads)
        best = best if best in (1, threads) else threads
        now = time.perf_counter_ns()
        if now - self.probed.get(size, 0) >= self.interval.get(size, self.PROBE_NS):
            self.probed[size] = now
            self.probing.add(size)
            return threads if best == 1 else 1
        return best

    def record(self, nbytes: int, threads: int, ns: int) -> None:
        size = nbytes.bit_length()
        samples = self.samples.get((size, threads))
        if samples is None:
            samples = self.samples[(size, threads)] = deque(maxlen=self.SAMPLES)
        probe = size in self.probing
        if probe:  # what the other choice did seconds ago is stale: the probe speaks for it alone
            self.probing.discard(size)
            samples.clear()
        samples.append(ns / nbytes)
        many = self.many.get(size, 1)
        one, multi = self.samples.get((size, 1)), self.samples.get((size, many))
        if many > 1 and one and multi and size in self.explored:
            before = self.best.get(size)
            # means, not medians: the stalls are the cost (a 5 ms call in five is what the median hides)
            self.best[size] = 1 if sum(one) / len(one) < sum(multi) / len(multi) else many
            if probe:  # a probe that changed nothing: probe half as often, else as often as at first
                same = before == self.best[size]
                interval = self.interval.get(size, self.PROBE_NS)
                self.interval[size] = min(2 * interval, self.MAX_PROBE_NS) if same else self.PROBE_NS


_policy = _ThreadPolicy()


class _PathPolicy:
    """GEMV or tiles (``True``), per shape class (layout, N, K, rows of x as a power of two, threads), by recent times
    per row of x (:mod:`.cpu_qgemv` keeps one; ``cpu_blocks`` one too, for a prefill's int8 rows: the float path on
    the rounded x (``True``) or the integer kernel): two calls of each first, then the one with the lower mean, the
    other tried again now and then, so that a neighbour's load changing sides is noticed. A try of the slower side
    costs the difference between the two, so tries are spaced by the class's own calls (not by the clock: a class
    that runs once per prefill would be tried in every one) to keep that cost near ``PROBE_SHARE`` of the class's
    time, between ``MIN_CALLS`` and ``MAX_CALLS`` calls apart (the scheme of ``npu_runtime.threads.RunThreads``).
    Spaced by the clock, 0.5-8 s, the tries of 1.5B q4_K_M's float path (up to 4x its integer kernel's time) cost its
    int8 prefill 15 % (``bench/llm/prefill_ab.py``). A try's time replaces its side's older ones, which are stale."""

    SAMPLES = 4
    PROBE_SHARE = 0.02
    MIN_CALLS, MAX_CALLS = 20, 2000

    def __init__(self) -> None:
        self.samples: dict[tuple, deque[float]] = {}  # (key, tiled) -> ns per row of x, latest
        self.spent: dict[tuple, float] = {}  # key -> ns per row, summed over its calls since the last try
        self.after: dict[tuple, float] = {}  # key -> ... before the next try
        self.probing: dict[tuple, bool] = {}  # key -> the side its last pick tried, until that call is recorded

    def _means(self, key: tuple) -> tuple[float, float] | None:
        times = [self.samples.get((key, c), ()) for c in (True, False)]
        return None if min(map(len, times)) < 2 else (statistics.fmean(times[0]), statistics.fmean(times[1]))

    def _schedule(self, key: tuple, cost: float) -> None:
        """The next try after the class's calls sum to ``cost / PROBE_SHARE`` (per row, as the samples)."""
        best = min(self._means(key) or (0.0,))
        self.spent[key] = 0.0
        self.after[key] = min(max(cost / self.PROBE_SHARE, self.MIN_CALLS * best), self.MAX_CALLS * best)

    def pick(self, key: tuple) -> bool:
        means = self._means(key)
        if means is None:  # two calls of each first
            return len(self.samples.get((key, True), ())) < 2
        if key not in self.after:
            self._schedule(key, abs(means[0] - means[1]))
        best = means[0] <= means[1]
        if self.spent[key] >= self.after[key]:
            self.probing[key] = not best
            return not best
        return best

    def record(self, key: tuple, tiled: bool, ns_per_row: float) -> None:
        samples = self.samples.setdefault((key, tiled), deque(maxlen=self.SAMPLES))
        self.spent[key] = self.spent.get(key, 0.0) + ns_per_row
        if self.probing.get(key) is not tiled:
            samples.append(ns_per_row)
            return
        del self.probing[key]
        other = statistics.fmean(self.samples[(key, not tiled)])
        samples.clear()
        samples.extend((ns_per_row, ns_per_row))  # two, as a side needs to be compared
        self._schedule(key, max(ns_per_row - other, 0.0))  # changed sides: cost 0, the next try soon


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
         out: Tensor | None = None) -> Tensor:
    """``x [M, K] · weight [N, K]ᵀ (+ bias [N]) (+ residual [M, N])`` into ``out`` (see :class:`Gemv`)."""
    return Gemv(weight, bias)(x, out=out, residual=residual)


__all__ = ["DTYPE_CODES", "ISAS", "Gemv", "cache_dir", "gemv", "native_available", "native_status",
           "set_native_enabled", "torch_gemv"]
