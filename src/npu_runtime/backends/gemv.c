/* The decode GEMV of the CPU backend: y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]) (+ res[M,N]), fp32/bf16/fp16.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (gcc -O3 -shared -fPIC, -fopenmp when it
   links) and called through ctypes by cpu_gemv.py, whose docstring explains the design. The Python side
   checks every pointer and size before a call: this code trusts them. Keep in step with cpu_gemv.py: the
   dtype codes (DTYPE_CODES) and gemv_packed's argument block (_ARGS). */
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

/* bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16: half.c, before this file */
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
    const uint16_t *xb;          /* [M, K] x as bf16 for the vdpbf16ps kernel (dp_x), or NULL */
} Job;

/* hw: an x86 kernel, whose fp16 values convert by F16C (half.c's f16c_to_f32 and f32_to_f16c: its bits, ~10x
   faster; in plain C an fp16 call's x and y took ~20 us of a 4864-deep GEMV) */
static inline __attribute__((always_inline)) float load_hw(const void *p, int dt, size_t i, const int hw) {
    return hw && dt == DT_F16 ? f16c_to_f32(((const uint16_t *)p)[i]) : load_elem(p, dt, i);
}
static inline __attribute__((always_inline)) void epilogue(const Job *j, int64_t m, int64_t n, float v, const int hw) {
    if (j->bias) v += load_hw(j->bias, j->bdt, (size_t)n, hw);
    if (j->res) v += load_hw(j->res, j->rdt, (size_t)(m * j->N + n), hw);
    const size_t at = (size_t)(m * j->N + n);
    if (hw && j->ydt == DT_F16) ((uint16_t *)j->y)[at] = f32_to_f16c(v);
    else store_elem(j->y, j->ydt, at, v);
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
        epilogue(j, m0 + m, n0 + r, s, 0);
    }
}

#ifdef GEMV_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* Each stream is prefetched 4 KiB ahead (at most one row: a short row's next row is the same stream's) into
   L2, not L1: the hardware prefetcher stops at every 4 KiB page and needs a few misses to start again.
   Measured out of cache, one thread, Zen 4 (bf16, the Qwen2.5 shapes): 2 KiB into L1 (_MM_HINT_T0) read
   14-17 GB/s, no prefetch 17-23, 2-8 KiB into L2 (_MM_HINT_T1) 19-26 (4 KiB best on K=1536); the L1 fills
   of 8 streams crowd out the demand loads. A whole row ahead on long rows (K=8960, one row per stream and
   chunk: the next row is another chunk's, often another thread's) lost up to 40% with the L1 hint. */
#define GEMV_AHEAD 4096
#ifndef GEMV_NO_PREFETCH
#define GEMV_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#else
#define GEMV_PREFETCH(p) ((void)(p))
#endif
static inline size_t prefetch_ahead(int64_t K, size_t es) {
    return (size_t)K * es < GEMV_AHEAD ? (size_t)K * es : GEMV_AHEAD;
}
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
    const size_t ahead = prefetch_ahead(K, es);  /* a stream's rows are adjacent: this runs into its next row */
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
        epilogue(j, m0 + m, n0 + r * stride, s, 1);
    }
}

/* Rows [n0, n1) as R streams far apart (R rows per block: n0 + i + r * S for the S = (n1 - n0) / R rows
   of each stream), then the < R rows left one by one. A core reads memory fastest with several long
   sequential streams in flight (a plain read of 8 streams measured 1.6x one stream's bandwidth, one thread);
   R adjacent rows would make R streams of one short row each. BLOCK: block_avx2 or block_avx512. */
