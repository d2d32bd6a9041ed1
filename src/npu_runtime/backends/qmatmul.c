/* int8 matrix product of two activations (attention's Q·Kᵀ and P·V): y = requantize(sum (a - a_zp)(b - b_zp) + bias),
   bit-exact with QGEMM. Appended to qconv.c and qconv_run.c into one translation unit (cpu_qmatmul.SOURCES): it reuses
   that file's im2col panels (panel_*), micro-kernels (tile_*) and epilogue (store_*), so it has no second copy of
   the requantize. The Python side checks every pointer and size and proves that no int32 sum can overflow.

   Roles: y [M][N] is row-major, so its columns n are qconv's output positions (vector stores along n) and its rows
   m the output channels. b is the unsigned panel operand ([K4][BLOCK][4], built per thread and block of BLOCK
   columns: int8 b has its sign bit flipped, b + 128), a the signed "weights" ([M / QR][K4][QR] lanes of 4 k, uint8 a
   flipped to a - 128), packed per call and batch. With a_s, b_u those codes and az_s, bz_u the zero points moved
   alike, the sum is exact in wrapping int32 arithmetic (its true value fits, Python checked):
     sum (a - az)(b - bz) = sum a_s b_u - bz_u RA[m] - az_s CB[n] + K az_s bz_u,  RA[m] = sum_k a_s, CB[n] = sum_k b_u
   so off[m] = K az_s bz_u - bz_u RA[m] (qconv's per-channel term) and offp[n] = bias[n] - az_s CB[n] (its
   per-position term). */

/* qmatmul_packed's argument block: 19 int64 then 4 doubles (_ARGS in cpu_qmatmul.py). a [batch][M][K], b
   [batch][K][N] (trans_b 0) or [batch][N][K] (trans_b 1), y [batch][M][N], bias int32 [N] or 0; m: the float32
   multiplier (x_scale * w_scale / y_scale, or x_scale * w_scale for a float output) held exactly in a double. */
typedef struct {
    int64_t a, b, batch, M, N, K, trans_b, a_flip, b_flip, az_s, bz_u, bias, y, out;
    int64_t scratch, scratch_bytes, nthreads, isa, relu;
    double m, zp, lo, hi;
} MArgs;

/* Scratch regions, each from a multiple of 64 bytes: packed a (int8 lanes, and as int16 for AVX2) per batch,
   off per batch (MB * QR int32), offp per batch (N int32), the multiplier per row, a fill row of N bytes for the
   panel's padding rows k >= K, then one panel per thread. */
typedef struct { int64_t apack, apack16, off, offp, mvec, fill, panels, total; } MLayout;

static int64_t up64(int64_t n) { return (n + 63) & ~(int64_t)63; }

static MLayout mm_layout(int64_t batch, int64_t M, int64_t N, int64_t K, int64_t nthreads, int64_t isa) {
    const int64_t MB = (M + QR - 1) / QR, K4 = (K + 3) / 4, lanes = MB * K4 * QR * 4;
    MLayout l;
    l.apack = 0;
    l.apack16 = up64(batch * lanes);
    l.off = l.apack16 + (isa == ISA_AVX2 ? up64(batch * lanes * 2) : 0);
    l.offp = l.off + up64(batch * MB * QR * 4);
    l.mvec = l.offp + up64(batch * N * 4);
    l.fill = l.mvec + up64(MB * QR * 4);
    l.panels = l.fill + up64(N);
    l.total = l.panels + (nthreads < 1 ? 1 : nthreads) * panel_bytes(K4);
    return l;
}

/* Bytes of scratch one call needs, or -1 for sizes out of range (cpu_qmatmul.py sizes its buffer with this). */
int64_t qmatmul_scratch_bytes(int64_t batch, int64_t M, int64_t N, int64_t K, int64_t nthreads, int64_t isa) {
    const int64_t big = (int64_t)1 << 31;
    if (batch < 1 || M < 1 || N < 1 || K < 1 || batch >= big || M >= big || N >= big || K >= big
        || nthreads > 65536 || (double)batch * (M + QR) * (K + 4) * 3 + (double)batch * N * 4 > 1e15) return -1;
    return mm_layout(batch, M, N, K, nthreads, isa).total;
}

