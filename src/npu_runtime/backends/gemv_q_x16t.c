/* The int8 path on interleaved copies (gemv_q_x16.c) against many rows of x on AVX2, as a prefill has: each group of
   16 rows of W is decoded once into a scratch (its codes as bytes, in the records' [step][row][4 bytes] order, 32
   elements a group; each group's fp32 scales), then multiplied with 4 rows of x at a time (Q6_K 2: X16T_MR_OF).

   Why: the AVX2 kernel (x16a_group) takes one row of x at a time, AVX2's 16 registers holding no more, so it decodes
   every record again for each row: 3-7 instructions beside each vpmaddubsw. Decoded once per call, a step is one
   load, then per row of x a broadcast, a vpmaddubsw and an add. Each lane's integer sum and fp32 steps are
   x16a_group's (the same operations, in the same order, for each pair of a row of x and a row of W): its results bit
   for bit, so which of the two runs a call changes only the time (the tests compare bits).

   The same kernel reads a weight kept in the GGUF layout (Q8_0 and Q6_K, which keep no copy on AVX2: their copy
   decodes 12-20 % slower for one row of x), 16 rows decoded into the scratch per group (x16t_decode_gguf): a
   prefill gets the copy's speed and its results, bit for bit, without the copy's memory (qgemv_i8's groups path).

   Appended after gemv_q_x16.c by the loader (one translation unit: the record's enum, x16a_bcast, x16a_widen,
   x16a_fifth, x16a_u8_ps, x16a_store; gemv_q_i8k.c's q6_unsigned_avx2); x16_range calls x16t_range from
   X16T_MIN_ROWS rows of x, qgemv_i8 from any for the groups path. */

#ifdef QG_X86
#define X16T_MR_MAX 4  /* rows of x a pass takes at most (X16T_MR_OF: Q6_K's 2, the others' 4) */

/* One group of 16 rows decoded: per 32-element group g of a row, u[g][step t][row][4 bytes] (unsigned codes as the
   records hold them, Q8_0's signed again) and the fp32 scale of each row (s: d, Q4_K's D = d * sc; mn: Q4_K's
   M = dmin * m); Q6_K's int8 sub-block scales as int32 (sa: the group's first 16 elements, sb: its second 16). */
typedef struct {
    uint8_t *u;
    float *s, *mn;
    int32_t *sa, *sb;
} X16T;

/* Block b of a group's record o into t (the groups of 32 it holds: 1, or a super-block's 8). */
static inline __attribute__((always_inline)) AVX2 void x16t_decode(const uint8_t *o, int64_t b, const int qt, X16T *t) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    for (int hf = 0; hf < 2; hf++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * hf)));
        if (!is_kquant(qt)) {
            uint8_t *u = t->u + 512 * b + 32 * hf;
            _mm256_storeu_ps(t->s + 16 * b + 8 * hf, d);
            for (int s = 0; s < 8; s++) {
                __m256i v;
                if (qt == QT_Q8_0) {
                    v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(o + 32 + 64 * s + 32 * hf)),
                                         _mm256_set1_epi8((char)0x80));
                } else {  /* steps 0-3: the low nibbles of the code steps, 4-7 their high ones */
                    const int at = (qt == QT_Q5_0 ? X16_Q5_CODES : 32) + 64 * (s % 4) + 32 * hf;
                    v = _mm256_loadu_si256((const __m256i *)(o + at));
                    v = _mm256_and_si256(s < 4 ? v : _mm256_srli_epi16(v, 4), m4);
                    if (qt == QT_Q5_0) v = _mm256_or_si256(v, x16a_fifth(o + X16_Q5_BITS + 8 * s + 4 * hf));
                }
                _mm256_storeu_si256((__m256i *)(u + 64 * s), v);
            }
            continue;
        }
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + X16_K_DMIN + 16 * hf)));
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const int64_t g = 8 * b + 2 * c + h;
                uint8_t *u = t->u + 512 * g + 32 * hf;
                if (qt == QT_Q4_K) {
                    const int s = 2 * c + h;
                    _mm256_storeu_ps(t->s + 16 * g + 8 * hf,
                                     _mm256_mul_ps(d, x16a_u8_ps(o + X16_K_SC + 16 * s + 8 * hf)));
                    _mm256_storeu_ps(t->mn + 16 * g + 8 * hf,
                                     _mm256_mul_ps(dmin, x16a_u8_ps(o + X16_K_MIN + 16 * s + 8 * hf)));
                } else {
                    const uint8_t *sc = o + X16_Q6_SC + 16 * 2 * (2 * c + h) + 8 * hf;
                    _mm256_storeu_ps(t->s + 16 * g + 8 * hf, d);
                    _mm256_storeu_si256((__m256i *)(t->sa + 16 * g + 8 * hf),
                                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
                    _mm256_storeu_si256((__m256i *)(t->sb + 16 * g + 8 * hf),
                                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16))));
                }
                for (int s = 0; s < 8; s++) {
                    const int at = (qt == QT_Q4_K ? X16_K_CODES : X16_Q6_LOW) + 512 * c + 64 * s + 32 * hf;
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(o + at));
                    __m256i code = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, m4);
                    if (qt == QT_Q6_K) {  /* x16a_q6k's high 2 bits: chunk c's at bits 2c..2c+1, moved to 4..5 */
                        const uint8_t *high = o + X16_Q6_HIGH + 128 * s + 64 * h + 32 * hf;
                        __m256i hb = _mm256_loadu_si256((const __m256i *)high);
                        hb = c < 2 ? _mm256_slli_epi16(hb, 4 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 4);
                        code = _mm256_or_si256(code, _mm256_and_si256(hb, m30));
                    }
                    _mm256_storeu_si256((__m256i *)(u + 64 * s), code);
                }
            }
    }
}

