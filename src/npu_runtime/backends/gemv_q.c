/* Weight-only quantized decode GEMV: y[M,N] = x[M,K] . dequant(w)[N,K]^T (+ bias[N]), x/bias/y fp32, w GGUF blocks.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (load_q: the same compiler, flags and
   cache as gemv.c) and called through ctypes by cpu_qgemv.py, whose docstring explains the design. The
   Python side checks every pointer and size before a call: this code trusts them. Keep in step with
   cpu_qgemv.py: the type codes (GGML's ids, QTYPES) and qgemv_packed's argument block (_ARGS).

   Block layouts (ggml-common.h; gguf-py's quants.py is the tests' reference), K / 32 blocks a row, little-endian:
     Q8_0 (type 8): 34 bytes = fp16 d, int8 q[32];          value j = d * q[j]
     Q4_0 (type 2): 18 bytes = fp16 d, uint8 qs[16];        value j = d * ((qs[j] & 15) - 8),
                                                            value j + 16 = d * ((qs[j] >> 4) - 8), j < 16
     Q5_0 (type 6): 22 bytes, 5-bit codes - 16: gemv_q5.c (appended) has their layout, these kernels their sums
   and k-quants, K / 256 super-blocks per row (sub-blocks of 32 / 16 weights with their own scales):
     Q4_K (type 12): 144 bytes = fp16 d, fp16 dmin, 12 bytes of 8 six-bit scales sc and mins m, uint8 qs[128];
                     value 64c+i = (d*sc[2c]) * (qs[32c+i] & 15) - dmin*m[2c], 64c+32+i: high nibble, sc[2c+1], m[2c+1]
     Q6_K (type 14): 210 bytes = uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d; value e =
                     (d*scales[e/16]) * (6-bit code - 32), the code's low 4 bits in ql, high 2 in qh (kq_codes_c)
   The blocks are read as they lie (W is never widened in memory). x stays fp32: per block and row of x the codes
   (small integers, exact in fp32) are multiplied with x and summed in fp32 lanes, then that sum is scaled by d and
   added to the row's fp32 accumulator (one FMA): d * q is exact in fp32 (11 x 8 bits), so the only roundings are
   those of an fp32 dot product, as with a float weight. The k-quants' weights are made as ggml's dequantize makes
   them: D = d*sc and M = dmin*m are exact (11 x 6 or 11 x 8 bits), D*q too (<= 23 bits), so value = D*q - M has one
   rounding (Q4_K's subtraction) whether or not it is fused; they are then dotted with x in fp32 lanes, again an fp32
   dot product of the exactly dequantized weights. Appended by the loader: gemv_q5.c (Q5_0), gemv_q_i8.c and
   gemv_q_i8k.c (the x-quantized-to-int8 path), gemv_q_deq.c (rows of W into fp32: a prefill's tiles). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define QG_X86 1
#endif

enum { QT_Q4_0 = 2, QT_Q5_0 = 6, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q6_K = 14 };
enum { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_VNNI = 3 };  /* 3: gemv_q_i8.c only */
#define QK 32
#define QKK 256

typedef struct {
    int64_t M, N, K, nb, row_bytes;  /* nb = K / 32 blocks of (row_bytes / nb) bytes per row */
    const float *x;                  /* [M, K] */
    const uint8_t *w;                /* [N, row_bytes] */
    const float *bias;               /* [N] or NULL */
    float *y;                        /* [M, N] */
} QJob;

static inline int block_bytes(const int qt) {
    return qt == QT_Q8_0 ? 34 : qt == QT_Q4_0 ? 18 : qt == QT_Q5_0 ? 22 : qt == QT_Q4_K ? 144 : 210;
}
static inline int is_kquant(const int qt) { return qt == QT_Q4_K || qt == QT_Q6_K; }
static inline int block_elems(const int qt) { return is_kquant(qt) ? QKK : QK; }

/* f16_to_f32: half.c, before this file */
static inline uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline void store(const QJob *j, int64_t m, int64_t n, float v) {
    if (j->bias) v += j->bias[n];
    j->y[m * j->N + n] = v;
}

/* ------------------------------------------------------------------------------------------ portable C */

/* M rows of x times R rows of w (n0 + r * stride): per block the codes as floats, 8 lanes of 4 products,
   scaled by d into 8 lane accumulators per (m, r): gcc vectorizes the lanes without -ffast-math. */