#define SPREAD(BLOCK, M, R) do { \
    const int64_t S = (n1 - n0) / (R); \
    int64_t n = n0 + (R) * S; \
    for (int64_t i = 0; i < S; i++) BLOCK(j, m0, M, n0 + i, S, R, wdt); \
    if ((R) == 8) for (; n + 4 <= n1; n += 4) BLOCK(j, m0, M, n, 1, 4, wdt); \
    for (; n < n1; n++) BLOCK(j, m0, M, n, 1, 1, wdt); \
} while (0)
/* The block shapes by rows of x: M x R = 8 accumulators, R streams of w. */
#define RANGE_M(BLOCK) switch (M) { \
    case 1: SPREAD(BLOCK, 1, 8); break; \
    case 2: SPREAD(BLOCK, 2, 4); break; \
    case 3: SPREAD(BLOCK, 3, 2); break; \
    default: SPREAD(BLOCK, 4, 2); break; \
}
static AVX2 void range_avx2_m(const Job *j, int64_t m0, int M, int64_t n0, int64_t n1, const int wdt) {
    RANGE_M(block_avx2)
}
static AVX2 void range_avx2(const Job *j, int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < j->M; m0 += 4) {
        int M = (int)(j->M - m0 < 4 ? j->M - m0 : 4);
        if (j->wdt == DT_F32) range_avx2_m(j, m0, M, n0, n1, DT_F32);
        else if (j->wdt == DT_BF16) range_avx2_m(j, m0, M, n0, n1, DT_BF16);
        else range_avx2_m(j, m0, M, n0, n1, DT_F16);
    }
}

/* AVX-512 F/BW/VL, for bf16/fp16 weights: the AVX2 kernel's design with 16 fp32 lanes, K by 32 (a 64-byte
   line of a row per step and stream), the tail of K % 32 one by one (row_tail). Same numerics: fp32
   products of the exactly widened weights (bf16 by a 16-bit shift, fp16 by vcvtph2ps), fp32 sums; only
   the order of the sums differs.
   Measured, one thread (bench/gemv, the Qwen2.5 shapes): in cache 1.15-1.45x the AVX2 kernel's bytes/s for
   bf16, out of cache (decode) the same within noise, bound by the memory streams. fp32 weights keep the
   AVX2 kernel, which reads them at about a plain read's speed: 16-lane fp32 rows measured no faster in
   cache and ~10% slower out of it (in this kernel's first form, with a masked tail). */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
static inline __attribute__((always_inline)) AVX512 __m512 load16(const void *w, const int wdt, size_t i) {
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (wdt == DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}
/* The rest of a row past its multiple of 32 (K % 32 columns), one by one in fp32 as in block_avx2: a masked
   step inside the loop instead was slower, and a second copy of the step after it made gcc keep the
   accumulators in memory. */
static inline float row_tail(const Job *j, int64_t m, const char *row, int64_t k0, int wdt) {
    float s = 0.0f;
    const float *xr = j->x + m * j->K;
    for (int64_t k = k0; k < j->K; k++) s += xr[k] * load_elem(row, wdt, (size_t)k);
    return s;
}
static inline __attribute__((always_inline)) AVX512
void block_avx512(const Job *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int wdt) {
    const int64_t K = j->K, KB = K - K % 32;
    const size_t ahead = prefetch_ahead(K, 2);
    const char *row[8];
    __m512 acc[4][8];
    for (int r = 0; r < R; r++) row[r] = (const char *)j->w + (size_t)((n0 + r * stride) * K) * 2;
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < KB; k += 32) {
        __m512 x0[4], x1[4];
        for (int m = 0; m < M; m++) {
            x0[m] = _mm512_loadu_ps(j->x + (m0 + m) * K + k);
            x1[m] = _mm512_loadu_ps(j->x + (m0 + m) * K + k + 16);
        }
        for (int r = 0; r < R; r++) {
            GEMV_PREFETCH(row[r] + (size_t)k * 2 + ahead);
            __m512 w0 = load16(row[r], wdt, (size_t)k), w1 = load16(row[r], wdt, (size_t)k + 16);
            for (int m = 0; m < M; m++) acc[m][r] = _mm512_fmadd_ps(x1[m], w1, _mm512_fmadd_ps(x0[m], w0, acc[m][r]));
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++)
        epilogue(j, m0 + m, n0 + r * stride, _mm512_reduce_add_ps(acc[m][r]) + row_tail(j, m0 + m, row[r], KB, wdt), 1);
}

static AVX512 void range_avx512_m(const Job *j, int64_t m0, int M, int64_t n0, int64_t n1, const int wdt) {
    RANGE_M(block_avx512)
}
static AVX512 void range_avx512(const Job *j, int64_t n0, int64_t n1) {    /* bf16 and fp16 weights only */
    for (int64_t m0 = 0; m0 < j->M; m0 += 4) {
        int M = (int)(j->M - m0 < 4 ? j->M - m0 : 4);
        if (j->wdt == DT_BF16) range_avx512_m(j, m0, M, n0, n1, DT_BF16);
        else range_avx512_m(j, m0, M, n0, n1, DT_F16);
    }
}

/* AVX512-BF16, bf16 weights and x exactly bf16 (dp_x says when): vdpbf16ps multiplies 32 pairs a step with
   no widening, a product of two bf16 exact in fp32, each added in fp32 rounded to nearest even; so the same
   sum as the widening kernels', in another order, as long as its DAZ/FTZ never acts (dp_x ensures it).
   Measured out of cache, one thread (the Qwen2.5 shapes, a loaded machine): 1.07-1.3x the bytes/s of the
   widening AVX-512 kernel, whose shifts and FMAs the memory streams wait on. */
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
static inline __attribute__((always_inline)) AVX512BF16
void block_dp(const Job *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int wdt) {
    const int64_t K = j->K, KB = K - K % 32;
    const size_t ahead = prefetch_ahead(K, 2);
    const char *row[8];
    __m512 acc[4][8];
    for (int r = 0; r < R; r++) row[r] = (const char *)j->w + (size_t)((n0 + r * stride) * K) * 2;
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < KB; k += 32) {
        __m512bh xv[4];
        for (int m = 0; m < M; m++) xv[m] = (__m512bh)_mm512_loadu_si512(j->xb + (m0 + m) * K + k);
        for (int r = 0; r < R; r++) {
            GEMV_PREFETCH(row[r] + (size_t)k * 2 + ahead);
            __m512bh wv = (__m512bh)_mm512_loadu_si512(row[r] + (size_t)k * 2);
            for (int m = 0; m < M; m++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv[m], wv);
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++)
        epilogue(j, m0 + m, n0 + r * stride, _mm512_reduce_add_ps(acc[m][r]) + row_tail(j, m0 + m, row[r], KB, wdt), 1);
}
static AVX512BF16 void range_dp_m(const Job *j, int64_t m0, int M, int64_t n0, int64_t n1, const int wdt) {
    RANGE_M(block_dp)
}
static AVX512BF16 void range_dp(const Job *j, int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < j->M; m0 += 4) range_dp_m(j, m0, (int)(j->M - m0 < 4 ? j->M - m0 : 4), n0, n1, DT_BF16);
}
#endif