/* a's rows as signed lanes of 4 k, [MB][K4][QR] words, zero past M and K: whole tiles word by word (8 rows read
   side by side, one run of 8 words written), a tail byte by byte. */
static inline __attribute__((always_inline)) void pack_a(const uint8_t *A, int64_t M, int64_t K, uint8_t fa, uint32_t *w) {
    const int64_t MB = (M + QR - 1) / QR, K4 = (K + 3) / 4;
    const uint32_t fa4 = fa * 0x01010101u;
    for (int64_t mb = 0; mb < MB; mb++) {
        uint32_t *wt = w + mb * K4 * QR;
        const uint8_t *base = A + mb * QR * K;
        if ((mb + 1) * QR <= M && K % 4 == 0) {
            for (int64_t k4 = 0; k4 < K4; k4++)
                for (int r = 0; r < QR; r++) {
                    uint32_t v;
                    memcpy(&v, base + r * K + 4 * k4, 4);
                    wt[k4 * QR + r] = v ^ fa4;
                }
            continue;
        }
        memset(wt, 0, (size_t)(K4 * QR * 4));
        for (int r = 0; r < QR && mb * QR + r < M; r++)
            for (int64_t k = 0; k < K; k++)
                wt[k / 4 * QR + r] |= (uint32_t)(uint8_t)(base[r * K + k] ^ fa) << 8 * (k % 4);
    }
}

/* Batch bt's a packed (and as int16 for AVX2: each lane's 4 codes widened) with off[m]; b's column sums as offp[n].
   Compiled once per ISA (prep_*) so the sums vectorize as wide as the CPU allows. */
static inline __attribute__((always_inline))
void prep_body(const MArgs *g, const MLayout *l, uint8_t *s, int64_t bt, int isa) {
    const int64_t M = g->M, N = g->N, K = g->K, MB = (M + QR - 1) / QR, K4 = (K + 3) / 4;
    const uint8_t *A = (const uint8_t *)(intptr_t)g->a + bt * M * K;
    const uint8_t *B = (const uint8_t *)(intptr_t)g->b + bt * K * N;
    uint32_t *w = (uint32_t *)(s + l->apack) + bt * MB * K4 * QR;
    int32_t *off = (int32_t *)(s + l->off) + bt * MB * QR, *offp = (int32_t *)(s + l->offp) + bt * N;
    const uint8_t fa = (uint8_t)g->a_flip, fb = (uint8_t)g->b_flip;
    pack_a(A, M, K, fa, w);
    if (isa == ISA_AVX2) {
        int16_t *w2 = (int16_t *)(s + l->apack16) + bt * MB * K4 * QR * 4;
        for (int64_t i = 0; i < MB * K4 * QR; i++) {
            const uint32_t v = w[i];
            for (int e = 0; e < 4; e++) w2[4 * i + e] = (int8_t)(v >> 8 * e);
        }
    }
    const uint32_t kzz = (uint32_t)(K * g->az_s * g->bz_u);
    for (int64_t m = 0; m < MB * QR; m++) {
        int32_t ra = 0;
        if (m < M) for (int64_t k = 0; k < K; k++) ra += (int8_t)(A[m * K + k] ^ fa);
        off[m] = (int32_t)(kzz - (uint32_t)g->bz_u * (uint32_t)ra);
    }
    for (int64_t n = 0; n < N; n++) offp[n] = 0;
    if (g->trans_b)
        for (int64_t n = 0; n < N; n++) {
            int32_t c = 0;
            for (int64_t k = 0; k < K; k++) c += (uint8_t)(B[n * K + k] ^ fb);
            offp[n] = c;
        }
    else
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) offp[n] += (uint8_t)(B[k * N + n] ^ fb);
    const int32_t *bias = (const int32_t *)(intptr_t)g->bias;
    for (int64_t n = 0; n < N; n++)
        offp[n] = (int32_t)((bias ? (uint32_t)bias[n] : 0u) - (uint32_t)g->az_s * (uint32_t)offp[n]);
}

