/* The x-quantized-to-int8 path of the quantized GEMV (activations="int8" in cpu_qgemv.py): Q4_0, Q5_0 and Q4_K
   here; Q8_0 and Q6_K in gemv_q_i8k.c (appended after this file: the same quantize_x, threads and contract); every
   layout on a 16-row interleaved copy of W in gemv_q_x16.c (AVX-512 VNNI; qgemv_i8 below runs it when given one).

   Appended to gemv_q.c and gemv_q5.c by the loader (one translation unit: QJob, SPREAD, chunk_rows, kq_scales,
   q5_unsigned_avx2, q5_codes_c).
   llama.cpp's trade: x is quantized once per call, per group of 32, to int8 q = round(x / dx) (fp32
   division, ties to even) with dx = max|x| / 127 (fp32); then each group's dot product with the weight
   codes is an exact integer, and only its scaling is fp32:
     y = sum over groups g of (D_g * dx_g) * isum_g - M_g * (dx_g * sx_g)
   isum_g = sum of code * q over the group (Q4_0: code = nibble - 8, D = d, M = 0; Q5_0: code = 5-bit code - 16,
   D = d, M = 0; Q4_K: code = nibble,
   D = d*sc, M = dmin*m of the sub-block), sx_g = sum of q. The integer sums are exact in any order; the
   fp32 products and sums are in whatever order the lanes give (the tests bound them). Unsigned nibbles meet
   signed q in AVX-512 VNNI's vpdpbusd (8 int32 lanes of 4 products each) or AVX2's maddubs/madd; Q4_0's
   "- 8" enters as each lane's starting value -8 * (sum of its 4 q), precomputed with q, and Q5_0's "- 16" (its codes
   made unsigned, 0..31) as twice that.
   A prefill's many rows of x: up to IM per pass over a chunk of weight rows (IB), each block's codes decoded once
   (unpacked, made unsigned) and dotted with each of those rows' q; per (row of x, row of W) the integer sums and
   the fp32 steps are the row's alone, in the same order, so a row's result does not depend on how many rows the
   call has (the tests compare bits). Q4_K reads dx 8 lanes wide (dx8: two groups' D * dx in vector multiplies);
   Q4_0/Q5_0 (and gemv_q_i8k.c's layouts) broadcast the scalar d * dx, the same fp32 product: the wide load made
   the one-row decode ~9 % slower (Q8_0, measured). */
#include <stdlib.h>

/* rows of x per pass over the weights (each block's codes decoded once for them all) */
#define IM 8
/* the loops over rows of x fully unrolled (M is a constant in each copy): their accumulators then live in registers,
   where gcc's own limits would leave the larger bodies rolled, the accumulators in memory (the rows of W stay a loop:
   unrolled too, Q4_K's scales of 4 rows spill and one row of x ran ~25% slower) */
#define UNROLL _Pragma("GCC unroll 8")

typedef struct {
    const QJob *j;
    const int8_t *qx;     /* [M, K] */
    const float *dx;      /* [M, K / 32] */
    const float *dxs;     /* [M, K / 32]: dx * sx */
    const int32_t *corr;  /* [M, K / 4]: -8 * the sum of each 4 q (Q4_0) */
    const float *dx8;     /* [M, K / 32, 8]: dx for each of 8 lanes (a block's d * dx in one vector multiply) */
    const int32_t *xsum;  /* [M, K / 32]: the sum of each group's q (gemv_q_x16.c's lanes start at a multiple) */
    const int32_t *xsum16;  /* [M, K / 32]: the sum of its first 16 q (the start of a Q6_K sub-block's lanes) */
    const int16_t *corr16;  /* [M, K / 2]: -32 * the sum of each 2 q (AVX2's Q6_K pairs, gemv_q_i8k.c) */
} IJob;

/* One row of x to int8 groups (vectorized by gcc: SSE2 at least). Non-finite x give 0 codes, never an
   out-of-range conversion. */