/* 8 rows' 32 codes of a group (v[r]: 8 4-byte pieces, one per step) as the group's 8 steps for those rows (v[s]:
   the rows' pieces of step s, in row order): an 8 x 8 transpose of 4-byte elements. */
static inline __attribute__((always_inline)) AVX2 void x16t_transpose(__m256i v[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 4; i++) {  /* rows 2i, 2i+1: steps 0, 1 | 4, 5 and 2, 3 | 6, 7 */
        a[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)  /* rows 4i..4i+3: steps s | s + 4, s = 0..3 */
        for (int k = 0; k < 2; k++) {
            b[4 * i + 2 * k] = _mm256_unpacklo_epi64(a[4 * i + k], a[4 * i + 2 + k]);
            b[4 * i + 2 * k + 1] = _mm256_unpackhi_epi64(a[4 * i + k], a[4 * i + 2 + k]);
        }
    for (int t = 0; t < 4; t++) {
        v[t] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x20);
        v[t + 4] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x31);
    }
}

/* v (x16t_transpose's input) into half hf of group g's steps in t. */
static inline __attribute__((always_inline)) AVX2 void x16t_put(X16T *t, int64_t g, const int hf, __m256i v[8]) {
    x16t_transpose(v);
    for (int s = 0; s < 8; s++) _mm256_storeu_si256((__m256i *)(t->u + 512 * g + 64 * s + 32 * hf), v[s]);
}

/* Group grp of a weight in the GGUF layout (Q8_0, Q6_K: qgemv_i8's groups path, where no interleaved copy is kept)
   into t as x16t_decode leaves a copy's records: the same codes and scales, and zeros for the rows past the weight's
   last (the copy's zero rows), so x16t_rows gives the copy's results bit for bit. Block b of 8 rows at a time. */