#define GL 8
static inline void q5_codes_c(const uint8_t *blk, int8_t c[QK]);  /* gemv_q5.c */
static inline __attribute__((always_inline))
void qblock_c(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    const int bs = block_bytes(qt);
    float acc[8][4][GL];
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) for (int l = 0; l < GL; l++) acc[m][r][l] = 0.0f;
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * bs;
            const float d = f16_to_f32(load_u16(blk));
            int8_t c[QK];  /* the codes as int8 first: gcc vectorizes the two plain loops, not one mixed */
            float q[QK];
            if (qt == QT_Q8_0) memcpy(c, blk + 2, QK);
            else if (qt == QT_Q5_0) q5_codes_c(blk, c);
            else for (int i = 0; i < QK / 2; i++) {
                c[i] = (int8_t)((blk[2 + i] & 15) - 8);
                c[i + QK / 2] = (int8_t)((blk[2 + i] >> 4) - 8);
            }
            for (int i = 0; i < QK; i++) q[i] = (float)c[i];
            for (int m = 0; m < M; m++) {
                const float *xr = j->x + (m0 + m) * j->K + b * QK;
                float s[GL];
                for (int l = 0; l < GL; l++) s[l] = q[l] * xr[l];
                for (int t = GL; t < QK; t += GL) for (int l = 0; l < GL; l++) s[l] += q[t + l] * xr[t + l];
                for (int l = 0; l < GL; l++) acc[m][r][l] += d * s[l];
            }
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) {
        float s = 0.0f;
        for (int l = 0; l < GL; l++) s += acc[m][r][l];
        store(j, m0 + m, n0 + r * stride, s);
    }
}

/* ---------------------------------------------------------------------------------------------- AVX2 */
#ifdef QG_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
/* Prefetch 2 KiB ahead in each stream, as gemv.c does (the hardware prefetcher stops at each 4 KiB page). */
#define QG_AHEAD 2048

static inline AVX2 void q5_codes_avx2(const uint8_t *blk, __m128i *lo, __m128i *hi);  /* gemv_q5.c */
/* The 32 codes of a block as int8: elements 0..15 in lo, 16..31 in hi (Q4_0: nibble - 8, in -8..7). */
static inline __attribute__((always_inline)) AVX2
void codes_i8(const uint8_t *blk, const int qt, __m128i *lo, __m128i *hi) {
    if (qt == QT_Q5_0) q5_codes_avx2(blk, lo, hi); else if (qt == QT_Q8_0) {
        *lo = _mm_loadu_si128((const __m128i *)(blk + 2));
        *hi = _mm_loadu_si128((const __m128i *)(blk + 18));
    } else {
        const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2)), low4 = _mm_set1_epi8(15);
        *lo = _mm_sub_epi8(_mm_and_si128(v, low4), _mm_set1_epi8(8));
        *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_set1_epi8(8));
    }
}
static inline __attribute__((always_inline)) AVX2 float scale_of(const uint8_t *blk) {
    return _cvtsh_ss(load_u16(blk));
}
static inline __attribute__((always_inline)) AVX2 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) AVX2
void qblock_avx2(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    const int bs = block_bytes(qt);
    const uint8_t *row[8];
    __m256 acc[8][8];
    for (int r = 0; r < R; r++) row[r] = j->w + (n0 + r * stride) * j->row_bytes;
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = row[r] + b * bs;
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0);
            __m128i lo, hi;
            codes_i8(blk, qt, &lo, &hi);
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
            const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
            const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
            const __m256 d = _mm256_set1_ps(scale_of(blk));
            for (int m = 0; m < M; m++) {
                const float *xr = j->x + (m0 + m) * j->K + b * QK;
                __m256 s = _mm256_mul_ps(q0, _mm256_loadu_ps(xr));
                s = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xr + 8), s);
                s = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xr + 16), s);
                s = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xr + 24), s);
                acc[m][r] = _mm256_fmadd_ps(d, s, acc[m][r]);
            }
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, hsum8(acc[m][r]));
}