static void quantize_x(const float *x, int64_t K, int8_t *qx, float *dx, float *dxs, int32_t *corr, float *dx8,
                       int32_t *xsum, int32_t *xsum16, int16_t *corr16) {
    for (int64_t g = 0; g < K / QK; g++) {
        const float *v = x + g * QK;
        float amax = 0.0f, t[QK];
        for (int i = 0; i < QK; i++) { const float a = v[i] < 0.0f ? -v[i] : v[i]; amax = a > amax ? a : amax; }
        const float d = amax / 127.0f;
        int s = 0, s16 = 0;
        for (int i = 0; i < QK; i++) {
            t[i] = d > 0.0f ? v[i] / d : 0.0f;
            if (!(t[i] > -127.5f && t[i] < 127.5f)) t[i] = 0.0f;  /* NaN; |x / dx| is <= 127 (1 + 2^-23) */
            t[i] = (t[i] + 12582912.0f) - 12582912.0f;  /* + 1.5 * 2^23: rounds to an integer, ties to even */
        }
        for (int i = 0; i < QK; i++) { qx[g * QK + i] = (int8_t)t[i]; s += (int)t[i]; s16 += i < 16 ? (int)t[i] : 0; }
        for (int l = 0; l < QK / 4; l++) {
            const int8_t *q = qx + g * QK + 4 * l;
            corr[g * 8 + l] = -8 * (q[0] + q[1] + q[2] + q[3]);
        }
        for (int l = 0; l < QK / 2; l++)
            corr16[g * 16 + l] = (int16_t)(-32 * (qx[g * QK + 2 * l] + qx[g * QK + 2 * l + 1]));
        dx[g] = d;
        xsum[g] = s;
        xsum16[g] = s16;
        for (int l = 0; l < 8; l++) dx8[g * 8 + l] = d;
        dxs[g] = d * (float)s;
    }
}

/* Row n of W against M rows of x from m0, portable C: each block's codes decoded once, then each row's integer sums
   and fp32 steps in the order one row alone takes them (the results do not depend on M). */
static void iblock_c(const IJob *ij, int64_t m0, const int M, int64_t n, const int qt) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const int bs = block_bytes(qt);
    float acc[IM], macc[IM];
    for (int m = 0; m < M; m++) acc[m] = macc[m] = 0.0f;
    for (int64_t b = 0; b < j->nb; b++) {
        const uint8_t *blk = j->w + n * j->row_bytes + b * bs;
        if (qt == QT_Q5_0 || qt == QT_Q4_0) {
            int8_t c[QK];
            if (qt == QT_Q5_0) q5_codes_c(blk, c);
            else for (int i = 0; i < 16; i++) {
                c[i] = (int8_t)((blk[2 + i] & 15) - 8);
                c[16 + i] = (int8_t)((blk[2 + i] >> 4) - 8);
            }
            const float d = f16_to_f32(load_u16(blk));
            for (int m = 0; m < M; m++) {
                const int8_t *q = ij->qx + (m0 + m) * j->K + b * QK;
                int s = 0;
                for (int i = 0; i < QK; i++) s += c[i] * q[i];
                acc[m] += (d * ij->dx[(m0 + m) * G + b]) * (float)s;
            }
            continue;
        }
        float D[16], Mn[16];
        kq_scales(blk, qt, D, Mn);
        for (int c = 0; c < 4; c++) {
            const int64_t g = 8 * b + 2 * c;
            for (int m = 0; m < M; m++) {
                const int8_t *q = ij->qx + (m0 + m) * j->K + g * QK;
                const float *dx = ij->dx + (m0 + m) * G, *dxs = ij->dxs + (m0 + m) * G;
                int s0 = 0, s1 = 0;
                for (int i = 0; i < 32; i++) {
                    s0 += (blk[16 + 32 * c + i] & 15) * q[i];
                    s1 += (blk[16 + 32 * c + i] >> 4) * q[QK + i];
                }
                acc[m] += (D[4 * c] * dx[g]) * (float)s0 + (D[4 * c + 2] * dx[g + 1]) * (float)s1;
                macc[m] += Mn[4 * c] * dxs[g] + Mn[4 * c + 2] * dxs[g + 1];
            }
        }
    }
    for (int m = 0; m < M; m++) store(j, m0 + m, n, acc[m] - macc[m]);
}

