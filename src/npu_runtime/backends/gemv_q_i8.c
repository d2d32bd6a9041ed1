/* The x-quantized-to-int8 path of the quantized GEMV (activations="int8" in cpu_qgemv.py): Q4_0, Q5_0 and Q4_K
   here; Q8_0 and Q6_K in gemv_q_i8k.c (appended after this file: the same quantize_x, threads and contract).

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
   made unsigned, 0..31) as twice that. */
#include <stdlib.h>

typedef struct {
    const QJob *j;
    const int8_t *qx;     /* [M, K] */
    const float *dx;      /* [M, K / 32] */
    const float *dxs;     /* [M, K / 32]: dx * sx */
    const int32_t *corr;  /* [M, K / 4]: -8 * the sum of each 4 q (Q4_0) */
} IJob;

/* One row of x to int8 groups (vectorized by gcc: SSE2 at least). Non-finite x give 0 codes, never an
   out-of-range conversion. */
static void quantize_x(const float *x, int64_t K, int8_t *qx, float *dx, float *dxs, int32_t *corr) {
    for (int64_t g = 0; g < K / QK; g++) {
        const float *v = x + g * QK;
        float amax = 0.0f, t[QK];
        for (int i = 0; i < QK; i++) { const float a = v[i] < 0.0f ? -v[i] : v[i]; amax = a > amax ? a : amax; }
        const float d = amax / 127.0f;
        int s = 0;
        for (int i = 0; i < QK; i++) {
            t[i] = d > 0.0f ? v[i] / d : 0.0f;
            if (!(t[i] > -127.5f && t[i] < 127.5f)) t[i] = 0.0f;  /* NaN; |x / dx| is <= 127 (1 + 2^-23) */
            t[i] = (t[i] + 12582912.0f) - 12582912.0f;  /* + 1.5 * 2^23: rounds to an integer, ties to even */
        }
        for (int i = 0; i < QK; i++) { qx[g * QK + i] = (int8_t)t[i]; s += (int)t[i]; }
        for (int l = 0; l < QK / 4; l++) {
            const int8_t *q = qx + g * QK + 4 * l;
            corr[g * 8 + l] = -8 * (q[0] + q[1] + q[2] + q[3]);
        }
        dx[g] = d;
        dxs[g] = d * (float)s;
    }
}

/* Row n of W against row m of x, portable C. */
static void iblock_c(const IJob *ij, int64_t m, int64_t n, const int qt) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const int8_t *qx = ij->qx + m * j->K;
    const float *dx = ij->dx + m * G, *dxs = ij->dxs + m * G;
    const int bs = block_bytes(qt);
    float acc = 0.0f, macc = 0.0f;
    for (int64_t b = 0; b < j->nb; b++) {
        const uint8_t *blk = j->w + n * j->row_bytes + b * bs;
        if (qt == QT_Q5_0) {
            int8_t c[QK];
            int s = 0;
            q5_codes_c(blk, c);
            for (int i = 0; i < QK; i++) s += c[i] * qx[b * QK + i];
            acc += (f16_to_f32(load_u16(blk)) * dx[b]) * (float)s;
            continue;
        }
        if (qt == QT_Q4_0) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += ((blk[2 + i] & 15) - 8) * qx[b * QK + i] + ((blk[2 + i] >> 4) - 8) * qx[b * QK + 16 + i];
            acc += (f16_to_f32(load_u16(blk)) * dx[b]) * (float)s;
            continue;
        }
        float D[16], Mn[16];
        kq_scales(blk, qt, D, Mn);
        for (int c = 0; c < 4; c++) {
            const int64_t g = 8 * b + 2 * c;
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 32; i++) {
                s0 += (blk[16 + 32 * c + i] & 15) * qx[g * QK + i];
                s1 += (blk[16 + 32 * c + i] >> 4) * qx[(g + 1) * QK + i];
            }
            acc += (D[4 * c] * dx[g]) * (float)s0 + (D[4 * c + 2] * dx[g + 1]) * (float)s1;
            macc += Mn[4 * c] * dxs[g] + Mn[4 * c + 2] * dxs[g + 1];
        }
    }
    store(j, m, n, acc - macc);
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