/* ------------------------------------------------------------------------------------------- AVX-512 */
static inline __attribute__((always_inline)) AVX512
void qblock_avx512(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    const int bs = block_bytes(qt);
    const uint8_t *row[8];
    __m512 acc[8][8];
    for (int r = 0; r < R; r++) row[r] = j->w + (n0 + r * stride) * j->row_bytes;
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = row[r] + b * bs;
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0);
            __m128i lo, hi;
            codes_i8(blk, qt, &lo, &hi);
            const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
            const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
            const __m512 d = _mm512_set1_ps(scale_of(blk));
            for (int m = 0; m < M; m++) {
                const float *xr = j->x + (m0 + m) * j->K + b * QK;
                __m512 s = _mm512_mul_ps(q0, _mm512_loadu_ps(xr));
                s = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xr + 16), s);
                acc[m][r] = _mm512_fmadd_ps(d, s, acc[m][r]);
            }
        }
    }
    for (int m = 0; m < M; m++)
        for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, _mm512_reduce_add_ps(acc[m][r]));
}
#endif

/* ------------------------------------------------------------------------------------------- k-quants */

/* Per 16 weights of a super-block: D and M of value = D*q - M (Q6_K: M = 0), as ggml's dequantize rounds
   them (both exact products, see the top). Q4_K's 6-bit scales/mins: ggml's get_scale_min_k4. */
static inline void kq_scales(const uint8_t *blk, const int qt, float D[16], float Mn[16]) {
    if (qt == QT_Q4_K) {
        const float d = f16_to_f32(load_u16(blk)), dmin = f16_to_f32(load_u16(blk + 2));
        const uint8_t *s = blk + 4;
        for (int i = 0; i < 8; i++) {
            const int sc = i < 4 ? s[i] & 63 : (s[i + 4] & 15) | ((s[i - 4] >> 6) << 4);
            const int m = i < 4 ? s[i + 4] & 63 : (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
            D[2 * i] = D[2 * i + 1] = d * (float)sc;
            Mn[2 * i] = Mn[2 * i + 1] = dmin * (float)m;
        }
    } else {
        const float d = f16_to_f32(load_u16(blk + 208));
        for (int i = 0; i < 16; i++) { D[i] = d * (float)(int8_t)blk[192 + i]; Mn[i] = 0.0f; }
    }
}

/* The 256 codes of a super-block in element order: Q4_K's nibbles (0..15), Q6_K's 6-bit codes - 32. */
static inline void kq_codes_c(const uint8_t *blk, const int qt, int8_t q[QKK]) {
    if (qt == QT_Q4_K) {
        for (int c = 0; c < 4; c++) for (int i = 0; i < 32; i++) {
            q[64 * c + i] = (int8_t)(blk[16 + 32 * c + i] & 15);
            q[64 * c + 32 + i] = (int8_t)(blk[16 + 32 * c + i] >> 4);
        }
        return;
    }
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int h = 0; h < 2; h++) for (int i = 0; i < 32; i++) {
        const int H = qh[32 * h + i], a = ql[64 * h + i], b = ql[64 * h + 32 + i];
        q[128 * h + i] = (int8_t)(((a & 15) | (H & 3) << 4) - 32);
        q[128 * h + 32 + i] = (int8_t)(((b & 15) | ((H >> 2) & 3) << 4) - 32);
        q[128 * h + 64 + i] = (int8_t)(((a >> 4) | ((H >> 4) & 3) << 4) - 32);
        q[128 * h + 96 + i] = (int8_t)(((b >> 4) | ((H >> 6) & 3) << 4) - 32);
    }
}

/* M rows of x times R rows of w: per super-block its 256 weights made exactly (kq_weights), then dotted with
   each row of x in GL lanes. */
static inline __attribute__((always_inline))
void kq_weights_c(const uint8_t *blk, const int qt, float w[QKK]) {
    int8_t q[QKK];
    float D[16], Mn[16];
    kq_codes_c(blk, qt, q);
    kq_scales(blk, qt, D, Mn);
    for (int g = 0; g < 16; g++) for (int i = 0; i < 16; i++) w[16 * g + i] = D[g] * (float)q[16 * g + i] - Mn[g];
}

static inline __attribute__((always_inline))
void kblock_c(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    float acc[8][4][GL];
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) for (int l = 0; l < GL; l++) acc[m][r][l] = 0.0f;
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            float w[QKK];
            kq_weights_c(j->w + (n0 + r * stride) * j->row_bytes + b * block_bytes(qt), qt, w);
            for (int m = 0; m < M; m++) {
                const float *xr = j->x + (m0 + m) * j->K + b * QKK;
                for (int t = 0; t < QKK; t += GL) for (int l = 0; l < GL; l++) acc[m][r][l] += w[t + l] * xr[t + l];
            }
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) {
        float s = 0.0f;
        for (int l = 0; l < GL; l++) s += acc[m][r][l];
        store(j, m0 + m, n0 + r * stride, s);
    }
}