/* The smallest nonzero finite |w| of n bf16 weights (+inf for none): a subnormal one, or one whose products
   with x could fall near the subnormal range, keeps the weight off the vdpbf16ps kernel (dp_x). Once per
   weight (cpu_gemv.Gemv keeps it). */
float gemv_min_abs_bf16(const void *w, int64_t n) {
    const uint16_t *h = (const uint16_t *)w;
    int16_t lo = 0x7fff;              /* the min of |w| - 1, a 0 counted as 0x7fff: a signed 16-bit min, SSE2's */
    for (int64_t i = 0; i < n; i++) {
        const int16_t a = (int16_t)(((h[i] & 0x7fffu) + 0x7fffu) & 0x7fffu);
        lo = a < lo ? a : lo;
    }
    return lo == 0x7fff ? __builtin_inff() : bf16_to_f32((uint16_t)(lo + 1));  /* NaN/inf: no finite one */
}

/* x [M, K] (fp32) as bf16 for vdpbf16ps, or NULL to take the widening kernel: when a value is not exactly a
   bf16 number, or subnormal (which vdpbf16ps reads as 0: DAZ), or when the smallest nonzero |x| times the
   weight's (wmin) is below 2^-110. Then every product is a multiple of 2^-125 (a bf16 number's low bit is
   2^-7 of its exponent), and so is every partial sum: none is subnormal, and vdpbf16ps's flush of
   subnormal results to zero (FTZ) never acts. A NaN or inf x goes through like any other value. */
static __attribute__((unused)) uint16_t *dp_x(const float *x, int64_t n, float wmin) {
    float xmin = __builtin_inff();
    if (!(wmin >= 0x1p-126f)) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u; memcpy(&u, x + i, 4);
        const uint32_t a = u & 0x7fffffffu;
        if (u & 0xffffu) return NULL;                   /* not a bf16 number */
        if (a == 0 || a >= 0x7f800000u) continue;
        if (a < 0x00800000u) return NULL;               /* subnormal */
        float f; memcpy(&f, &a, 4);
        if (f < xmin) xmin = f;
    }
    if ((double)xmin * (double)wmin < 0x1p-110) return NULL;
    uint16_t *xb = (uint16_t *)malloc((size_t)n * sizeof(uint16_t));
    if (xb) for (int64_t i = 0; i < n; i++) { uint32_t u; memcpy(&u, x + i, 4); xb[i] = (uint16_t)(u >> 16); }
    return xb;                                          /* NULL when out of memory: the widening kernel */
}

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