static void prep_c(const MArgs *g, const MLayout *l, uint8_t *s, int64_t bt) { prep_body(g, l, s, bt, ISA_C); }
#ifdef QC_X86
static AVX2 void prep_avx2(const MArgs *g, const MLayout *l, uint8_t *s, int64_t bt) {
    prep_body(g, l, s, bt, ISA_AVX2);
}
static VNNI void prep_vnni(const MArgs *g, const MLayout *l, uint8_t *s, int64_t bt) {
    prep_body(g, l, s, bt, ISA_VNNI);
}
#endif

static void mm_prepare_batch(const MArgs *g, const MLayout *l, uint8_t *s, int64_t bt, int isa) {
#ifdef QC_X86
    if (isa >= ISA_VNNI) { prep_vnni(g, l, s, bt); return; }
    if (isa == ISA_AVX2) { prep_avx2(g, l, s, bt); return; }
#endif
    prep_c(g, l, s, bt);
}

/* Work item (batch bt, block of BLOCK columns, group g of the row tiles): its panel built into this thread's buffer
   unless held already (*built), then the tiles. q: qconv's arguments for this product (see qmatmul). */
static void mm_item(const MArgs *g, const MLayout *l, uint8_t *s, QArgs q, uint8_t *pb, int64_t it, int64_t groups,
                    int isa, int64_t *built) {
    const int64_t M = g->M, N = g->N, K = g->K, MB = (M + QR - 1) / QR, K4 = q.K4, nblocks = (N + BLOCK - 1) / BLOCK;
    const int64_t bt = it / (nblocks * groups), blk = it / groups % nblocks, grp = it % groups;
    const int64_t left = N - blk * BLOCK;
    const int nblock = left < BLOCK ? (int)left : BLOCK;
    const uint8_t *B = (const uint8_t *)(intptr_t)g->b + bt * K * N;
    q.w = (int64_t)(intptr_t)((uint32_t *)(s + l->apack) + bt * MB * K4 * QR);
    q.w2 = (int64_t)(intptr_t)((int16_t *)(s + l->apack16) + bt * MB * K4 * QR * 4);
    q.off = (int64_t)(intptr_t)((int32_t *)(s + l->off) + bt * MB * QR);
    q.offp = (int64_t)(intptr_t)((int32_t *)(s + l->offp) + bt * N);
    const size_t esize = g->out == OUT_I32 || g->out == OUT_F32 ? 4 : 1;
    const Job job = {&q, pb, (char *)(intptr_t)g->y + bt * M * N * (int64_t)esize, N};
    if (*built != bt * nblocks + blk) {
        *built = bt * nblocks + blk;
        const uint32_t f4 = (uint32_t)g->b_flip * 0x01010101u;
        const uint8_t *fill = s + l->fill;
        if (g->trans_b) panel_rows(B, K, K4, K, (uint8_t)g->b_flip, pb, blk * BLOCK, nblock);
#ifdef QC_X86
        else if (isa >= ISA_VNNI) panel_vnni(&q, B, fill, f4, pb, blk * BLOCK, nblock);
        else if (isa == ISA_AVX2) panel_avx2(&q, B, fill, f4, pb, blk * BLOCK, nblock);
#endif
        else panel_c(&q, B, fill, f4, pb, blk * BLOCK, nblock);
    }
    for (int64_t nb = grp * MB / groups; nb < (grp + 1) * MB / groups; nb++)
        for (int sub = 0; sub * PANEL < nblock; sub++) {
            const int64_t panel = blk * (BLOCK / PANEL) + sub;
            const int np = nblock - sub * PANEL < PANEL ? nblock - sub * PANEL : PANEL;
#ifdef QC_X86
            if (isa >= ISA_VNNI) { tile_vnni(&job, nb, panel, np); continue; }
            if (isa == ISA_AVX2) { tile_avx2(&job, nb, panel, np); continue; }
#endif
            tile_c(&job, nb, panel, np);
        }
}

