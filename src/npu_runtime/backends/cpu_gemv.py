"""One-token decode GEMMs (GEMV, ``M`` of 1 to a few rows) at memory bandwidth, fp32 / bf16 / fp16 weights.

Decoding one token reads every weight once, so a decode step is bound by the bytes of the weights and
the machine's memory bandwidth, not by FLOPs. PyTorch's CPU paths do not get there for bfloat16:
``F.linear`` with a bf16 weight and one row moves 10-13 GB/s where fp32 moves 20-35, and ``torch.mv``
is fast for some shapes only, so the half-as-many bytes of bf16 weights would not make decode faster.

This module computes ``y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) (+ residual[M, N])`` with a small C
kernel compiled on first use:

* weights fp32, bf16 (widened by a 16-bit shift) or fp16 (F16C), accumulated in fp32; activations,
  bias, residual and output in any of the three (the output is rounded once, to nearest even);
* an AVX2/FMA version chosen at run time (``__builtin_cpu_supports``), so one ``.so`` runs on any
  x86-64 of a CI pool, and a portable C version (auto-vectorized) for other CPUs;
* read the way a core reads memory fastest: 8 rows of W at once, taken from 8 places far apart in a
  chunk of ~256 KiB (8 long sequential streams, as a plain read of 8 streams moves ~1.6x the bytes/s of
  one), with a software prefetch 2 KiB ahead in each (the hardware prefetcher restarts at every 4 KiB
  page); for bf16 with K=896 (short rows) this reads ~1.5x the bytes/s of 4 adjacent rows;
* chunks handed out one at a time to the threads of torch's own OpenMP pool (the library links the
  ``libgomp.so.1`` torch has loaded: no second pool competes for the cores). One thread or all of
  them is chosen per call from the recent times of both (:class:`_ThreadPolicy`): on a quiet machine
  two threads read ~1.7x one thread's bytes/s, but while a neighbour process holds a core a two-thread
  call waits ~8 ms for the thread that did not get one.

Built with ``gcc -O3 -shared -fPIC -fopenmp`` into ``$TORCH_IR_CACHE`` (else
``$XDG_CACHE_HOME/torch_ir``, else ``~/.cache/torch_ir``) ``/gemv/gemv-<hash>.so``, the hash covering
the source, the compiler and its flags; the library is written to a temporary name and renamed, so a
process never loads half a file written by another, and only loaded from a folder and file that are the
user's own and writable by nobody else. Called through ``ctypes`` (which releases the GIL).

When the kernel cannot be had (no compiler, a failed build, ``TORCH_IR_NATIVE_GEMV=0``,
:func:`set_native_enabled(False) <set_native_enabled>`) every call runs :func:`torch_gemv`, the fastest
PyTorch call path measured for each case, and one warning says why (never an error).

Memory safety: the C code trusts the pointers and sizes it is given, so :class:`Gemv` checks every
tensor's device, dtype, contiguity and shape and that its storage holds the bytes the kernel will read
or write before each call, and refuses overlapping outputs (``docs/security.md``).

:func:`measure_stream_bandwidth` measures the machine's streaming-read bandwidth, the floor a decode
step's GEMVs are compared with (``bench/gemv``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

Tensor = torch.Tensor
log = logging.getLogger(__name__)

#: dtype -> the kernel's dtype code (``enum`` in the C source)
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: Bytes of weights below which one thread runs the GEMV: below it the parallel region costs what the
#: second thread saves (measured, out of cache: a 128x896 bf16 K/V projection, 224 KiB, 31 µs on one
#: thread and 47 µs on two; 256x1536 bf16, 768 KiB, about even).
SINGLE_THREAD_BYTES = 512 << 10

_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define GEMV_X86 1
#endif

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {          /* round to nearest even; NaN stays a (quiet) NaN */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (e == 0x1fu) u = sign | 0x7f800000u | (man << 13);
    else if (e != 0) u = sign | ((e + 112u) << 23) | (man << 13);
    else { float f = (float)man * (1.0f / 16777216.0f); memcpy(&u, &f, 4); u |= sign; }  /* subnormal, 0 */
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f32_to_f16(float f) {           /* round to nearest even, overflow to inf */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                              /* an fp16 subnormal: 2^24 |f| is exact, < 2^10 */
        float v; memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint32_t)__builtin_rintf(v * 16777216.0f));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}
static inline float load_elem(const void *p, int dt, size_t i) {
    if (dt == DT_F32) return ((const float *)p)[i];
    if (dt == DT_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return f16_to_f32(((const uint16_t *)p)[i]);
}
static inline void store_elem(void *p, int dt, size_t i, float v) {
    if (dt == DT_F32) ((float *)p)[i] = v;
    else if (dt == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((uint16_t *)p)[i] = f32_to_f16(v);
}

typedef struct {
    int64_t M, N, K;
    const float *x;              /* [M, K] fp32 */
    const void *w; int wdt;      /* [N, K] */
    const void *bias; int bdt;   /* [N] or NULL */
    const void *res; int rdt;    /* [M, N] or NULL; may be y itself (each element is read before written) */
    void *y; int ydt;            /* [M, N] */
} Job;

static inline void epilogue(const Job *j, int64_t m, int64_t n, float v) {
    if (j->bias) v += load_elem(j->bias, j->bdt, (size_t)n);
    if (j->res) v += load_elem(j->res, j->rdt, (size_t)(m * j->N + n));
    store_elem(j->y, j->ydt, (size_t)(m * j->N + n), v);
}

/* Portable: 16 independent lanes per (row of x, row of w), which gcc vectorizes without -ffast-math. */
#define GL 16
static inline __attribute__((always_inline))
void block_generic(const Job *j, int64_t m0, const int M, int64_t n0, const int R, const int wdt) {
    const int64_t K = j->K, KB = K - K % GL;
    float acc[4][4][GL];
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) for (int l = 0; l < GL; l++) acc[m][r][l] = 0.0f;
    for (int64_t k = 0; k < KB; k += GL) {
        for (int r = 0; r < R; r++) {
            float wv[GL];
            const size_t base = (size_t)((n0 + r) * K + k);
            for (int l = 0; l < GL; l++) wv[l] = load_elem(j->w, wdt, base + l);
            for (int m = 0; m < M; m++) {
                const float *xr = j->x + (m0 + m) * K + k;
                for (int l = 0; l < GL; l++) acc[m][r][l] += xr[l] * wv[l];
            }
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) {
        float s = 0.0f;
        for (int l = 0; l < GL; l++) s += acc[m][r][l];
        const float *xr = j->x + (m0 + m) * K;
        for (int64_t k = KB; k < K; k++) s += xr[k] * load_elem(j->w, wdt, (size_t)((n0 + r) * K + k));
        epilogue(j, m0 + m, n0 + r, s);
    }
}

#ifdef GEMV_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#ifndef GEMV_NO_PREFETCH
#define GEMV_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define GEMV_PREFETCH(p) ((void)(p))
#endif
static inline __attribute__((always_inline)) AVX2 __m256 load8(const void *w, const int wdt, size_t i) {
    if (wdt == DT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wdt == DT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}
static inline __attribute__((always_inline)) AVX2 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* M rows of x times R rows of w, the rows n0 + r * stride: K by 16, one accumulator per (m, r); M x R = 8
   keeps 16 FMAs in flight (2 ports x 4 cycles of latency x two per step) and fits the 16 ymm registers. */
static inline __attribute__((always_inline)) AVX2
void block_avx2(const Job *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int wdt) {
    const int64_t K = j->K, KB = K - K % 16;
    const size_t es = wdt == DT_F32 ? 4 : 2;
    /* Prefetch 2 KiB ahead in each stream (a stream's rows are adjacent, so this runs into its next row):
       the hardware prefetcher stops at every 4 KiB page and needs a few misses to start again. Measured
       out of cache, one thread: ~1.15x for bf16 rows of K=896 against no prefetch; a whole row ahead
       instead lost up to 40% on long rows (K=8960), whose next row is another chunk's, often another
       thread's. */
    const size_t ahead = (size_t)K * es < 2048 ? (size_t)K * es : 2048;
    const char *row[8];
    __m256 acc[4][8];
    for (int r = 0; r < R; r++) row[r] = (const char *)j->w + (size_t)((n0 + r * stride) * K) * es;
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < KB; k += 16) {
        __m256 x0[4], x1[4];
        for (int m = 0; m < M; m++) {
            x0[m] = _mm256_loadu_ps(j->x + (m0 + m) * K + k);
            x1[m] = _mm256_loadu_ps(j->x + (m0 + m) * K + k + 8);
        }
        for (int r = 0; r < R; r++) {
            GEMV_PREFETCH(row[r] + (size_t)k * es + ahead);
            __m256 w0 = load8(row[r], wdt, (size_t)k), w1 = load8(row[r], wdt, (size_t)k + 8);
            for (int m = 0; m < M; m++) acc[m][r] = _mm256_fmadd_ps(x1[m], w1, _mm256_fmadd_ps(x0[m], w0, acc[m][r]));
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) {
        float s = hsum8(acc[m][r]);
        const float *xr = j->x + (m0 + m) * K;
        for (int64_t k = KB; k < K; k++) s += xr[k] * load_elem(row[r], wdt, (size_t)k);
        epilogue(j, m0 + m, n0 + r * stride, s);
    }
}

/* Rows [n0, n1) as R streams far apart (R rows per block: n0 + i + r * S for the S = (n1 - n0) / R rows
   of each stream), then the < R rows left one by one. A core reads memory fastest with several long
   sequential streams in flight (a plain read of 8 streams measured 1.6x one stream's bandwidth, one thread);
   R adjacent rows would make R streams of one short row each. */
#define SPREAD(M, R) do { \
    const int64_t S = (n1 - n0) / (R); \
    int64_t n = n0 + (R) * S; \
    for (int64_t i = 0; i < S; i++) block_avx2(j, m0, M, n0 + i, S, R, wdt); \
    if ((R) == 8) for (; n + 4 <= n1; n += 4) block_avx2(j, m0, M, n, 1, 4, wdt); \
    for (; n < n1; n++) block_avx2(j, m0, M, n, 1, 1, wdt); \
} while (0)

static AVX2 void range_avx2_m(const Job *j, int64_t m0, int M, int64_t n0, int64_t n1, const int wdt) {
    switch (M) {
    case 1: SPREAD(1, 8); break;
    case 2: SPREAD(2, 4); break;
    case 3: SPREAD(3, 2); break;
    default: SPREAD(4, 2); break;
    }
}

static AVX2 void range_avx2(const Job *j, int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < j->M; m0 += 4) {
        int M = (int)(j->M - m0 < 4 ? j->M - m0 : 4);
        if (j->wdt == DT_F32) range_avx2_m(j, m0, M, n0, n1, DT_F32);
        else if (j->wdt == DT_BF16) range_avx2_m(j, m0, M, n0, n1, DT_BF16);
        else range_avx2_m(j, m0, M, n0, n1, DT_F16);
    }
}
#endif

/* Portable: rows [n0, n1) for up to 4 rows of x from m0, 4 / 2 / 1 adjacent rows of w per block. */
static void range_generic_m(const Job *j, int64_t m0, int M, int64_t n0, int64_t n1, const int wdt) {
    int64_t n = n0;
    switch (M) {
    case 1:
        for (; n + 4 <= n1; n += 4) block_generic(j, m0, 1, n, 4, wdt);
        for (; n < n1; n++) block_generic(j, m0, 1, n, 1, wdt);
        break;
    case 2:
        for (; n + 2 <= n1; n += 2) block_generic(j, m0, 2, n, 2, wdt);
        for (; n < n1; n++) block_generic(j, m0, 2, n, 1, wdt);
        break;
    case 3: for (; n < n1; n++) block_generic(j, m0, 3, n, 1, wdt); break;
    default: for (; n < n1; n++) block_generic(j, m0, 4, n, 1, wdt); break;
    }
}

static void range_generic(const Job *j, int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < j->M; m0 += 4) {
        int M = (int)(j->M - m0 < 4 ? j->M - m0 : 4);
        if (j->wdt == DT_F32) range_generic_m(j, m0, M, n0, n1, DT_F32);
        else if (j->wdt == DT_BF16) range_generic_m(j, m0, M, n0, n1, DT_BF16);
        else range_generic_m(j, m0, M, n0, n1, DT_F16);
    }
}

/* 1: the AVX2/FMA/F16C kernel runs on this CPU (libgcc checks the OS saves the ymm state too), 0: portable */
int gemv_isa(void) {
#ifdef GEMV_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int gemv_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static void run_rows(const Job *j, int64_t n0, int64_t n1, int isa) {
#ifdef GEMV_X86
    if (isa == 1) { range_avx2(j, n0, n1); return; }
#endif
    (void)isa;
    range_generic(j, n0, n1);
}

#ifndef GEMV_CHUNK_BYTES
#define GEMV_CHUNK_BYTES 262144
#endif
/* Rows of w per chunk handed to a thread: ~256 KiB of weights (8 streams of 32 KiB), but at least 4 chunks a
   thread so that one slowed down by a neighbour process leaves the rest to the others; a multiple of 8
   rows, so that every row is read in a block of 8 streams (a row left over is read alone, one stream). */
static int64_t chunk_rows(int64_t N, int64_t row_bytes, int nthreads) {
    int64_t rows = row_bytes > 0 ? GEMV_CHUNK_BYTES / row_bytes : N;
    const int64_t fair = (N + 4 * (int64_t)nthreads - 1) / (4 * (int64_t)nthreads);
    if (rows > fair) rows = fair;
    rows = rows / 8 * 8;
    return rows < 8 ? 8 : rows;
}

typedef struct { Job job; int64_t rows, chunks; int isa; } Task;

static void run_chunk(const Task *t, int64_t c) {
    const int64_t n0 = c * t->rows, n1 = n0 + t->rows < t->job.N ? n0 + t->rows : t->job.N;
    run_rows(&t->job, n0, n1, t->isa);
}

/* Chunks handed out one by one to the threads of torch's own OpenMP pool (this library links the
   libgomp.so.1 torch has loaded): its threads are awake between torch's ops, so a region starts at once,
   and no second pool competes with torch's for the two cores. Whether two threads pay is decided per
   call by the Python side (see Gemv._threads): when a neighbour process holds a core, the region's end
   waits a scheduler tick for the thread that did not get one. */
static void run_task(const Task *t, int nthreads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
#endif
    for (int64_t c = 0; c < t->chunks; c++) run_chunk(t, c);
    (void)nthreads;
}

/* y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]) (+ res[M,N]). 0, or -1 when memory for fp32 x ran out. */
int gemv(int64_t M, int64_t N, int64_t K, const void *x, int xdt, const void *w, int wdt,
         const void *bias, int bdt, const void *res, int rdt, void *y, int ydt, int nthreads, int isa) {
    float *xf = NULL;
    if (M <= 0 || N <= 0) return 0;
    if (xdt != DT_F32 && K > 0) {                       /* widen x once, not once per row of w */
        xf = (float *)malloc((size_t)(M * K) * sizeof(float));
        if (!xf) return -1;
        for (int64_t i = 0; i < M * K; i++) xf[i] = load_elem(x, xdt, (size_t)i);
    }
    Task t = {{M, N, K, xf ? xf : (const float *)x, w, wdt, bias, bdt, res, rdt, y, ydt}, 0, 0, isa};
    if (nthreads < 1) nthreads = 1;
    t.rows = chunk_rows(N, K * (wdt == DT_F32 ? 4 : 2), nthreads);
    t.chunks = (N + t.rows - 1) / t.rows;
    if (nthreads > t.chunks) nthreads = (int)t.chunks;
    if (nthreads <= 1) run_rows(&t.job, 0, N, isa);     /* no helpers at all: ~1 us less */
    else run_task(&t, nthreads);
    free(xf);
    return 0;
}

/* gemv() with its arguments in one block of 15 int64 (see _ARGS): one ctypes argument is cheaper. */
int gemv_packed(const void *block) {
    int64_t a[15];
    memcpy(a, block, sizeof a);                         /* a Python bytes object: no alignment promised */
    return gemv(a[0], a[1], a[2], (const void *)(intptr_t)a[3], (int)a[4], (const void *)(intptr_t)a[5], (int)a[6],
                (const void *)(intptr_t)a[7], (int)a[8], (const void *)(intptr_t)a[9], (int)a[10],
                (void *)(intptr_t)a[11], (int)a[12], (int)a[13], (int)a[14]);
}

/* The sum of n floats read by nthreads threads, in chunks of 256 KiB handed out like the GEMV's, each read
   as 8 streams of 32 KiB side by side: the fastest plain read measured here (8.7 GB/s one stream, 13.5 eight
   streams, one thread), so that the floor it sets for the GEMV is the machine's, not a weak loop's. */
#define SR_CHUNK 65536
#define SR_STREAMS 8
#ifdef GEMV_X86
static AVX2 float sum_avx2(const float *p, int64_t n) {
    const int64_t part = n / SR_STREAMS / 8 * 8;
    __m256 a[SR_STREAMS];
    for (int r = 0; r < SR_STREAMS; r++) a[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < part; i += 8)
        for (int r = 0; r < SR_STREAMS; r++) a[r] = _mm256_add_ps(a[r], _mm256_loadu_ps(p + r * part + i));
    __m256 t = a[0];
    for (int r = 1; r < SR_STREAMS; r++) t = _mm256_add_ps(t, a[r]);
    float s = hsum8(t);
    for (int64_t i = SR_STREAMS * part; i < n; i++) s += p[i];
    return s;
}
#endif
static float sum_generic(const float *p, int64_t n) {
    const int64_t part = n / SR_STREAMS;
    float acc[SR_STREAMS] = {0};
    for (int64_t i = 0; i < part; i++)
        for (int r = 0; r < SR_STREAMS; r++) acc[r] += p[r * part + i];
    float s = 0.0f;
    for (int r = 0; r < SR_STREAMS; r++) s += acc[r];
    for (int64_t i = SR_STREAMS * part; i < n; i++) s += p[i];
    return s;
}
double stream_read(const float *p, int64_t n, int nthreads, int isa) {
    const int64_t chunks = (n + SR_CHUNK - 1) / SR_CHUNK;
    double total = 0.0;
    if (nthreads < 1) nthreads = 1;
    (void)isa;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1) reduction(+:total)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * SR_CHUNK, len = i0 + SR_CHUNK < n ? SR_CHUNK : n - i0;
#ifdef GEMV_X86
        if (isa == 1) { total += sum_avx2(p + i0, len); continue; }
#endif
        total += sum_generic(p + i0, len);
    }
    return total;
}
"""