/* The best kernel this CPU runs (libgcc checks that the OS saves the ymm/zmm state too): 3 AVX512-BF16 (bf16
   weights and x, when dp_x allows; else as 2), 2 AVX-512 F/BW/VL (bf16/fp16 weights; fp32 ones run AVX2),
   1 AVX2/FMA/F16C, 0 portable C. A call may ask for less (its isa argument), never for more. */
int gemv_isa(void) {
#ifdef GEMV_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return 0;
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl");
    if (!avx512) return 1;
    return __builtin_cpu_supports("avx512bf16") ? 3 : 2;
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
    if (j->xb) { range_dp(j, n0, n1); return; }
    if (isa >= 2 && j->wdt != DT_F32) { range_avx512(j, n0, n1); return; }
    if (isa >= 1) { range_avx2(j, n0, n1); return; }
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
   call by the Python side (_ThreadPolicy in cpu_gemv.py): when a neighbour process holds a core, the
   region's end waits a scheduler tick for the thread that did not get one. */
static void run_task(const Task *t, int nthreads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
#endif
    for (int64_t c = 0; c < t->chunks; c++) run_chunk(t, c);
    (void)nthreads;
}

/* y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]) (+ res[M,N]). 0, or -1 when memory for fp32 x ran out. wmin: the
   weight's gemv_min_abs_bf16 when isa is 3 and w is bf16. */
int gemv(int64_t M, int64_t N, int64_t K, const void *x, int xdt, const void *w, int wdt,
         const void *bias, int bdt, const void *res, int rdt, void *y, int ydt, int nthreads, int isa, float wmin) {
    float *xf = NULL;
    uint16_t *xb = NULL;
    if (M <= 0 || N <= 0) return 0;
    if (xdt != DT_F32 && K > 0) {                       /* widen x once, not once per row of w */
        xf = (float *)malloc((size_t)(M * K) * sizeof(float));
        if (!xf) return -1;
#ifdef GEMV_X86
        if (isa >= 1 && xdt == DT_F16) f16c_row(xf, (const uint16_t *)x, M * K);
        else
#endif
        for (int64_t i = 0; i < M * K; i++) xf[i] = load_elem(x, xdt, (size_t)i);
    }
#ifdef GEMV_X86
    if (isa == 3 && wdt == DT_BF16 && K > 0) xb = dp_x(xf ? xf : (const float *)x, M * K, wmin);
#endif
    (void)wmin;
    Task t = {{M, N, K, xf ? xf : (const float *)x, w, wdt, bias, bdt, res, rdt, y, ydt, xb}, 0, 0, isa};
    if (nthreads < 1) nthreads = 1;
    t.rows = chunk_rows(N, K * (wdt == DT_F32 ? 4 : 2), nthreads);
    t.chunks = (N + t.rows - 1) / t.rows;
    if (nthreads > t.chunks) nthreads = (int)t.chunks;
    if (nthreads <= 1) run_rows(&t.job, 0, N, isa);     /* no helpers at all: ~1 us less */
    else run_task(&t, nthreads);
    free(xf);
    free(xb);
    return 0;
}

/* gemv() with its arguments in one block of 16 int64 (_ARGS in cpu_gemv.py; wmin's float bits last): one ctypes
   argument is cheaper. */
int gemv_packed(const void *block) {
    int64_t a[16];
    memcpy(a, block, sizeof a);                         /* a Python bytes object: no alignment promised */
    uint32_t bits = (uint32_t)a[15];
    float wmin;
    memcpy(&wmin, &bits, 4);
    return gemv(a[0], a[1], a[2], (const void *)(intptr_t)a[3], (int)a[4], (const void *)(intptr_t)a[5], (int)a[6],
                (const void *)(intptr_t)a[7], (int)a[8], (const void *)(intptr_t)a[9], (int)a[10],
                (void *)(intptr_t)a[11], (int)a[12], (int)a[13], (int)a[14], wmin);
}
