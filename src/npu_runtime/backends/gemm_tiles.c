/* A prefill's GEMM of bf16 / fp16 / fp32 weights on AVX2/FMA/F16C: y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]), the
   weights widened to fp32 as they are packed, fp32 products and sums, y rounded once to its dtype.

   Appended to gemv.c (one translation unit: its DT_* codes, load_elem/store_elem and AVX2 macro; half.c's
   conversions) and called through ctypes by cpu_gemv.Gemv.tiled_mm and cpu_qgemv's tiles of dequantized rows, for
   many rows of x, where AVX2 is the CPU's best kernel. The shape of it is the classic one (BLIS, GotoBLAS): a panel of
   24 columns of w, KC deep, is widened into a buffer that stays in L1, and a 4 x 24 block of y is held in 12 ymm
   registers while x's 4 rows are broadcast against it, 12 FMAs per step of k (the two FMA pipes busy, the loads on
   the other ports). Threads take panels four at a time (each weight read once in all); a thread keeps its columns of
   y in fp32 across the KC blocks and rounds them once at the end. The Python side checks every pointer and size:
   this code trusts them. */

#define TG_MR 4
#define TG_NR 24  /* cpu_gemv.TILES_PANEL: a caller cutting W into tiles cuts them to whole panels */
#define TG_NV (TG_NR / 8)  /* vectors of 8 per row of a block */
#define TG_KC 256