#: ``gemv_packed``'s argument block: M N K x x_dtype w w_dtype bias bias_dtype res res_dtype y y_dtype threads isa
_ARGS = struct.Struct("<15q")
_FLAGS = ["-O3", "-std=gnu11", "-shared", "-fPIC"]
_OPENMP_FLAGS = ["-fopenmp"]

_lock = threading.Lock()
_library: _Library | None = None
_load_failed: str | None = None  # why the kernel could not be had (set once; then every call uses torch)
_warned = False
_native_enabled = os.environ.get("TORCH_IR_NATIVE_GEMV", "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class _Library:
    lib: ctypes.CDLL
    path: Path
    isa: int  # 1: AVX2/FMA/F16C, 0: the portable C kernel
    openmp: bool


def set_native_enabled(enabled: bool) -> bool:
    """Use the compiled kernel (True, the default unless ``TORCH_IR_NATIVE_GEMV=0``) or always the torch
    path (False: a test of the fallback, or a comparison). Returns the previous setting."""
    global _native_enabled
    previous, _native_enabled = _native_enabled, bool(enabled)
    return previous


def native_status() -> str:
    """One line: which implementation :func:`gemv` runs here, and why."""
    if not _native_enabled:
        return "torch (native GEMV disabled by TORCH_IR_NATIVE_GEMV=0 or set_native_enabled(False))"
    library = _load()
    if library is None:
        return f"torch (native GEMV unavailable: {_load_failed})"
    isa = "AVX2/FMA" if library.isa == 1 else "portable C"
    threads = "OpenMP" if library.openmp else "one thread (built without OpenMP)"
    return f"native {isa}, {threads}: {library.path}"


def native_available() -> bool:
    """Whether calls run the compiled kernel (building it now if it is not built yet)."""
    return _native_enabled and _load() is not None


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$TORCH_IR_CACHE``, else ``$XDG_CACHE_HOME/torch_ir``, else
    ``~/.cache/torch_ir``; the ``gemv`` folder inside it."""
    if os.environ.get("TORCH_IR_CACHE"):
        root = Path(os.environ["TORCH_IR_CACHE"])
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "torch_ir"
    else:
        root = Path.home() / ".cache" / "torch_ir"
    return root / "gemv"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "gcc")


def _private(path: Path) -> bool:
    """Ours and writable by nobody else: a library there runs as this process, so it must be the one we
    built (another user able to write the cache folder could otherwise put code in it)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return (not hasattr(os, "getuid") or st.st_uid == os.getuid()) and not st.st_mode & 0o022


def _build(compiler: str, flags: list[str], target: Path) -> None:
    """Compile the source into ``target`` via a temporary file in its folder and an atomic rename."""
    fd, tmp_so = tempfile.mkstemp(prefix=target.stem + ".", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    src = Path(tmp_so[: -len(".so.tmp")] + ".c")
    try:
        src.write_text(_SOURCE)
        proc = subprocess.run([compiler, *flags, "-o", tmp_so, str(src)], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(compiler).name} failed: {proc.stderr.strip()[-2000:]}")
        os.chmod(tmp_so, 0o755)
        os.replace(tmp_so, target)
    finally:
        for leftover in (src, Path(tmp_so)):
            leftover.unlink(missing_ok=True)


def _load_from(folder: Path, compiler: str) -> _Library:
    """Build (unless cached) and load the kernel in ``folder``: with OpenMP, else without."""
    errors = []
    for flags in ([*_FLAGS, *_OPENMP_FLAGS], _FLAGS):
        key = hashlib.sha256("\0".join([_SOURCE, compiler, *flags, platform.machine()]).encode()).hexdigest()[:20]
        target = folder / f"gemv-{key}.so"
        try:
            if not (target.exists() and _private(target)):
                _build(compiler, flags, target)
            lib = ctypes.CDLL(str(target))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            errors.append(str(exc))
            continue
        i64, cint, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        lib.gemv.argtypes = [i64, i64, i64, ptr, cint, ptr, cint, ptr, cint, ptr, cint, ptr, cint, cint, cint]
        lib.gemv.restype = cint
        lib.gemv_packed.argtypes = [ctypes.c_char_p]
        lib.gemv_packed.restype = cint
        lib.stream_read.argtypes = [ptr, i64, cint, cint]
        lib.stream_read.restype = ctypes.c_double
        lib.gemv_isa.restype = cint
        lib.gemv_openmp.restype = cint
        return _Library(lib, target, int(lib.gemv_isa()), bool(lib.gemv_openmp()))
    raise RuntimeError("; ".join(errors))


def _load() -> _Library | None:
    """The compiled kernel, built on first use; None (once, with a warning) when it cannot be had."""
    global _library, _load_failed
    if _library is not None or _load_failed is not None:
        return _library
    with _lock:
        if _library is not None or _load_failed is not None:
            return _library
        compiler = _compiler()
        if compiler is None:
            _load_failed = f"no C compiler ({os.environ.get('CC') or 'gcc'}) on PATH"
            return None
        folder = cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not _private(folder):
                raise PermissionError(f"{folder} is not private to this user")
            _library = _load_from(folder, compiler)
        except (OSError, RuntimeError) as exc:
            log.debug("GEMV kernel: cache %s unusable (%s); building in a temporary folder", folder, exc)
            try:  # an unwritable or shared cache: build in a private temporary folder, for this process
                _library = _load_from(Path(tempfile.mkdtemp(prefix="torch_ir_gemv_")), compiler)
            except (OSError, RuntimeError) as exc2:
                _load_failed = str(exc2)
        if _library is not None:
            log.debug("GEMV kernel: %s", _library.path)
        return _library


def _warn_fallback() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"torch_ir CPU GEMV: {native_status()}; one-token GEMMs run at PyTorch's speed",
                      RuntimeWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------- checks


def _arg(t: Tensor, what: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(address, dtype code, bytes)`` of a tensor the C kernel may touch, after checking everything its
    pointer arithmetic relies on: a CPU tensor of a kernel dtype, this shape, contiguous, and its bytes
    inside its storage (a view whose storage was shrunk with ``resize_`` claims bytes that are gone)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"gemv: {what} must be a tensor, not {type(t).__name__}")
    code = DTYPE_CODES.get(t.dtype)
    if code is None or not t.is_cpu:
        raise TypeError(f"gemv: {what} must be a CPU float32/bfloat16/float16 tensor, got {t.dtype} on {t.device}")
    if t.shape != shape:
        raise ValueError(f"gemv: {what} has shape {tuple(t.shape)}, expected {shape}")
    if not t.is_contiguous():
        raise ValueError(f"gemv: {what} must be contiguous (call .contiguous())")
    size = t.nbytes
    if size and t.storage_offset() * t.element_size() + size > t.untyped_storage().nbytes():
        raise ValueError(f"gemv: {what} claims {size} bytes beyond what its storage holds")
    return t.data_ptr(), code, size


def _overlap(a: int, a_size: int, b: int, b_size: int) -> bool:
    return a < b + b_size and b < a + a_size


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
    ``out`` and ``residual`` only, so that a decode step does not check the same weights every token.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError("gemv: weight must be a 2-D tensor [N, K]")
        self.n, self.k = int(weight.shape[0]), int(weight.shape[1])
        self.weight, self.bias = weight, bias
        self._w = _arg(weight, "weight", (self.n, self.k))
        self._b = _arg(bias, "bias", (self.n,)) if bias is not None else (0, 0, 0)

    def __call__(self, x: Tensor, out: Tensor | None = None, residual: Tensor | None = None,
                 threads: int | None = None) -> Tensor:
        """``x [M, K]`` -> ``out [M, N]`` (a new tensor of ``x``'s dtype when None); ``residual [M, N]`` may be
        ``out`` itself (an in-place residual add). ``threads``: by default one for a weight under
        ``SINGLE_THREAD_BYTES``, else one or ``torch.get_num_threads()``, whichever ran faster lately
        (:class:`_ThreadPolicy`); a number forces it."""
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
        library = _load() if _native_enabled else None
        if library is None:
            if _native_enabled:
                _warn_fallback()
            return torch_gemv(x, self.weight, self.bias, residual, out)
        w, b = self._w, self._b
        policy = None
        if threads is None:
            policy = _policy if w[2] >= SINGLE_THREAD_BYTES and torch.get_num_threads() > 1 else None
            threads = policy.pick(w[2], torch.get_num_threads()) if policy is not None else 1
        # one packed argument block: ctypes converts one pointer much faster than fifteen arguments
        args = _ARGS.pack(m, self.n, self.k, xp, xc, w[0], w[1], b[0], b[1], rp, rc, yp, yc, max(1, threads),
                          library.isa)
        start = time.perf_counter_ns()
        status = library.lib.gemv_packed(args)
        if policy is not None:
            policy.record(w[2], threads, time.perf_counter_ns() - start)
        if status != 0:  # no memory for the fp32 copy of x: torch needs less of it
            return torch_gemv(x, self.weight, self.bias, residual, out)
        return out


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


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
         out: Tensor | None = None) -> Tensor:
    """``x [M, K] · weight [N, K]ᵀ (+ bias [N]) (+ residual [M, N])`` into ``out`` (see :class:`Gemv`)."""
    return Gemv(weight, bias)(x, out=out, residual=residual)


# ---------------------------------------------------------------------------------------- bandwidth


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
    library = _load() if _native_enabled else None
    times: dict[str, list[float]] = {"c": [], "c1": [], "mv": []}
    readers = {"mv": lambda: torch.mv(buf, vec)}
    if library is not None:
        readers["c"] = lambda: library.lib.stream_read(buf.data_ptr(), buf.numel(), threads, library.isa)
        readers["c1"] = lambda: library.lib.stream_read(buf.data_ptr(), buf.numel(), 1, library.isa)
    for rep in range(reps + 1):
        for name, read in readers.items():
            start = time.perf_counter()
            read()
            if rep:  # the first round warms the thread pool and the page tables
                times[name].append(time.perf_counter() - start)
    size = buf.numel() * 4
    gbs = {name: size / statistics.median(t) / 1e9 if t else 0.0 for name, t in times.items()}
    return StreamBandwidth(max(gbs.values()), gbs["c"], gbs["c1"], gbs["mv"], size, threads)


__all__ = ["DTYPE_CODES", "Gemv", "StreamBandwidth", "cache_dir", "gemv", "measure_stream_bandwidth",
           "native_available", "native_status", "set_native_enabled", "torch_gemv"]