/* R rows of W (n0 + r * stride) against row m of x; Q5U: Q5_0's codes + 16. */
#define IBLOCK(NAME, ATTR, DOT, Q5U) \
static inline __attribute__((always_inline)) ATTR \
void NAME(const IJob *ij, int64_t m, int64_t n0, int64_t stride, const int R, const int qt) { \
    const QJob *j = ij->j; \
    const int64_t G = j->K / QK; \
    const int8_t *qx = ij->qx + m * j->K; \
    const float *dx = ij->dx + m * G, *dxs = ij->dxs + m * G; \
    const int32_t *corr = ij->corr + m * (j->K / 4); \
    const int bs = block_bytes(qt); \
    const __m256i m4 = _mm256_set1_epi8(15), shift = _mm256_set_epi64x(4, 4, 0, 0); \
    __m256 acc[4]; \
    float macc[4]; \
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); macc[r] = 0.0f; } \
    for (int64_t b = 0; b < j->nb; b++) { \
        for (int r = 0; r < R; r++) { \
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * bs; \
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0); \
            if (qt == QT_Q5_0) { /* the codes + 16 (0..31, unsigned); -16 * the sum of each 4 q = 2 * corr */ \
                const __m256i u = Q5U(blk); \
                const __m256i i = DOT(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(corr + 8 * b)), 1), u, \
                                      _mm256_loadu_si256((const __m256i *)(qx + QK * b))); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(blk)) * dx[b]), \
                                         _mm256_cvtepi32_ps(i), acc[r]); \
                continue; \
            } \
            if (qt == QT_Q4_0) { /* the 16 bytes twice, the upper copy shifted: nibbles 0..15, then 16..31 */ \
                const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2))); \
                const __m256i u = _mm256_and_si256(_mm256_srlv_epi64(v, shift), m4); \
                const __m256i i = DOT(_mm256_loadu_si256((const __m256i *)(corr + 8 * b)), u, \
                                      _mm256_loadu_si256((const __m256i *)(qx + QK * b))); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(blk)) * dx[b]), \
                                         _mm256_cvtepi32_ps(i), acc[r]); \
                continue; \
            } \
            _mm_prefetch((const char *)blk + QG_AHEAD + 64, _MM_HINT_T0); \
            _mm_prefetch((const char *)blk + QG_AHEAD + 128, _MM_HINT_T0); \
            float D[16], Mn[16]; \
            kq_scales(blk, qt, D, Mn); \
            for (int c = 0; c < 4; c++) { \
                const int64_t g = 8 * b + 2 * c; \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c)); \
                const __m256i i0 = DOT(_mm256_setzero_si256(), _mm256_and_si256(v, m4), \
                                       _mm256_loadu_si256((const __m256i *)(qx + QK * g))); \
                const __m256i i1 = DOT(_mm256_setzero_si256(), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), \
                                       _mm256_loadu_si256((const __m256i *)(qx + QK * (g + 1)))); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(D[4 * c] * dx[g]), _mm256_cvtepi32_ps(i0), acc[r]); \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(D[4 * c + 2] * dx[g + 1]), _mm256_cvtepi32_ps(i1), acc[r]); \
                macc[r] += Mn[4 * c] * dxs[g] + Mn[4 * c + 2] * dxs[g + 1]; \
            } \
        } \
    } \
    for (int r = 0; r < R; r++) store(j, m, n0 + r * stride, hsum8(acc[r]) - macc[r]); \
}
IBLOCK(iblock_avx2, AVX2, DOT_AVX2, q5_unsigned_avx2)
IBLOCK(iblock_vnni, VNNI, DOT_VNNI, q5_unsigned_vnni)
#endif

/* Rows [n0, n1) against every row of x: 4 far-apart streams per row of x, the type a constant in each copy. */
#define IB(BLOCK, QT) \
    for (int64_t m = 0; m < ij->j->M; m++) { \
        const int64_t S = (n1 - n0) / 4; \
        for (int64_t i = 0; i < S; i++) BLOCK(ij, m, n0 + i, S, 4, QT); \
        for (int64_t n = n0 + 4 * S; n < n1; n++) BLOCK(ij, m, n, 1, 1, QT); \
    }
#define IRANGE(NAME, BLOCK, ATTR) \
static ATTR void NAME(const IJob *ij, int64_t n0, int64_t n1, const int qt) { \
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
    for (int64_t m = 0; m < ij->j->M; m++) for (int64_t n = n0; n < n1; n++) iblock_c(ij, m, n, qt);
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

/* qgemv() for activations = int8: 0, -2 for a type this path does not take, -3 when out of memory. */
static int qgemv_i8(const QJob *job, int qt, int nthreads, int isa) {
    if (qt != QT_Q4_0 && qt != QT_Q5_0 && qt != QT_Q4_K && qt != QT_Q8_0 && qt != QT_Q6_K) return -2;
    const int64_t M = job->M, K = job->K, G = K / QK;
    int8_t *qx = malloc((size_t)(M * K));
    float *dx = malloc((size_t)(2 * M * G) * sizeof(float));
    int32_t *corr = malloc((size_t)(M * G * 8) * sizeof(int32_t));
    if (!qx || !dx || !corr) { free(qx); free(dx); free(corr); return -3; }
    for (int64_t m = 0; m < M; m++)
        quantize_x(job->x + m * K, K, qx + m * K, dx + m * G, dx + M * G + m * G, corr + m * G * 8);
    if (isa == ISA_AVX512 && !qgemv_vnni()) isa = ISA_AVX2;
    else if (isa == ISA_AVX512) isa = ISA_AVX512_VNNI;
    const IJob ij = {job, qx, dx, dx + M * G, corr};
    const int64_t rows = chunk_rows(job->N, job->row_bytes, nthreads), chunks = (job->N + rows - 1) / rows;
    if (nthreads > chunks) nthreads = (int)chunks;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
#endif
    for (int64_t c = 0; c < chunks; c++) irange(&ij, c * rows, chunk_end(c, rows, job->N), qt, isa);
    free(qx); free(dx); free(corr);
    return 0;
}
