/* Rows of a block-quantized weight dequantized into fp32: out[n1 - n0, K] = dequant(w)[n0:n1] (cpu_qgemv.py's
   dequantize_rows, and the tiles of its prefill path: a tile of W widened into a buffer that stays in cache,
   then multiplied by torch.mm with many rows of x at once, where the GEMV would be compute-bound).

   Appended to gemv_q.c by the loader (one translation unit: block_bytes, codes_i8, q5_codes_c, kq_weights_*). Each
   value is made as ggml's dequantize makes it, so the result is bit-exact with gguf.quants.dequantize and
   torch_ir.quant.blocks.dequantize: Q8_0 / Q4_0 / Q5_0 d * q and Q6_K (d*sc) * q are exact products, Q4_K's
   (d*sc) * q - dmin*m rounds once, fused or not (see gemv_q.c's top). */

/* One row of nb blocks into dst, portable C. */
static void deq_row_c(const uint8_t *row, const int qt, const int64_t nb, float *dst) {
    const int bs = block_bytes(qt);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        if (is_kquant(qt)) { kq_weights_c(blk, qt, dst + b * QKK); continue; }
        const float d = f16_to_f32(load_u16(blk));
        float *o = dst + b * QK;
        if (qt == QT_Q8_0) for (int i = 0; i < QK; i++) o[i] = d * (float)(int8_t)blk[2 + i];
        else if (qt == QT_Q5_0) {
            int8_t c[QK];
            q5_codes_c(blk, c);
            for (int i = 0; i < QK; i++) o[i] = d * (float)c[i];
        } else for (int i = 0; i < QK / 2; i++) {
            o[i] = d * (float)((blk[2 + i] & 15) - 8);
            o[i + QK / 2] = d * (float)((blk[2 + i] >> 4) - 8);
        }
    }
}

#ifdef QG_X86
static AVX2 void deq_row_avx2(const uint8_t *row, const int qt, const int64_t nb, float *dst) {
    const int bs = block_bytes(qt);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        if (is_kquant(qt)) { kq_weights_avx2(blk, qt, dst + b * QKK); continue; }
        __m128i lo, hi;
        codes_i8(blk, qt, &lo, &hi);
        const __m256 d = _mm256_set1_ps(scale_of(blk));
        float *o = dst + b * QK;
        _mm256_storeu_ps(o, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
    }
}

static AVX512 void deq_row_avx512(const uint8_t *row, const int qt, const int64_t nb, float *dst) {
    const int bs = block_bytes(qt);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        if (is_kquant(qt)) { kq_weights_avx512(blk, qt, dst + b * QKK); continue; }
        __m128i lo, hi;
        codes_i8(blk, qt, &lo, &hi);
        const __m512 d = _mm512_set1_ps(scale_of(blk));
        _mm512_storeu_ps(dst + b * QK, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))));
        _mm512_storeu_ps(dst + b * QK + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))));
    }
}
#endif

static void deq_row(const uint8_t *row, const int qt, const int64_t nb, float *dst, const int isa) {
#ifdef QG_X86
    if (isa >= ISA_AVX512) { deq_row_avx512(row, qt, nb, dst); return; }
    if (isa == ISA_AVX2) { deq_row_avx2(row, qt, nb, dst); return; }
#endif
    (void)isa;
    deq_row_c(row, qt, nb, dst);
}

/* Rows per thread's share below which one thread does it all: a parallel region costs a few microseconds,
   ~16 KiB of output at the store rate of one core. */
#define DEQ_MIN_VALUES 16384

/* out[(n - n0) * K + k] = dequant(w)[n, k] for n0 <= n < n1: 0, or -2 for a type this code does not know. The rows
   go to torch's OpenMP threads in even static shares (every row costs the same). */
int qdeq_rows(const uint8_t *w, int qt, int64_t K, int64_t n0, int64_t n1, float *out, int nthreads, int isa) {
    if (qt != QT_Q8_0 && qt != QT_Q4_0 && qt != QT_Q5_0 && !is_kquant(qt)) return -2;
    if (n1 <= n0 || K <= 0) return 0;
    const int64_t nb = K / block_elems(qt), row_bytes = nb * block_bytes(qt), rows = n1 - n0;
    if (nthreads > 1 && rows * K < (int64_t)nthreads * DEQ_MIN_VALUES) nthreads = (int)(rows * K / DEQ_MIN_VALUES);
    if (nthreads > rows) nthreads = (int)rows;
    if (nthreads <= 1) {
        for (int64_t r = 0; r < rows; r++) deq_row(w + (n0 + r) * row_bytes, qt, nb, out + r * K, isa);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthreads)
#endif
    for (int64_t r = 0; r < rows; r++) deq_row(w + (n0 + r) * row_bytes, qt, nb, out + r * K, isa);
    return 0;
}

/* qdeq_rows() with its arguments in one block of 8 int64 (_DEQ_ARGS in cpu_qgemv.py). */
int qdeq_rows_packed(const void *block) {
    int64_t a[8];
    memcpy(a, block, sizeof a);
    return qdeq_rows((const uint8_t *)(intptr_t)a[0], (int)a[1], a[2], a[3], a[4], (float *)(intptr_t)a[5], (int)a[6],
                     (int)a[7]);
}