static inline __attribute__((always_inline)) AVX2 void x16t_decode_gguf(const QJob *j, int64_t grp, const int qt,
                                                                          X16T *t) {
    static const uint8_t zero[210];  /* a zero block of either layout: codes, scales, d */
    const int bs = block_bytes(qt);
    for (int64_t b = 0; b < j->nb; b++)
        for (int hf = 0; hf < 2; hf++) {
            const uint8_t *blk[8];
            for (int r = 0; r < 8; r++) {
                const int64_t n = grp * X16 + 8 * hf + r;
                blk[r] = n < j->N ? j->w + n * j->row_bytes + b * bs : zero;
            }
            __m256i v[4][8];
            if (qt == QT_Q8_0) {  /* signed codes, as x16t_decode leaves them */
                for (int r = 0; r < 8; r++) {
                    t->s[16 * b + 8 * hf + r] = _cvtsh_ss(load_u16(blk[r]));
                    v[0][r] = _mm256_loadu_si256((const __m256i *)(blk[r] + 2));
                }
                x16t_put(t, b, hf, v[0]);
                continue;
            }
            for (int h = 0; h < 2; h++) {  /* groups 4h..4h+3 of 32 in element order, unsigned codes 0..63 */
                for (int r = 0; r < 8; r++) {
                    __m256i u[4];
                    q6_unsigned_avx2(blk[r], h, u);
                    for (int k = 0; k < 4; k++) v[k][r] = u[k];
                }
                for (int k = 0; k < 4; k++) {
                    const int64_t g = 8 * b + 4 * h + k;
                    x16t_put(t, g, hf, v[k]);
                    for (int r = 0; r < 8; r++) {
                        t->s[16 * g + 8 * hf + r] = _cvtsh_ss(load_u16(blk[r] + 208));
                        t->sa[16 * g + 8 * hf + r] = (int8_t)blk[r][192 + 2 * (4 * h + k)];
                        t->sb[16 * g + 8 * hf + r] = (int8_t)blk[r][192 + 2 * (4 * h + k) + 1];
                    }
                }
            }
        }
}

/* Steps [s0, s0 + n) of one group's codes u (one half: 32 bytes a step) against MR rows of x (q[r] its 32 codes),
   summed in int16 (n <= the layout's exact count, x16a's: 8 nibbles, 4 Q5_0, 2 Q6_K) and widened to int32. */
static inline __attribute__((always_inline)) AVX2
void x16t_steps(const uint8_t *u, const int8_t *const *q, const int MR, const int s0, const int n, __m256i *i32) {
    __m256i s16[X16T_MR_MAX];
    for (int s = s0; s < s0 + n; s++) {
        const __m256i us = _mm256_loadu_si256((const __m256i *)(u + 64 * s));
        UNROLL for (int r = 0; r < MR; r++) {
            const __m256i p = _mm256_maddubs_epi16(us, x16a_bcast(q[r] + 4 * s));
            s16[r] = s == s0 ? p : _mm256_add_epi16(s16[r], p);
        }
    }
    UNROLL for (int r = 0; r < MR; r++) i32[r] = _mm256_add_epi32(i32[r], x16a_widen(s16[r]));
}

/* Half hf of group grp's decoded codes against rows [m0, m0 + MR) of x: x16a_group's sums and fp32 steps. */
static inline __attribute__((always_inline)) AVX2
void x16t_rows(const IJob *ij, const X16T *t, int64_t grp, int64_t m0, const int MR, const int hf, const int qt) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    __m256 acc[X16T_MR_MAX];
    UNROLL for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *u = t->u + 512 * g + 32 * hf;
        const int8_t *q[X16T_MR_MAX];
        __m256i i32[X16T_MR_MAX];
        UNROLL for (int r = 0; r < MR; r++) {
            const int64_t x = (m0 + r) * G + g;
            q[r] = ij->qx + (m0 + r) * j->K + QK * g;
            i32[r] = qt == QT_Q4_0 ? _mm256_set1_epi32(-8 * ij->xsum[x])
                   : qt == QT_Q5_0 ? _mm256_set1_epi32(-16 * ij->xsum[x])
                   : qt == QT_Q6_K ? _mm256_set1_epi32(-32 * ij->xsum16[x]) : _mm256_setzero_si256();
        }
        if (qt == QT_Q8_0) {  /* one step at a time in int16 (the sign trick's 2 * 128 * 127) */
            for (int s = 0; s < 8; s++) {
                const __m256i c = _mm256_loadu_si256((const __m256i *)(u + 64 * s)), a = _mm256_abs_epi8(c);
                UNROLL for (int r = 0; r < MR; r++)
                    i32[r] = _mm256_add_epi32(i32[r], x16a_widen(_mm256_maddubs_epi16(
                        a, _mm256_sign_epi8(x16a_bcast(q[r] + 4 * s), c))));
            }
        } else if (qt == QT_Q6_K) {  /* sub-block 2g: steps 0-3, times sa; 2g + 1: steps 4-7, times sb */
            const __m256i sa = _mm256_loadu_si256((const __m256i *)(t->sa + 16 * g + 8 * hf));
            const __m256i sb = _mm256_loadu_si256((const __m256i *)(t->sb + 16 * g + 8 * hf));
            __m256i i1[X16T_MR_MAX];
            x16t_steps(u, q, MR, 0, 2, i32);
            x16t_steps(u, q, MR, 2, 2, i32);
            UNROLL for (int r = 0; r < MR; r++) {
                const int64_t x = (m0 + r) * G + g;
                i32[r] = _mm256_mullo_epi32(i32[r], sa);
                i1[r] = _mm256_set1_epi32(-32 * (ij->xsum[x] - ij->xsum16[x]));
            }
            x16t_steps(u, q, MR, 4, 2, i1);
            x16t_steps(u, q, MR, 6, 2, i1);
            UNROLL for (int r = 0; r < MR; r++) i32[r] = _mm256_add_epi32(i32[r], _mm256_mullo_epi32(i1[r], sb));
        } else if (qt == QT_Q5_0) {
            x16t_steps(u, q, MR, 0, 4, i32);
            x16t_steps(u, q, MR, 4, 4, i32);
        } else {
            x16t_steps(u, q, MR, 0, 8, i32);
        }
        const __m256 s = _mm256_loadu_ps(t->s + 16 * g + 8 * hf);
        UNROLL for (int r = 0; r < MR; r++) {
            const int64_t x = (m0 + r) * G + g;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(s, _mm256_set1_ps(ij->dx[x])), _mm256_cvtepi32_ps(i32[r]), acc[r]);
            if (qt == QT_Q4_K)
                acc[r] = _mm256_fnmadd_ps(_mm256_loadu_ps(t->mn + 16 * g + 8 * hf), _mm256_set1_ps(ij->dxs[x]), acc[r]);
        }
    }
    for (int r = 0; r < MR; r++) x16a_store(j, grp, m0 + r, hf, acc[r]);
}