#ifdef QG_X86
static inline AVX2 void q6_unsigned_avx2(const uint8_t *blk, int h, __m256i u[4]);  /* gemv_q_i8k.c */
/* kq_codes_c with 32 bytes at a time (epi16 shifts: the bits they pull in from the neighbour byte are masked). */
static inline __attribute__((always_inline)) AVX2 void kq_codes_avx2(const uint8_t *blk, const int qt, int8_t *q) {
    const __m256i m4 = _mm256_set1_epi8(15), off = _mm256_set1_epi8(32);
    if (qt == QT_Q4_K) {
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c));
            _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_and_si256(v, m4));
            _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
        return;
    }
    for (int h = 0; h < 2; h++) {
        __m256i u[4];
        q6_unsigned_avx2(blk, h, u);
        for (int t = 0; t < 4; t++) _mm256_storeu_si256((__m256i *)(q + 128 * h + 32 * t), _mm256_sub_epi8(u[t], off));
    }
}

/* A super-block's 256 weights into w (any alignment) as kq_weights_c makes them (fmadd(D, q, -M) rounds once, as
   D*q - M does: D*q is exact); the GEMV and the rows' dequantization (gemv_q_deq.c) share them. */
static inline __attribute__((always_inline)) AVX2 void kq_weights_avx2(const uint8_t *blk, const int qt, float *w) {
    int8_t q[QKK]; float D[16], Mn[16];
    kq_codes_avx2(blk, qt, q); kq_scales(blk, qt, D, Mn);
    for (int g = 0; g < 32; g++) {
        const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * g))));
        _mm256_storeu_ps(w + 8 * g, _mm256_fmadd_ps(_mm256_set1_ps(D[g / 2]), c, _mm256_set1_ps(-Mn[g / 2])));
    }
}
static inline __attribute__((always_inline)) AVX512 void kq_weights_avx512(const uint8_t *blk, const int qt, float *w) {
    int8_t q[QKK]; float D[16], Mn[16];
    kq_codes_avx2(blk, qt, q); kq_scales(blk, qt, D, Mn);
    for (int g = 0; g < 16; g++) {
        const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * g))));
        _mm512_storeu_ps(w + 16 * g, _mm512_fmadd_ps(_mm512_set1_ps(D[g]), c, _mm512_set1_ps(-Mn[g])));
    }
}

static inline __attribute__((always_inline)) AVX2 __m256 dot8x4(const float *w, const float *x) {
    __m256 s[4];
    for (int t = 0; t < 4; t++) s[t] = _mm256_mul_ps(_mm256_load_ps(w + 8 * t), _mm256_loadu_ps(x + 8 * t));
    for (int i = 32; i < QKK; i += 32)
        for (int t = 0; t < 4; t++) s[t] = _mm256_fmadd_ps(_mm256_load_ps(w + i + 8 * t), _mm256_loadu_ps(x + i + 8 * t), s[t]);
    return _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
}

static inline __attribute__((always_inline)) AVX2
void kblock_avx2(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    __m256 acc[8][8];
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * block_bytes(qt);
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + QG_AHEAD + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + QG_AHEAD + 128, _MM_HINT_T0);
            float w[QKK] __attribute__((aligned(64)));
            kq_weights_avx2(blk, qt, w);
            for (int m = 0; m < M; m++)
                acc[m][r] = _mm256_add_ps(acc[m][r], dot8x4(w, j->x + (m0 + m) * j->K + b * QKK));
        }
    }
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, hsum8(acc[m][r]));
}

static inline __attribute__((always_inline)) AVX512 __m512 dot16x4(const float *w, const float *x) {
    __m512 s[4];
    for (int t = 0; t < 4; t++) s[t] = _mm512_mul_ps(_mm512_load_ps(w + 16 * t), _mm512_loadu_ps(x + 16 * t));
    for (int i = 64; i < QKK; i += 64)
        for (int t = 0; t < 4; t++)
            s[t] = _mm512_fmadd_ps(_mm512_load_ps(w + i + 16 * t), _mm512_loadu_ps(x + i + 16 * t), s[t]);
    return _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
}

