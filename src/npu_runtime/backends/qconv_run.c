/* The driver of qconv.c's kernels: ISA detection, the scratch rule, and one call's loop over images, panels and
   channel tiles (threads by OpenMP). Appended to qconv.c into one translation unit (cpu_qconv.SOURCES); split off
   so each file stays readable. */

/* ------------------------------------------------------------------------------------------ driver */

/* 2: AVX-512 F/BW/VNNI, 1: AVX2, 0: portable C; libgcc checks the OS saves the registers (xgetbv). */
int qconv_isa(void) {
#ifdef QC_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni")) return ISA_VNNI;
    return avx2 ? ISA_AVX2 : ISA_C;
#else
    return ISA_C;
#endif
}

#ifdef _OPENMP
int qconv_openmp(void) { return 1; }
#else
int qconv_openmp(void) { return 0; }
#endif

/* Scratch bytes one call needs: one im2col panel per thread, then x's bordered copy and a row of the zero point
   (cpu_qconv.scratch_bytes is the same rule). */
static int64_t panel_bytes(int64_t K4) { return K4 * BLOCK * 4; }
int64_t qconv_scratch_bytes(int64_t K4, int64_t C, int64_t Hp, int64_t Wp, int64_t nthreads) {
    return (nthreads < 1 ? 1 : nthreads) * panel_bytes(K4) + C * Hp * Wp + Wp;
}

static void panel_c(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b, int64_t p0,
                    int np) { panel_body(a, xp, fill, flip, b, p0, np, ISA_C); }
#ifdef QC_X86
static AVX2 void panel_avx2(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b,
                            int64_t p0, int np) { panel_body(a, xp, fill, flip, b, p0, np, ISA_AVX2); }
static VNNI void panel_vnni(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b,
                            int64_t p0, int np) { panel_body(a, xp, fill, flip, b, p0, np, ISA_VNNI); }
#endif

/* Work item `it` of `groups` per panel: the panel built into this thread's buffer (job->b) unless it holds it
   already (*built: the panel it holds, -1 none), then its share of the channel tiles (all of them when groups is
   1; a small image's panel split in groups keeps both threads busy, each building it once). */
static void run_item(const Job *job, const uint8_t *src, const uint8_t *fill, uint32_t flip, int64_t it,
                     int64_t groups, int isa, int64_t *built, int rows) {
    const QArgs *a = job->a;
    const int64_t block = it / groups, g = it % groups, nbs = (a->N + QR - 1) / QR;
    const int64_t left = job->P - block * BLOCK;
    const int nblock = left < BLOCK ? (int)left : BLOCK;
    uint8_t *b = (uint8_t *)job->b;
    if (*built != block) {
        *built = block;
        if (rows) panel_rows(src, a->C, a->K4, a->xs_w, (uint8_t)a->flip, b, block * BLOCK, nblock);
#ifdef QC_X86
        else if (isa >= ISA_VNNI) panel_vnni(a, src, fill, flip, b, block * BLOCK, nblock);
        else if (isa == ISA_AVX2) panel_avx2(a, src, fill, flip, b, block * BLOCK, nblock);
        else
#endif
        panel_c(a, src, fill, flip, b, block * BLOCK, nblock);
    }
    for (int64_t nb = g * nbs / groups; nb < (g + 1) * nbs / groups; nb++)
        for (int sub = 0; sub * PANEL < nblock; sub++) {   /* the channel tile's weights read once per panel */
            const int64_t panel = block * (BLOCK / PANEL) + sub;
            const int np = nblock - sub * PANEL < PANEL ? nblock - sub * PANEL : PANEL;
#ifdef QC_X86
            if (isa >= ISA_VNNI) { tile_vnni(job, nb, panel, np); continue; }
            if (isa == ISA_AVX2) { tile_avx2(job, nb, panel, np); continue; }
#endif
            tile_c(job, nb, panel, np);
        }
}

