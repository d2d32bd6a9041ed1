/* The x-quantized-to-int8 path (activations="int8") for Q8_0 and Q6_K blocks: gemv_q_i8.c's contract, these
   layouts' integer group sums.

   Appended after gemv_q_i8.c by the loader (one translation unit: IJob and quantize_x's qx / dx / corr, IB, DOT_VNNI
   and DOT_AVX2, hsum8, kq_codes_c; qgemv_i8 calls irange8 below with its chunks and threads). Per group g of 32
   elements of x (q = round(x / dx_g), |q| <= 127: quantize_x never writes -128):
     Q8_0: isum_g = sum of code * q, both signed (code -128..127); y += (d * dx_g) * isum_g. vpdpbusd and maddubs
           take unsigned times signed bytes, so they get |code| (0..128 as an unsigned byte: abs(-128) is 0x80)
           times sign(code) * q (_mm256_sign_epi8: |q| <= 127, so its negation fits). maddubs saturates its pairs
           to int16: 2 * 128 * 127 = 32512 <= 32767 never does (codes + 128 would: 2 * 255 * 127 > 32767).
           |isum| <= 32 * 128 * 127 = 520192 < 2^24: exact in int32, and as the fp32 it is scaled in.
     Q6_K: group g = 8b + c of super-block b holds its sub-blocks 2c and 2c + 1 (16 elements each, int8 scales sc);
           isum_g = sc[2c] * sum_16 (u - 32) * q + sc[2c + 1] * sum_16 (u - 32) * q, u the unsigned 6-bit code.
           The dot takes u (0..63) unsigned, each lane of 4 products starting at -32 * (the sum of its 4 q), which
           is 4 * corr (quantize_x's -8 * ..., as Q4_0's "- 8"): a lane is sum_4 (u - 32) * q, |lane| <= 4 * 32 *
           127 = 16256 (maddubs' pairs of u * q <= 2 * 63 * 127 = 16002), then times its sub-block's scale
           (lanes 0-3: sc[2c], 4-7: sc[2c + 1]; |sc| <= 128): <= 2080768, and the 8 lanes' isum <= 16646144 < 2^24.
           So every lane is an exact integer, exact in fp32 too; y += (d * dx_g) * lane, in fp32 lanes (summed in
           the order they give, as gemv_q_i8.c's are). */

#ifdef QG_X86
/* Half h of a Q6_K super-block, its 128 unsigned codes (0..63) as four groups of 32 in element order: ql's low
   nibbles of bytes 64h..64h+31, of 64h+32..64h+63, then their high nibbles; the code's bits 4-5 from qh's byte
   32h + i at bits 0-1, 2-3, 4-5, 6-7 (epi16 shifts: the bits pulled in from the neighbour byte are masked). The
   float path's kq_codes_avx2 (gemv_q.c) takes them too, minus 32. */
static inline __attribute__((always_inline)) AVX2 void q6_unsigned_avx2(const uint8_t *blk, const int h, __m256i u[4]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
    const __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
    const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    u[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
    u[1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(H, m30));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
}
#endif

/* Row n of W against M rows of x from m0, portable C (gemv_q_i8.c's iblock_c, for these two layouts). */
static void iblock8_c(const IJob *ij, int64_t m0, const int M, int64_t n, const int qt) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const int bs = block_bytes(qt);
    float acc[IM];
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    for (int64_t b = 0; b < j->nb; b++) {
        const uint8_t *blk = j->w + n * j->row_bytes + b * bs;
        if (qt == QT_Q8_0) {
            const float d = f16_to_f32(load_u16(blk));
            for (int m = 0; m < M; m++) {
                const int8_t *q = ij->qx + (m0 + m) * j->K + b * QK;
                int s = 0;
                for (int i = 0; i < QK; i++) s += (int8_t)blk[2 + i] * q[i];
                acc[m] += (d * ij->dx[(m0 + m) * G + b]) * (float)s;
            }
            continue;
        }
        int8_t c[QKK];  /* u - 32 */
        kq_codes_c(blk, QT_Q6_K, c);
        const float d = f16_to_f32(load_u16(blk + 208));
        for (int t = 0; t < 8; t++) {
            const int64_t g = 8 * b + t;
            for (int m = 0; m < M; m++) {
                const int8_t *q = ij->qx + (m0 + m) * j->K + g * QK;
                int s = 0;
                for (int h = 0; h < 2; h++) {
                    int p = 0;
                    for (int i = 0; i < 16; i++) p += c[32 * t + 16 * h + i] * q[16 * h + i];
                    s += (int8_t)blk[192 + 2 * t + h] * p;
                }
                acc[m] += (d * ij->dx[(m0 + m) * G + g]) * (float)s;
            }
        }
    }
    for (int m = 0; m < M; m++) store(j, m0 + m, n, acc[m]);
}

#ifdef QG_X86
/* Group c of a Q6_K super-block's lanes, each sum_4 (u - 32) * q times its sub-block's scale (lanes 0-3: sc[2c], 4-7:
   sc[2c + 1]). VNNI: vpdpbusd from 4 * corr (-32 * the sum of the lane's q), then times the scales as int32 (bytes
   2c x 4, 2c + 1 x 4, sign-extended). AVX2: maddubs' pairs u * q plus -32 * the pair's q (corr16: |the sum| <= 2 * 32
   * 127 fits int16), then vpmaddwd by the scales as int16 (2c x 8, 2c + 1 x 8) sums each lane's two pairs, scaled:
   the same integer in one multiply where vpmaddwd by ones and vpmulld took two. */
#define Q6_SCALES_VNNI(sc, c) _mm256_cvtepi8_epi32(_mm_shuffle_epi8((sc), _mm_set1_epi64x( \
    0x0101010100000000LL + (c) * 0x0202020202020202LL)))