#ifdef GEMV_X86
/* 8 values of w from (row, k) on, widened exactly to fp32. */
static inline __attribute__((always_inline)) AVX2 __m256 tg_load8(const void *w, int wdt, size_t i) {
    if (wdt == DT_F32) return _mm256_loadu_ps((const float *)w + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wdt == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* v[j] becomes (v[0][j], ..., v[7][j]): an 8 x 8 transpose in registers. */
static inline __attribute__((always_inline)) AVX2 void tg_transpose8(__m256 v[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Rows n0.. n0+23 of w (those past N as zeros), k in [k0, k0+kc), into b[kc][24] fp32: 8 rows at a time, 8 values
   of each widened and transposed in registers. */
static AVX2 void tg_pack(const void *w, int wdt, int64_t N, int64_t K, int64_t n0, int64_t k0, int kc, float *b) {
    const int rows = N - n0 < TG_NR ? (int)(N - n0) : TG_NR;
    const int k8 = kc / 8 * 8;
    for (int eight = 0; eight < TG_NR; eight += 8) {
        for (int kk = 0; kk < k8; kk += 8) {
            __m256 v[8];
            for (int r = 0; r < 8; r++)
                v[r] = eight + r < rows ? tg_load8(w, wdt, (size_t)((n0 + eight + r) * K + k0 + kk))
                                        : _mm256_setzero_ps();
            tg_transpose8(v);
            for (int j = 0; j < 8; j++) _mm256_store_ps(b + (size_t)(kk + j) * TG_NR + eight, v[j]);
        }
    }
    for (int kk = k8; kk < kc; kk++)                    /* the end of K, when K is not a multiple of 8 */
        for (int r = 0; r < TG_NR; r++)
            b[(size_t)kk * TG_NR + r] = r < rows ? load_elem(w, wdt, (size_t)((n0 + r) * K + k0 + kk)) : 0.0f;
}

/* c[4][24] (+)= a[4 rows][kc] . b[kc][24], a's rows given one by one (a row past M points at zeros): 12 accumulators,
   3 loads of b and 4 broadcasts per step of k, 16 ymm registers in all. (6 x 16, BLIS's Haswell shape, measured 2-6 %
   slower here: 8 loads per 12 FMAs, and 128 rows of x are not a multiple of 6.) */
static inline __attribute__((always_inline)) AVX2
void tg_block(const float *const a[TG_MR], const float *b, int kc, float *c, int first) {
    __m256 acc[TG_MR][TG_NV];
    for (int r = 0; r < TG_MR; r++)
        for (int v = 0; v < TG_NV; v++)
            acc[r][v] = first ? _mm256_setzero_ps() : _mm256_load_ps(c + r * TG_NR + 8 * v);
    for (int k = 0; k < kc; k++) {
        __m256 bv[TG_NV];
        for (int v = 0; v < TG_NV; v++) bv[v] = _mm256_load_ps(b + (size_t)k * TG_NR + 8 * v);
        for (int r = 0; r < TG_MR; r++) {
            const __m256 x = _mm256_broadcast_ss(a[r] + k);
            for (int v = 0; v < TG_NV; v++) acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < TG_MR; r++)
        for (int v = 0; v < TG_NV; v++) _mm256_store_ps(c + r * TG_NR + 8 * v, acc[r][v]);
}

/* 8 fp32 values rounded to y's dtype, as half.c rounds them (F16C's round-to-nearest-even gives the same bits,
   NaN and overflow included), stored at y + i. */
static inline __attribute__((always_inline)) AVX2 void tg_store8(void *y, int ydt, size_t i, __m256 v) {
    if (ydt == DT_F32) { _mm256_storeu_ps((float *)y + i, v); return; }
    __m128i h;
    if (ydt == DT_F16) {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
        const __m256i u = _mm256_castps_si256(v);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
        const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    }
    _mm_storeu_si128((__m128i *)((uint16_t *)y + i), h);
}

/* Columns n0.. of y (rows ldy apart) from a thread's fp32 panel c[Mp][24], bias added, rounded once. */
static AVX2 void tg_finish(const float *c, int64_t M, int64_t N, int64_t n0, const float *bias, void *y, int64_t ldy,
                           int ydt) {
    const int cols = N - n0 < TG_NR ? (int)(N - n0) : TG_NR;
    for (int64_t m = 0; m < M; m++) {
        const float *row = c + m * TG_NR;
        if (cols == TG_NR) {
            for (int h = 0; h < TG_NR; h += 8) {
                __m256 v = _mm256_load_ps(row + h);
                if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0 + h));
                tg_store8(y, ydt, (size_t)(m * ldy + n0 + h), v);
            }
        } else {
            for (int j = 0; j < cols; j++)
                store_elem(y, ydt, (size_t)(m * ldy + n0 + j), row[j] + (bias ? bias[n0 + j] : 0.0f));
        }
    }
}

static const float tg_zeros[TG_KC];                    /* the rows of x past M in the last block of 4 */

/* The 24 columns of panel p; b and c a thread's buffers ([TG_KC][24], [M rounded up to 4][24] fp32, aligned). */
static AVX2 void tg_panel(const float *x, int64_t M, int64_t N, int64_t K, const void *w, int wdt, const float *bias,
                          void *y, int64_t ldy, int ydt, int64_t p, float *b, float *c) {
    const int64_t n0 = p * TG_NR, blocks = (M + TG_MR - 1) / TG_MR, es = wdt == DT_F32 ? 4 : 2;
    for (int64_t k0 = 0; k0 < K; k0 += TG_KC) {
        const int kc = K - k0 < TG_KC ? (int)(K - k0) : TG_KC;
        tg_pack(w, wdt, N, K, n0, k0, kc, b);
        /* The cache lines the next packing reads (this panel's next KC of its rows, else the next panel's first),
           fetched a share per block of x, so that they arrive during these FMAs rather than stall the packing on 24
           rows of memory (cold weights: +1-6 % GMAC/s at bench/gemv/prefill.py's shapes). Here in the loop, not in
           a helper: GCC finds a function of prefetches alone free of effects and drops its calls. */
        const int64_t more = k0 + TG_KC < K, nk0 = more ? k0 + TG_KC : 0, nn0 = more ? n0 : n0 + TG_NR;
        const int64_t rows = nn0 >= N ? 0 : N - nn0 < TG_NR ? N - nn0 : TG_NR;
        const int64_t lines = ((K - nk0 < TG_KC ? K - nk0 : TG_KC) * es + 63) / 64, total = rows * lines;
        const char *next = (const char *)w + (nn0 * K + nk0) * es;
        for (int64_t m0 = 0; m0 < M; m0 += TG_MR) {
            const int64_t blk = m0 / TG_MR;
            for (int64_t i = total * blk / blocks; i < total * (blk + 1) / blocks; i++)
                _mm_prefetch(next + (i / lines) * K * es + (i % lines) * 64, _MM_HINT_T0);
            const float *a[TG_MR];
            for (int r = 0; r < TG_MR; r++) a[r] = m0 + r < M ? x + (m0 + r) * K + k0 : tg_zeros;
            tg_block(a, b, kc, c + m0 * TG_NR, k0 == 0);
        }
    }
    tg_finish(c, M, N, n0, bias, y, ldy, ydt);
}
#endif

/* panels a thread takes at a time, at most: 96 columns, ~80 us at K = 896 (a thread slowed by a neighbour leaves the
   rest); fewer where there are under four such chunks a thread (cpu_qgemv's tiles of 128-256 rows: 6-11 panels) */
#define TG_CHUNK 4

/* y[M,N] (dtype ydt, rows ldy >= N apart: a block of columns of a wider y) = x[M,K] . w[N,K]^T (+ bias[N]): x fp32,
   w fp32 / bf16 / fp16, bias fp32 or NULL. 0; -2 for K = 0, on a CPU without AVX2/FMA/F16C or in a build for another
   machine (the caller keeps its own path); -3 when a thread's buffers cannot be had (y then incomplete: the caller
   runs its own path). */
int gemm_tiles(int64_t M, int64_t N, int64_t K, const float *x, const void *w, int wdt, const float *bias, void *y,
               int64_t ldy, int ydt, int nthreads) {
#ifdef GEMV_X86
    if (gemv_isa() < 1) return -2;
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) return -2;
    const int64_t Mp = (M + TG_MR - 1) / TG_MR * TG_MR, panels = (N + TG_NR - 1) / TG_NR;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > panels) nthreads = (int)panels;
    const int64_t fair = panels / (4 * (int64_t)nthreads);
    const int chunk = fair < 1 ? 1 : fair < TG_CHUNK ? (int)fair : TG_CHUNK;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
#endif
    {
        float *b = aligned_alloc(32, (size_t)TG_KC * TG_NR * sizeof(float));
        float *c = aligned_alloc(32, (size_t)Mp * TG_NR * sizeof(float));
        failed = !b || !c;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, chunk)
#endif
        for (int64_t p = 0; p < panels; p++)
            if (!failed) tg_panel(x, M, N, K, w, wdt, bias, y, ldy, ydt, p, b, c);
        free(b);
        free(c);
    }
    return failed ? -3 : 0;
#else
    (void)M; (void)N; (void)K; (void)x; (void)w; (void)wdt; (void)bias; (void)y; (void)ldy; (void)ydt; (void)nthreads;
    return -2;
#endif
}

/* TG_NR, for the test that cpu_gemv.TILES_PANEL is it. */
int gemm_tiles_panel(void) { return TG_NR; }