/* Group grp (decoded in t) against every row of x, MR rows at a time; the type a constant in each copy. */
#define X16T_MR_OF(QT) ((QT) == QT_Q6_K ? 2 : 4)
#define X16T_ROWS(QT) do { \
    const int64_t M = ij->j->M, full = M / X16T_MR_OF(QT) * X16T_MR_OF(QT); \
    for (int hf = 0; hf < 2; hf++) { \
        if (grp * X16 + 8 * hf >= ij->j->N) break; \
        for (int64_t m = 0; m < full; m += X16T_MR_OF(QT)) x16t_rows(ij, t, grp, m, X16T_MR_OF(QT), hf, QT); \
        for (int64_t m = full; m < M; m++) x16t_rows(ij, t, grp, m, 1, hf, QT); \
    } \
} while (0)
/* Group grp's records decoded into t, block by block. */
#define X16T_DECODE(QT) \
    for (int64_t b = 0; b < ij->j->nb; b++) x16t_decode(w16 + (grp * ij->j->nb + b) * x16_record(QT), b, QT, t)
/* w16 NULL: the GGUF layout's rows (Q8_0 or Q6_K) instead of a copy's records. */
static AVX2 void x16t_group(const IJob *ij, const uint8_t *w16, int64_t grp, const int qt, X16T *t) {
    if (w16) X16_BY_TYPE(qt, X16T_DECODE);
    else if (qt == QT_Q8_0) x16t_decode_gguf(ij->j, grp, QT_Q8_0, t);
    else x16t_decode_gguf(ij->j, grp, QT_Q6_K, t);
    X16_BY_TYPE(qt, X16T_ROWS);
}

/* Groups [g0, g1) (of w16's records, or of the GGUF layout's rows where w16 is NULL) against every row of x through
   the scratch: 0, or -3 when it cannot be allocated (a copy's caller then runs x16a_group, with the same results;
   the GGUF layout's reports it). */
static int x16t_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt) {
    const int64_t G = ij->j->K / QK;
    uint8_t *u = malloc((size_t)(G * 512));
    float *s = malloc((size_t)(G * 16 * 2) * sizeof(float));
    int32_t *sc = malloc((size_t)(G * 16 * 2) * sizeof(int32_t));
    if (!u || !s || !sc) { free(u); free(s); free(sc); return -3; }
    X16T t = {u, s, s + G * 16, sc, sc + G * 16};
    for (int64_t g = g0; g < g1; g++) x16t_group(ij, w16, g, qt, &t);
    free(u); free(s); free(sc);
    return 0;
}
#endif