#define Q6_LANES_VNNI(u, q, cm, c16, s) _mm256_mullo_epi32(_mm256_dpbusd_epi32( \
    _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(cm)), 2), (u), (q)), (s))
#define Q6_SCALES_AVX2(sc, c) _mm256_cvtepi8_epi16(_mm_shuffle_epi8((sc), _mm_set_epi64x( \
    (2 * (c) + 1) * 0x0101010101010101LL, 2 * (c) * 0x0101010101010101LL)))
#define Q6_LANES_AVX2(u, q, cm, c16, s) _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16((u), (q)), \
    _mm256_loadu_si256((const __m256i *)(c16))), (s))
/* R rows of W (n0 + r * stride) against M rows of x from m0 (gemv_q_i8.c's IBLOCK, for these two layouts: each
   block's codes decoded once, each row's sums and fp32 steps as with M = 1). */
#define IBLOCK8(NAME, ATTR, DOT, Q6_SCALES, Q6_LANES) \
static inline __attribute__((always_inline)) ATTR \
void NAME(const IJob *ij, int64_t m0, const int M, int64_t n0, int64_t stride, const int R, const int qt) { \
    const QJob *j = ij->j; \
    const int64_t G = j->K / QK; \
    const int8_t *qx = ij->qx + m0 * j->K; \
    const float *dx = ij->dx + m0 * G; \
    const int32_t *corr = ij->corr + m0 * (j->K / 4); \
    const int16_t *corr16 = ij->corr16 + m0 * (j->K / 2); \
    const int bs = block_bytes(qt); \
    __m256 acc[IM][4]; \
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) acc[m][r] = _mm256_setzero_ps(); \
    for (int64_t b = 0; b < j->nb; b++) { \
        for (int r = 0; r < R; r++) { \
            const uint8_t *blk = j->w + (n0 + r * stride) * j->row_bytes + b * bs; \
            _mm_prefetch((const char *)blk + QG_AHEAD, _MM_HINT_T0); \
            if (qt == QT_Q8_0) { /* |code| unsigned times sign(code) * q */ \
                const __m256i c = _mm256_loadu_si256((const __m256i *)(blk + 2)), u = _mm256_abs_epi8(c); \
                const float d = _cvtsh_ss(load_u16(blk)); \
                UNROLL for (int m = 0; m < M; m++) { \
                    const __m256i i = DOT(_mm256_setzero_si256(), u, _mm256_sign_epi8( \
                        _mm256_loadu_si256((const __m256i *)(qx + m * j->K + QK * b)), c)); \
                    acc[m][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[m * G + b]), _mm256_cvtepi32_ps(i), acc[m][r]); \
                } \
                continue; \
            } \
            _mm_prefetch((const char *)blk + QG_AHEAD + 64, _MM_HINT_T0); \
            _mm_prefetch((const char *)blk + QG_AHEAD + 128, _MM_HINT_T0); \
            _mm_prefetch((const char *)blk + QG_AHEAD + 192, _MM_HINT_T0); \
            const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192)); \
            const float d = _cvtsh_ss(load_u16(blk + 208)); \
            for (int h = 0; h < 2; h++) { \
                __m256i u[4]; \
                q6_unsigned_avx2(blk, h, u); \
                for (int t = 0; t < 4; t++) { \
                    const int c = 4 * h + t; \
                    const int64_t g = 8 * b + c; \
                    const __m256i s = Q6_SCALES(sc, c); \
                    UNROLL for (int m = 0; m < M; m++) { \
                        const __m256i q = _mm256_loadu_si256((const __m256i *)(qx + m * j->K + QK * g)); \
                        const __m256i i = Q6_LANES(u[t], q, corr + m * (j->K / 4) + 8 * g, \
                                                   corr16 + m * (j->K / 2) + 16 * g, s); \
                        acc[m][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[m * G + g]), _mm256_cvtepi32_ps(i), \
                                                    acc[m][r]); \
                    } \
                } \
            } \
        } \
    } \
    for (int m = 0; m < M; m++) for (int r = 0; r < R; r++) store(j, m0 + m, n0 + r * stride, hsum8(acc[m][r])); \
}
IBLOCK8(iblock8_avx2, AVX2, DOT_AVX2, Q6_SCALES_AVX2, Q6_LANES_AVX2)
IBLOCK8(iblock8_vnni, VNNI, DOT_VNNI, Q6_SCALES_VNNI, Q6_LANES_VNNI)

#define IRANGE8(NAME, BLOCK, ATTR) \
static ATTR void NAME(const IJob *j, int64_t n0, int64_t n1, const int qt) { \
    if (qt == QT_Q8_0) { IB(BLOCK, QT_Q8_0); } else { IB(BLOCK, QT_Q6_K); } \
}
IRANGE8(irange8_avx2, iblock8_avx2, AVX2)
IRANGE8(irange8_vnni, iblock8_vnni, VNNI)
#endif

/* Rows [n0, n1) of a Q8_0 or Q6_K weight against every row of x (gemv_q_i8.c's irange for these layouts). */
static void irange8(const IJob *ij, int64_t n0, int64_t n1, const int qt, const int isa) {
#ifdef QG_X86
    if (isa == ISA_AVX512_VNNI) { irange8_vnni(ij, n0, n1, qt); return; }
    if (isa >= ISA_AVX2) { irange8_avx2(ij, n0, n1, qt); return; }
#endif
    (void)isa;
    for (int64_t m0 = 0; m0 < ij->j->M; m0 += IM) {
        const int M = (int)(ij->j->M - m0 < IM ? ij->j->M - m0 : IM);
        for (int64_t n = n0; n < n1; n++) iblock8_c(ij, m0, M, n, qt);
    }
}
