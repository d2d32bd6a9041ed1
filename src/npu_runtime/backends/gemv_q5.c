/* Q5_0 blocks for the quantized GEMV: their 5-bit codes, and the GEMV's ranges over them.

   Appended to gemv_q.c by the loader, before gemv_q_i8.c and gemv_q_deq.c (one translation unit: QJob, SPREAD,
   RANGE_C / RANGE_M, qblock_*, codes_i8). llama.cpp's quantizer stores as Q5_0 the rows that are not whole 256-weight
   super-blocks (Qwen2.5-0.5B's K = 896) of a "Q4_K_M" file, so such a file is mostly Q5_0.
     Q5_0 (type 6): 22 bytes = fp16 d, uint32 qh (little-endian, at byte 2: the block is 2-byte aligned only),
                    uint8 qs[16];  value j = d * (((qs[j] & 15) | (bit j of qh) << 4) - 16),
                                   value j + 16 = d * (((qs[j] >> 4) | (bit j + 16 of qh) << 4) - 16), j < 16
   The codes, -16..15, are small integers as Q4_0's are, and d * code is exact in fp32 (11 x 5 bits): so Q5_0 runs
   the 32-element kernels of gemv_q.c (qblock_c / _avx2 / _avx512, whose code extraction calls q5_codes_c and
   q5_codes_avx2 below) with the same contract, an fp32 dot product of the exactly dequantized weights;
   gemv_q_deq.c's rows are bit-exact with ggml's dequantize, and gemv_q_i8.c's int8 path takes the codes + 16
   (q5_unsigned_avx2; with AVX-512 VNNI, q5_unsigned_vnni). An AVX-512 BW variant of q5_codes_avx2 (qh as a byte
   mask) measured within noise of it in the float GEMV (bench: q5_0 ~1.25x Q4_0's time either way): not kept. */

/* The 32 codes of a block, -16..15, in element order. */
static inline __attribute__((always_inline)) void q5_codes_c(const uint8_t *blk, int8_t c[QK]) {
    const uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
    for (int i = 0; i < QK / 2; i++) {
        c[i] = (int8_t)(((blk[6 + i] & 15) | ((qh >> i) & 1) << 4) - 16);
        c[i + QK / 2] = (int8_t)(((blk[6 + i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - 16);
    }
}

#ifdef QG_X86
/* The 32 codes + 16 (0..31, unsigned: the int8 path's operand) as one vector, element e in byte e: qh's byte e / 8
   spread over 8 lanes by a shuffle, lane e's bit tested by OR-ing in every other bit (all ones iff set: llama.cpp's
   bytes_from_bits_32), the nibbles of qs low then high. */
static inline __attribute__((always_inline)) AVX2 __m256i q5_fifth_avx2(const uint8_t *blk) {
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), _mm256_set_epi64x(
        0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)), _mm256_set1_epi64x(-1));
}
static inline __attribute__((always_inline)) AVX2 __m256i q5_nibbles_avx2(const uint8_t *blk) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 6));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}
static inline __attribute__((always_inline)) AVX2 __m256i q5_unsigned_avx2(const uint8_t *blk) {
    return _mm256_or_si256(q5_nibbles_avx2(blk), _mm256_and_si256(q5_fifth_avx2(blk), _mm256_set1_epi8(16)));
}

/* The codes as int8, elements 0..15 in lo, 16..31 in hi: a nibble with its fifth bit clear is nibble - 16, that is
   nibble | 0xf0 as int8; with it set, the nibble itself. */
static inline __attribute__((always_inline)) AVX2 void q5_codes_avx2(const uint8_t *blk, __m128i *lo, __m128i *hi) {
    const __m256i c = _mm256_or_si256(q5_nibbles_avx2(blk),
                                      _mm256_andnot_si256(q5_fifth_avx2(blk), _mm256_set1_epi8((char)0xf0)));
    *lo = _mm256_castsi256_si128(c);
    *hi = _mm256_extracti128_si256(c, 1);
}
#endif

/* gemv_q.c's 32-element kernels with the type a constant Q5_0 (RANGE_* dispatch between two types: both are it). */
RANGE_C(range_q5_c, qblock_c, QT_Q5_0, QT_Q5_0)
#ifdef QG_X86
RANGE_M(range_q5_avx2, qblock_avx2, AVX2, QT_Q5_0, QT_Q5_0)
RANGE_M(range_q5_avx512, qblock_avx512, AVX512, QT_Q5_0, QT_Q5_0)
#endif

/* Rows [n0, n1) of a Q5_0 weight for rows m0 .. m0 + M - 1 of x (run_rows' step for this type). */
static void range_q5(const QJob *j, int64_t m0, int M, int64_t n0, int64_t n1, int isa) {
#ifdef QG_X86
    if (isa == ISA_AVX512) { range_q5_avx512(j, m0, M, n0, n1, QT_Q5_0); return; }
    if (isa == ISA_AVX2) { range_q5_avx2(j, m0, M, n0, n1, QT_Q5_0); return; }
#endif
    (void)isa;
    range_q5_c(j, m0, M, n0, n1, QT_Q5_0);
}