#ifdef QG_X86
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
/* 8 int32 lanes += 4 products of unsigned u and signed s bytes each (no overflow: u <= 128, |s| <= 127; maddubs' pairs
   <= 2 * 128 * 127 = 32512 fit int16: here u <= 31, gemv_q_i8k.c's Q8_0 |code| <= 128 and Q6_K u <= 63) */
#define DOT_VNNI(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define DOT_AVX2(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), \
                                                                       _mm256_set1_epi16(1)))

/* Q5_0's codes + 16 where AVX-512 BW/VL is at hand: qh itself the mask of the fifth bits (q5_unsigned_avx2 spreads
   and tests them in 5 instructions). */
static inline __attribute__((always_inline)) VNNI __m256i q5_unsigned_vnni(const uint8_t *blk) {
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    return _mm256_or_si256(q5_nibbles_avx2(blk), _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(16)));
}

/* R rows of W (n0 + r * stride) against M rows of x from m0; Q5U: Q5_0's codes + 16. Each block's codes are decoded
   once, then dotted with each row's q: per (row of x, row of W) the same integer sums and fp32 steps, in the same
   order, as with M = 1 (the results do not depend on how many rows of x a call has). */
#define IBLOCK(NAME, ATTR, DOT, Q5U) \
static inline __attribute__((always_inline)) ATTR \
void NAME(const IJob *ij, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) { \
    const QJob *j = ij->j; \
    const int64_t G = j->K / QK; \
    const int8_t *qx = ij->qx + m0 * j->K; \
    const float *dx8 = ij->dx8 + m0 * G * 8, *dxs = ij->dxs + m0 * G, *dx = ij->dx + m0 * G; \
    const int32_t *corr = ij->corr + m0 * (j->K / 4); \
    const int bs = block_bytes(qt); \
    const __m256i m4 = _mm256_set1_epi8(15), shift = _mm256_set_epi64x(4, 4, 0, 0); \
    __m256 acc[IM][4]; \
    float macc[IM][4]; \
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) { acc[m][r] = _mm256_setzero_ps(); macc[m][r] = 0.0f; } \
    for (int64_t b = 0; b < j->nb; b++) { \
        for (int r = 0; r < R; r++) { \
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * bs; \
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0); \
            if (qt == QT_Q5_0 || qt == QT_Q4_0) { \
                /* Q5_0: the codes + 16 (0..31, unsigned), each lane starting at -16 * the sum of its 4 q = 2 * corr; \
                   Q4_0: the 16 bytes twice, the upper copy shifted (nibbles 0..15, then 16..31), from corr */ \
                const __m256i u = qt == QT_Q5_0 ? Q5U(blk) : _mm256_and_si256(_mm256_srlv_epi64( \
                    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2))), shift), m4); \
                const float d = _cvtsh_ss(load_u16(blk)); \
                UNROLL for (int m = 0; m < M; m++) { \
                    const __m256i c = _mm256_loadu_si256((const __m256i *)(corr + m * (j->K / 4) + 8 * b)); \
                    const __m256i i = DOT(qt == QT_Q5_0 ? _mm256_slli_epi32(c, 1) : c, u, \
                                          _mm256_loadu_si256((const __m256i *)(qx + m * j->K + QK * b))); \
                    acc[m][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[m * G + b]), _mm256_cvtepi32_ps(i), acc[m][r]); \
                } \
                continue; \
            } \
            _mm_prefetch((const char *)blk + QG_AHEAD + 64, _MM_HINT_T0); \
            _mm_prefetch((const char *)blk + QG_AHEAD + 128, _MM_HINT_T0); \
            float D[16], Mn[16]; \
            kq_scales(blk, qt, D, Mn); \
            for (int c = 0; c < 4; c++) { \
                const int64_t g = 8 * b + 2 * c; \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c)); \
                const __m256i u0 = _mm256_and_si256(v, m4), u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4); \
                const __m256 D0 = _mm256_set1_ps(D[4 * c]), D1 = _mm256_set1_ps(D[4 * c + 2]); \
                UNROLL for (int m = 0; m < M; m++) { \
                    const int8_t *q = qx + m * j->K + QK * g; \
                    const __m256i i0 = DOT(_mm256_setzero_si256(), u0, _mm256_loadu_si256((const __m256i *)q)); \
                    const __m256i i1 = DOT(_mm256_setzero_si256(), u1, _mm256_loadu_si256((const __m256i *)(q + QK))); \
                    const float *e = dx8 + (m * G + g) * 8; \
                    acc[m][r] = _mm256_fmadd_ps(_mm256_mul_ps(D0, _mm256_loadu_ps(e)), _mm256_cvtepi32_ps(i0), \
                                                acc[m][r]); \
                    acc[m][r] = _mm256_fmadd_ps(_mm256_mul_ps(D1, _mm256_loadu_ps(e + 8)), _mm256_cvtepi32_ps(i1), \
                                                acc[m][r]); \
                    macc[m][r] += Mn[4 * c] * dxs[m * G + g] + Mn[4 * c + 2] * dxs[m * G + g + 1]; \
                } \
            } \
        } \
    } \
    for (int m = 0; m < M; m++) \
        for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, hsum8(acc[m][r]) - macc[m][r]); \
}
IBLOCK(iblock_avx2, AVX2, DOT_AVX2, q5_unsigned_avx2)
IBLOCK(iblock_vnni, VNNI, DOT_VNNI, q5_unsigned_vnni)
#endif