static inline __attribute__((always_inline)) AVX512
void kblock_avx512(const QJob *j, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) {
    __m512 acc[8][8];
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < j->nb; b++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * block_bytes(qt);
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + QG_AHEAD + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + QG_AHEAD + 128, _MM_HINT_T0);
            float w[QKK] __attribute__((aligned(64)));
            kq_weights_avx512(blk, qt, w);
            for (int m = 0; m < M; m++)
                acc[m][r] = _mm512_add_ps(acc[m][r], dot16x4(w, j->x + (m0 + m) * j->K + b * QKK));
        }
    }
    for (int m = 0; m < M; m++)
        for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, _mm512_reduce_add_ps(acc[m][r]));
}
#endif

/* ------------------------------------------------------------------------------------------- ranges */

/* Rows [n0, n1) as R streams far apart (n0 + i + r * S), then the rows left one by one: a core reads
   memory fastest with several long sequential streams in flight (see gemv.c's SPREAD). */
#define SPREAD(BLOCK, M, R, QT) do { \
    const int64_t S = (n1 - n0) / (R); \
    int64_t n = n0 + (R) * S; \
    for (int64_t i = 0; i < S; i++) BLOCK(j, m0, M, n0 + i, S, R, QT); \
    for (; n < n1; n++) BLOCK(j, m0, M, n, 1, 1, QT); \
} while (0)

/* Up to 8 rows of x at once, so that a weight is read once for M <= 8: M x R accumulators <= 8. */
#define RANGE_M(NAME, BLOCK, ATTR, QA, QB) \
static ATTR void NAME##_qt(const QJob *j, int64_t m0, int M, int64_t n0, int64_t n1, const int qt) { \
    switch (M) { \
    case 1: SPREAD(BLOCK, 1, 8, qt); break; \
    case 2: SPREAD(BLOCK, 2, 4, qt); break; \
    case 3: SPREAD(BLOCK, 3, 2, qt); break; \
    case 4: SPREAD(BLOCK, 4, 2, qt); break; \
    case 5: SPREAD(BLOCK, 5, 1, qt); break; \
    case 6: SPREAD(BLOCK, 6, 1, qt); break; \
    case 7: SPREAD(BLOCK, 7, 1, qt); break; \
    default: SPREAD(BLOCK, 8, 1, qt); break; \
    } \
} \
static ATTR void NAME(const QJob *j, int64_t m0, int M, int64_t n0, int64_t n1, int qt) { \
    if (qt == QA) NAME##_qt(j, m0, M, n0, n1, QA); \
    else NAME##_qt(j, m0, M, n0, n1, QB); \
}

/* the portable kernel keeps 4 streams for one row of x (its accumulators live in memory, not registers) */
#define RANGE_C(NAME, BLOCK, QA, QB) \
static void NAME(const QJob *j, int64_t m0, int M, int64_t n0, int64_t n1, int qt) { \
    if (M == 1 && qt == QA) SPREAD(BLOCK, 1, 4, QA); \
    else if (M == 1) SPREAD(BLOCK, 1, 4, QB); \
    else if (qt == QA) for (int64_t n = n0; n < n1; n++) BLOCK(j, m0, M, n, 1, 1, QA); \
    else for (int64_t n = n0; n < n1; n++) BLOCK(j, m0, M, n, 1, 1, QB); \
}
RANGE_C(range_c, qblock_c, QT_Q8_0, QT_Q4_0)
RANGE_C(range_k_c, kblock_c, QT_Q4_K, QT_Q6_K)
#ifdef QG_X86
RANGE_M(range_avx2, qblock_avx2, AVX2, QT_Q8_0, QT_Q4_0)
RANGE_M(range_avx512, qblock_avx512, AVX512, QT_Q8_0, QT_Q4_0)
RANGE_M(range_k_avx2, kblock_avx2, AVX2, QT_Q4_K, QT_Q6_K)
RANGE_M(range_k_avx512, kblock_avx512, AVX512, QT_Q4_K, QT_Q6_K)
#endif

static void range_q5(const QJob *j, int64_t m0, int M, int64_t n0, int64_t n1, int isa);  /* gemv_q5.c */
/* Rows [n0, n1) for every row of x, 8 at a time: a chunk's weights (~256 KiB) come from memory once, then L2. */
static void run_rows(const QJob *j, int64_t n0, int64_t n1, int qt, int isa) {
    for (int64_t m0 = 0; m0 < j->M; m0 += 8) {
        const int M = (int)(j->M - m0 < 8 ? j->M - m0 : 8);
        const int k = is_kquant(qt);
        if (qt == QT_Q5_0) { range_q5(j, m0, M, n0, n1, isa); continue; }
#ifdef QG_X86
        if (isa == ISA_AVX512) { (k ? range_k_avx512 : range_avx512)(j, m0, M, n0, n1, qt); continue; }
        if (isa == ISA_AVX2) { (k ? range_k_avx2 : range_avx2)(j, m0, M, n0, n1, qt); continue; }
#endif
        (k ? range_k_c : range_c)(j, m0, M, n0, n1, qt);
    }
}