/* One call: every image of the batch. 0, -1 when the scratch is too small, -2 for arguments out of range. */
static int qconv(const QArgs *a) {
    const int64_t P = a->OH * a->OW, K = a->C * a->kh * a->kw;
    if (a->batch < 0 || P < 0 || a->N <= 0 || K <= 0 || a->K4 * 4 < K || a->K4 * 4 >= K + 4) return -2;
    if (a->out < OUT_U8 || a->out > OUT_F32) return -2;
    const int64_t Hp = a->H + 2 * a->ph, Wp = a->W + 2 * a->pw;
    if (a->sh < 1 || a->sw < 1 || a->dh < 1 || a->dw < 1 || a->ph < 0 || a->pw < 0 || a->OH < 1 || a->OW < 1
        || (a->OH - 1) * a->sh + (a->kh - 1) * a->dh >= Hp || (a->OW - 1) * a->sw + (a->kw - 1) * a->dw >= Wp)
        return -2;                                      /* a window would leave the bordered copy */
    if (a->nthreads > 65536) return -2;                 /* an int, and one scratch panel each */
    int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads, isa = (int)a->isa;
    if (qconv_scratch_bytes(a->K4, a->C, Hp, Wp, nthreads) > a->scratch_bytes) return -1;
    if (isa > qconv_isa()) isa = qconv_isa();
    const int64_t nbs = (a->N + QR - 1) / QR, panels = (P + BLOCK - 1) / BLOCK;
    const size_t esize = a->out == OUT_I32 || a->out == OUT_F32 ? 4 : 1;
    uint8_t *b = (uint8_t *)(intptr_t)a->scratch, *xp = b + nthreads * panel_bytes(a->K4);
    uint8_t *fill = xp + a->C * Hp * Wp;
    memset(fill, (uint8_t)a->zp_u, (size_t)Wp);
    /* no border and x contiguous (a 1x1 convolution, say): im2col reads x itself, flipping int8 x's sign bits */
    const int direct = a->ph == 0 && a->pw == 0 && a->xs_w == 1 && a->xs_h == a->W && a->xs_c == a->H * a->W;
    /* a QGEMM's x, a row of C contiguous codes per position (1x1 window over one image row): panel_rows reads x */
    const int rows = !direct && a->kh == 1 && a->kw == 1 && a->H == 1 && a->OH == 1 && a->ph == 0 && a->pw == 0
                     && a->sw == 1 && a->xs_c == 1 && a->xs_w >= a->C;
    const uint32_t flip = direct ? (uint32_t)a->flip * 0x01010101u : 0u;
    const int64_t C = direct || rows ? 0 : a->C;        /* channels to copy */
    /* small: no parallel region. The count is MACs / 256, so 8192 is ~2M MACs, ~15 us on one thread: a region costs a
       few us. (At 65536, a 64 -> 64 channel 1x1 convolution of 56x56 ran 114 us on one thread, 60 on two.) */
    if (nthreads > 1 && nbs * panels * (BLOCK / PANEL) * K <= 8192) nthreads = 1;
#ifndef _OPENMP
    nthreads = 1;
#endif
    /* items: panels, each split into channel groups until there are about 4 a thread (a 7x7 image has 1 panel) */
    int64_t groups = 1;
    while (nthreads > 1 && panels * groups < 4 * (int64_t)nthreads && groups * 2 <= nbs) groups *= 2;
    const int64_t items = panels * groups;
    for (int64_t im = 0; im < a->batch; im++) {
        const uint8_t *x = (const uint8_t *)(intptr_t)a->x + im * a->xs_b, *src = direct || rows ? x : xp;
        Job job = {a, b, (char *)(intptr_t)a->y + im * a->ys_b * (int64_t)esize, P};
        if (nthreads <= 1) {
            int64_t built = -1;
            for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
            for (int64_t it = 0; it < items; it++) run_item(&job, src, fill, flip, it, groups, isa, &built, rows);
            continue;
        }
#ifdef _OPENMP
        /* dynamic items: a thread that lost its core to a neighbour process leaves its share to the others; each
           thread builds its panels in its own buffer (team size <= nthreads, so the buffers suffice) */
#pragma omp parallel num_threads(nthreads) firstprivate(job)
        {
            job.b = b + (int64_t)omp_get_thread_num() * panel_bytes(a->K4);
            int64_t built = -1;
#pragma omp for schedule(dynamic, 4)
            for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < items; it++) run_item(&job, src, fill, flip, it, groups, isa, &built, rows);
        }
#endif
    }
    return 0;
}

/* qconv() with its arguments in one block (_ARGS in cpu_qconv.py): one ctypes argument is cheaper. */
int qconv_packed(const void *block) {
    QArgs a;
    memcpy(&a, block, sizeof a);                        /* a Python bytes object: no alignment promised */
    return qconv(&a);
}