/* Rows [n0, n1) as R far-apart streams (SPREAD, gemv_q.c; its job is named j) against M rows of x from m0: M x R
   accumulators, at most 8 (one row of x keeps 4 streams, as this path always had). */
#define IRANGE_M(BLOCK, QT) do { \
    switch (M) { \
    case 1: SPREAD(BLOCK, 1, 4, QT); break; \
    case 2: SPREAD(BLOCK, 2, 4, QT); break; \
    case 3: SPREAD(BLOCK, 3, 2, QT); break; \
    case 4: SPREAD(BLOCK, 4, 2, QT); break; \
    case 5: SPREAD(BLOCK, 5, 1, QT); break; \
    case 6: SPREAD(BLOCK, 6, 1, QT); break; \
    case 7: SPREAD(BLOCK, 7, 1, QT); break; \
    default: SPREAD(BLOCK, 8, 1, QT); break; \
    } \
} while (0)
/* Rows [n0, n1) against every row of x, IM rows of x per pass over them: the chunk's weights come from memory
   once, then from L2 (x's int8 rows, IM * K * 2 bytes with corr, stay in L2 too); the type a constant in each copy. */
#define IB(BLOCK, QT) \
    for (int64_t m0 = 0; m0 < j->j->M; m0 += IM) { \
        const int M = (int)(j->j->M - m0 < IM ? j->j->M - m0 : IM); \
        IRANGE_M(BLOCK, QT); \
    }
#define IRANGE(NAME, BLOCK, ATTR) \
static ATTR void NAME(const IJob *j, int64_t n0, int64_t n1, const int qt) { \
    if (qt == QT_Q4_0) { IB(BLOCK, QT_Q4_0); } else if (qt == QT_Q5_0) { IB(BLOCK, QT_Q5_0); } \
    else { IB(BLOCK, QT_Q4_K); } \
}
#ifdef QG_X86
IRANGE(irange_avx2, iblock_avx2, AVX2)
IRANGE(irange_vnni, iblock_vnni, VNNI)
#endif

static void irange8(const IJob *ij, int64_t n0, int64_t n1, const int qt, const int isa);  /* gemv_q_i8k.c */
static void irange(const IJob *ij, int64_t n0, int64_t n1, const int qt, const int isa) {
    if (qt == QT_Q8_0 || qt == QT_Q6_K) { irange8(ij, n0, n1, qt, isa); return; }
#ifdef QG_X86
    if (isa == ISA_AVX512_VNNI) { irange_vnni(ij, n0, n1, qt); return; }
    if (isa >= ISA_AVX2) { irange_avx2(ij, n0, n1, qt); return; }
#endif
    (void)isa;
    for (int64_t m0 = 0; m0 < ij->j->M; m0 += IM) {
        const int M = (int)(ij->j->M - m0 < IM ? ij->j->M - m0 : IM);
        for (int64_t n = n0; n < n1; n++) iblock_c(ij, m0, M, n, qt);
    }
}