/* One call: every batch. 0, -1 when the scratch is too small, -2 for arguments out of range. */
static int qmatmul(const MArgs *g) {
    if (g->out < OUT_U8 || g->out > OUT_F32 || (g->a_flip != 0 && g->a_flip != 0x80)
        || (g->b_flip != 0 && g->b_flip != 0x80) || g->az_s < -255 || g->az_s > 255 || g->bz_u < 0 || g->bz_u > 255)
        return -2;
    int isa = (int)g->isa, nthreads = g->nthreads < 1 ? 1 : (int)g->nthreads;
    if (isa > qconv_isa()) isa = qconv_isa();
    if (isa < ISA_C) isa = ISA_C;
    const int64_t need = qmatmul_scratch_bytes(g->batch, g->M, g->N, g->K, nthreads, isa);
    if (need < 0) return -2;
    if (need > g->scratch_bytes) return -1;
    const MLayout l = mm_layout(g->batch, g->M, g->N, g->K, nthreads, isa);
    const int64_t M = g->M, N = g->N, K = g->K, MB = (M + QR - 1) / QR, nblocks = (N + BLOCK - 1) / BLOCK;
    uint8_t *s = (uint8_t *)(intptr_t)g->scratch;
    for (int64_t m = 0; m < MB * QR; m++) ((float *)(s + l.mvec))[m] = (float)g->m;
    memset(s + l.fill, 0, (size_t)N);
    /* b [K][N] read as a 1 x N image of K channels, 1x1 kernel: qconv's panel builders take it as it is */
    const QArgs q = {.x = g->b, .batch = 1, .C = K, .H = 1, .W = N, .xs_b = K * N, .xs_c = N, .xs_h = N, .xs_w = 1,
                     .flip = g->b_flip, .zp_u = 0, .kh = 1, .kw = 1, .sh = 1, .sw = 1, .ph = 0, .pw = 0, .dh = 1,
                     .dw = 1, .OH = 1, .OW = N, .N = M, .K4 = (K + 3) / 4, .m = (int64_t)(intptr_t)(s + l.mvec),
                     .y = g->y, .ys_b = M * N, .ys_n = N, .ys_p = 1, .out = g->out, .relu = g->relu, .zp = g->zp,
                     .lo = g->lo, .hi = g->hi};
    if ((double)g->batch * M * N * K <= 262144.0) nthreads = 1;      /* small: no parallel region */
#ifndef _OPENMP
    nthreads = 1;
#endif
    int64_t groups = 1;                                 /* about 4 items a thread: a few batches split by rows */
    while (nthreads > 1 && g->batch * nblocks * groups < 4 * (int64_t)nthreads && groups * 2 <= MB) groups *= 2;
    const int64_t items = g->batch * nblocks * groups;
    if (nthreads <= 1) {
        int64_t built = -1;
        for (int64_t bt = 0; bt < g->batch; bt++) mm_prepare_batch(g, &l, s, bt, isa);
        for (int64_t it = 0; it < items; it++) mm_item(g, &l, s, q, s + l.panels, it, groups, isa, &built);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads)
    {
        uint8_t *pb = s + l.panels + (int64_t)omp_get_thread_num() * panel_bytes(q.K4);
        int64_t built = -1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t bt = 0; bt < g->batch; bt++) mm_prepare_batch(g, &l, s, bt, isa);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) mm_item(g, &l, s, q, pb, it, groups, isa, &built);
    }
#endif
    return 0;
}

int qmatmul_isa(void) { return qconv_isa(); }
int qmatmul_openmp(void) { return qconv_openmp(); }

/* qmatmul() with its arguments in one block (_ARGS in cpu_qmatmul.py). */
int qmatmul_packed(const void *block) {
    MArgs a;
    memcpy(&a, block, sizeof a);                        /* a Python bytes object: no alignment promised */
    return qmatmul(&a);
}