/* 2: AVX-512 F/BW (+ AVX2/FMA/F16C), 1: AVX2/FMA/F16C, 0: portable C; libgcc checks the OS saves them (xgetbv). */
int qgemv_isa(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return ISA_AVX512;
    return avx2 ? ISA_AVX2 : ISA_C;
#else
    return ISA_C;
#endif
}

#ifdef _OPENMP
int qgemv_openmp(void) { return 1; }
#else
int qgemv_openmp(void) { return 0; }
#endif

#ifndef QG_CHUNK_BYTES
#define QG_CHUNK_BYTES 262144
#endif
/* Rows per chunk: ~256 KiB of weights, at least 4 chunks a thread, a multiple of 8 rows (gemv.c's rule). */
static int64_t chunk_rows(int64_t N, int64_t row_bytes, int nthreads) {
    int64_t rows = row_bytes > 0 ? QG_CHUNK_BYTES / row_bytes : N;
    const int64_t fair = (N + 4 * (int64_t)nthreads - 1) / (4 * (int64_t)nthreads);
    if (rows > fair) rows = fair;
    rows = rows / 8 * 8;
    return rows < 8 ? 8 : rows;
}

static inline int64_t chunk_end(int64_t c, int64_t rows, int64_t N) { return (c + 1) * rows < N ? (c + 1) * rows : N; }

static int qgemv_i8(const QJob *job, int qt, int nthreads, int isa, const uint8_t *w16, int groups);  /* gemv_q_i8.c */

/* y = x . dequant(w)^T (+ bias), x fp32 (act 0) or quantized to int8 groups (act 1, gemv_q_i8.c; reading w16, w's
   16-row interleaved copy (gemv_q_x16.c), where given; act 2: w decoded 16 rows at a time into the copies' prefill
   kernel, gemv_q_x16t.c). 0, or -2 for a type this kernel does not know. Chunks go to torch's OpenMP threads one by
   one, as in gemv.c (Python picks how many). */
int qgemv(int64_t M, int64_t N, int64_t K, const float *x, const uint8_t *w, int qt, const float *bias, float *y,
          int nthreads, int isa, int act, const uint8_t *w16) {
    if (qt != QT_Q8_0 && qt != QT_Q4_0 && qt != QT_Q5_0 && !is_kquant(qt)) return -2;
    if (M <= 0 || N <= 0) return 0;
    const int64_t nb = K / block_elems(qt);
    const QJob job = {M, N, K, nb, nb * block_bytes(qt), x, w, bias, y};
    if (nthreads < 1) nthreads = 1;
    if (act == 1 || act == 2) return qgemv_i8(&job, qt, nthreads, isa, w16, act == 2);
    if (act != 0 || w16) return -2;
    const int64_t rows = chunk_rows(N, job.row_bytes, nthreads), chunks = (N + rows - 1) / rows;
    if (nthreads > chunks) nthreads = (int)chunks;
    if (nthreads <= 1) {                                /* no parallel region at all: ~1 us less */
        for (int64_t c = 0; c < chunks; c++) run_rows(&job, c * rows, chunk_end(c, rows, N), qt, isa);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
#endif
    for (int64_t c = 0; c < chunks; c++) run_rows(&job, c * rows, chunk_end(c, rows, N), qt, isa);
    return 0;
}

/* qgemv() with its arguments in one block of 12 int64 (_ARGS in cpu_qgemv.py): one ctypes argument is cheaper. */
int qgemv_packed(const void *block) {
    int64_t a[12];
    memcpy(a, block, sizeof a);                         /* a Python bytes object: no alignment promised */
    return qgemv(a[0], a[1], a[2], (const float *)(intptr_t)a[3], (const uint8_t *)(intptr_t)a[4], (int)a[5],
                 (const float *)(intptr_t)a[6], (float *)(intptr_t)a[7], (int)a[8], (int)a[9], (int)a[10],
                 (const uint8_t *)(intptr_t)a[11]);
}