/* 1 when this CPU has AVX-512 VNNI (with VL) as well: the int8 path's best kernel. */
int qgemv_vnni(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    return qgemv_isa() == ISA_AVX512 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* qgemv() for activations = int8: 0, -2 for a type this path does not take, -3 when out of memory, -4 for an
   interleaved copy (w16, gemv_q_x16.c) this CPU or type cannot run, or groups this CPU or type cannot run.
   groups: the GGUF layout (Q8_0, Q6_K) decoded 16 rows at a time into the copies' AVX2 prefill kernel
   (gemv_q_x16t.c; a prefill where the weight keeps no copy: the copy's speed and its results, bit for bit). */
#define X16 16  /* rows per group of an interleaved copy: gemv_q_x16.c */
static inline int x16_record(const int qt);
static inline int x16_type(const int qt);
static void x16_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt, const int isa);
#ifdef QG_X86
static int x16t_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt);  /* gemv_q_x16t.c */
#endif
static int qgemv_i8(const QJob *job, int qt, int nthreads, int isa, const uint8_t *w16, const int groups) {
    if (qt != QT_Q4_0 && qt != QT_Q5_0 && qt != QT_Q4_K && qt != QT_Q8_0 && qt != QT_Q6_K) return -2;
    if (isa == ISA_AVX512 && !qgemv_vnni()) isa = ISA_AVX2;
    else if (isa == ISA_AVX512) isa = ISA_AVX512_VNNI;
    if (w16 && (!x16_type(qt) || isa < ISA_AVX2)) return -4;
    if (groups && (w16 || (qt != QT_Q8_0 && qt != QT_Q6_K) || isa < ISA_AVX2)) return -4;
    const int64_t M = job->M, K = job->K, G = K / QK;
    int8_t *qx = malloc((size_t)(M * K));
    float *dx = malloc((size_t)(10 * M * G) * sizeof(float));  /* dx, dxs, dx8 */
    int32_t *corr = malloc((size_t)(M * G * 18) * sizeof(int32_t));  /* corr, xsum, xsum16, corr16 (int16) */
    if (!qx || !dx || !corr) { free(qx); free(dx); free(corr); return -3; }
    float *dx8 = dx + 2 * M * G;
    int32_t *xsum = corr + M * G * 8, *xsum16 = xsum + M * G;
    int16_t *corr16 = (int16_t *)(xsum16 + M * G);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && M > 1)
#endif
    for (int64_t m = 0; m < M; m++)
        quantize_x(job->x + m * K, K, qx + m * K, dx + m * G, dx + M * G + m * G, corr + m * G * 8, dx8 + m * G * 8,
                   xsum + m * G, xsum16 + m * G, corr16 + m * G * 16);
    const IJob ij = {job, qx, dx, dx + M * G, corr, dx8, xsum, xsum16, corr16};
    /* chunks of rows, or of 16-row groups for w16 and groups (~256 KiB of weights, at least 4 a thread) */
    const int64_t units = w16 || groups ? (job->N + X16 - 1) / X16 : job->N;
    const int64_t unit_bytes = w16 ? job->nb * x16_record(qt) : groups ? X16 * job->row_bytes : job->row_bytes;
    int64_t rows = chunk_rows(job->N, job->row_bytes, nthreads);
    if (w16 || groups) {
        const int64_t fair = (units + 4 * (int64_t)nthreads - 1) / (4 * (int64_t)nthreads);
        rows = QG_CHUNK_BYTES / unit_bytes < fair ? QG_CHUNK_BYTES / unit_bytes : fair;
        if (rows < 1) rows = 1;
    }
    const int64_t chunks = (units + rows - 1) / rows;
    if (nthreads > chunks) nthreads = (int)chunks;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        if (w16) {
            x16_range(&ij, w16, c * rows, chunk_end(c, rows, units), qt, isa);
        } else if (groups) {
#ifdef QG_X86
            if (x16t_range(&ij, NULL, c * rows, chunk_end(c, rows, units), qt) != 0) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                failed = 1;
            }
#endif
        } else {
            irange(&ij, c * rows, chunk_end(c, rows, units), qt, isa);
        }
    }
    free(qx); free(dx); free(corr);
    return failed ? -3 : 0;
}
