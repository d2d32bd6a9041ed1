/* int8 convolution and GEMM of the CPU backend: y = requantize(sum (x - x_zp) * w + bias), bit-exact with QCONV/QGEMM.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (open_library: the same compiler, flags and
   cache as gemv.c) and called through ctypes by cpu_qconv.py, whose docstring explains the design. The Python
   side checks every pointer and size before a call and proves at prepare time that no int32 sum can overflow:
   this code trusts both. Keep in step with cpu_qconv.py: the argument block (QArgs / _ARGS), the output codes,
   the packed weight layouts (QR, and the AVX2 pair order) and the scratch size (scratch_bytes).

   Plan: per image, x's codes are copied once with a border of the zero point (int8 x made unsigned by flipping its
   sign bit: x + 128; a 1x1 convolution reads x itself), then laid out as an im2col matrix of groups of 4 k,
   [K4][Ppad][4] uint8 (k = c * kh * kw + i * kw + j, as OIHW weights flatten; k padded to a multiple of 4; Ppad: P
   rounded up to the tile's 32 positions; a position outside the image reads the zero point, so the zero-point
   correction is one constant per channel). The weights come packed at prepare time as [N / QR][K4][QR]
   int32 lanes of 4 consecutive k (VNNI, C) and as pairs of int16 (k0, k2), (k1, k3) per lane (AVX2). A tile is
   QR output channels x 16 or 32 positions; its int32 sums are exact (unsigned x times signed w: vpdpbusd adds
   groups of 4 products into int32 without saturation; AVX2 widens to int16 and uses madd, so nothing saturates).
   The epilogue adds off[n] = bias[n] - x_zp_u * sum w[n] (wrapping adds: the result fits, Python checked) and then
   does exactly the reference's float steps: float32(acc) * m[n], rint (ties to even, the default rounding mode),
   + zp, max(lo), min(hi) (lo raised to zp for a fused relu by the caller), or float32(acc) * m[n] for a float
   output, or acc itself for int32. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define QC_X86 1
#endif

enum { ISA_C = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };
enum { OUT_U8 = 0, OUT_I8 = 1, OUT_I32 = 2, OUT_F32 = 3 };
#define QR 8       /* output channels per tile */
#define PANEL 32   /* output positions per tile: a panel of the im2col matrix */

/* qconv_packed's argument block: 33 int64 then 4 doubles (_ARGS in cpu_qconv.py). */
typedef struct {
    int64_t x, batch, C, H, W, xs_b, xs_c, xs_h, xs_w, flip, zp_u;  /* input: strides in elements */
    int64_t kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
    int64_t w, w2, N, K4, off, m;                                   /* packed weights, per-channel terms */
    int64_t y, ys_b, ys_n, ys_p, out;                               /* output: strides in elements */
    int64_t scratch, scratch_bytes, nthreads, isa, relu;
    double zp, lo, hi, unused;
} QArgs;

typedef struct {
    const QArgs *a;
    const uint8_t *b;   /* this image's im2col groups, [K4][Ppad][4] */
    char *y;            /* this image's output */
    int64_t P, row;     /* positions; bytes from one group of 4 k to the next (positions padded to PANEL, x4) */
} Job;

/* ------------------------------------------------------------------------------------------ im2col */

typedef uint32_t u32_unaligned __attribute__((aligned(1), may_alias));

/* Channel c of x as unsigned codes (sign bit flipped for int8 x) into a copy bordered by the zero point,
   [C][Hp][Wp] with Hp = H + 2 ph, Wp = W + 2 pw: im2col then reads it without a bounds check. */
static void pad_channel(const QArgs *a, const uint8_t *x, uint8_t *xp, int64_t c) {
    const int64_t Hp = a->H + 2 * a->ph, Wp = a->W + 2 * a->pw, W = a->W;
    const uint8_t fill = (uint8_t)a->zp_u, flip = (uint8_t)a->flip;
    uint8_t *dst = xp + c * Hp * Wp;
    memset(dst, fill, (size_t)(a->ph * Wp));
    if (a->pw == 0 && a->xs_w == 1 && a->xs_h == W) {   /* rows without a border: the channel in one loop */
        const uint8_t *src = x + c * a->xs_c;
        uint8_t *r = dst + a->ph * Wp;
        for (int64_t e = 0; e < a->H * W; e++) r[e] = (uint8_t)(src[e] ^ flip);
        memset(dst + (a->ph + a->H) * Wp, fill, (size_t)(a->ph * Wp));
        return;
    }
    for (int64_t h = 0; h < a->H; h++) {
        uint8_t *r = dst + (h + a->ph) * Wp;
        const uint8_t *src = x + c * a->xs_c + h * a->xs_h;
        memset(r, fill, (size_t)a->pw);
        if (a->xs_w == 1) for (int64_t w = 0; w < W; w++) r[a->pw + w] = (uint8_t)(src[w] ^ flip);
        else for (int64_t w = 0; w < W; w++) r[a->pw + w] = (uint8_t)(src[w * a->xs_w] ^ flip);
        memset(r + a->pw + W, fill, (size_t)a->pw);
    }
    memset(dst + (a->ph + a->H) * Wp, fill, (size_t)(a->ph * Wp));
}

/* The 4-byte groups of k4 (rows 4 * k4 .. 4 * k4 + 3 of the im2col matrix) for every position: position p's group at
   (k4 * Ppad + p) * 4, Ppad = P rounded up to PANEL (a tile reads PANEL positions of each k4 group).
   xp: the bordered copy (flip 0), or x itself when it needs no border (flip: int8 x's sign bits). A padding row
   k >= K meets zero weights: it reads `fill` (Wp bytes), whatever they become. */
static void im2col_k4(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b,
                      int64_t k4) {
    const int64_t Hp = a->H + 2 * a->ph, Wp = a->W + 2 * a->pw, khw = a->kh * a->kw, OW = a->OW, sw = a->sw;
    const uint8_t *base[4];
    int64_t step[4];
    for (int s = 0; s < 4; s++) {
        const int64_t k = 4 * k4 + s, c = k / khw, i = (k / a->kw) % a->kh, j = k % a->kw;
        const int real = k < a->C * khw;
        base[s] = real ? xp + c * Hp * Wp + i * a->dh * Wp + j * a->dw : fill;
        step[s] = real ? a->sh * Wp : 0;
    }
    const int64_t Ppad = (a->OH * OW + PANEL - 1) / PANEL * PANEL;
    for (int64_t oh = 0; oh < a->OH; oh++) {
        const uint8_t *r0 = base[0] + oh * step[0], *r1 = base[1] + oh * step[1];
        const uint8_t *r2 = base[2] + oh * step[2], *r3 = base[3] + oh * step[3];
        u32_unaligned *d = (u32_unaligned *)(b + (k4 * Ppad + oh * OW) * 4);
        if (sw == 1)                                    /* contiguous: vectorized */
            for (int64_t e = 0; e < OW; e++)
                d[e] = ((uint32_t)r0[e] | (uint32_t)r1[e] << 8 | (uint32_t)r2[e] << 16 | (uint32_t)r3[e] << 24) ^ flip;
        else
            for (int64_t e = 0; e < OW; e++)
                d[e] = ((uint32_t)r0[e * sw] | (uint32_t)r1[e * sw] << 8 | (uint32_t)r2[e * sw] << 16
                        | (uint32_t)r3[e * sw] << 24) ^ flip;
    }
}

/* ---------------------------------------------------------------------------------------- epilogue */

static inline void store_one(const Job *j, int64_t n, int64_t p, int32_t acc) {
    const QArgs *a = j->a;
    const int32_t v = (int32_t)((uint32_t)acc + (uint32_t)((const int32_t *)(intptr_t)a->off)[n]);
    const float mn = ((const float *)(intptr_t)a->m)[n];
    const int64_t at = n * a->ys_n + p * a->ys_p;
    if (a->out == OUT_I32) { ((int32_t *)j->y)[at] = v; return; }
    float f = (float)v * mn;
    if (a->out == OUT_F32) { ((float *)j->y)[at] = (a->relu && f < 0.0f) ? 0.0f : f; return; }
    f = rintf(f) + (float)a->zp;
    f = f < (float)a->lo ? (float)a->lo : f;
    f = f > (float)a->hi ? (float)a->hi : f;
    if (a->out == OUT_U8) ((uint8_t *)j->y)[at] = (uint8_t)(int32_t)f;
    else ((int8_t *)j->y)[at] = (int8_t)(int32_t)f;
}

/* A tile's sums, acc[r][PANEL], to the output: rows n0.., positions p0.. (those inside N and P). */
static void store_tile(const Job *j, int64_t n0, int64_t p0, const int32_t acc[QR][PANEL], int np) {
    const int64_t N = j->a->N;
    for (int r = 0; r < QR && n0 + r < N; r++)
        for (int q = 0; q < np && p0 + q < j->P; q++) store_one(j, n0 + r, p0 + q, acc[r][q]);
}

/* ------------------------------------------------------------------------------------- portable C */

static void tile_c(const Job *j, int64_t nb, int64_t panel, int np) {
    const QArgs *a = j->a;
    const int64_t K4 = a->K4;
    const int8_t *w = (const int8_t *)(intptr_t)a->w + nb * K4 * QR * 4;
    const uint8_t *b = j->b + panel * PANEL * 4;
    int32_t acc[QR][PANEL];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < K4; k++) {
        const uint8_t *bk = b + k * j->row;
        for (int r = 0; r < QR; r++) {
            const int8_t *wr = w + (k * QR + r) * 4;
            for (int q = 0; q < PANEL; q++)
                acc[r][q] += bk[q * 4] * wr[0] + bk[q * 4 + 1] * wr[1] + bk[q * 4 + 2] * wr[2] + bk[q * 4 + 3] * wr[3];
        }
    }
    store_tile(j, nb * QR, panel * PANEL, (const int32_t (*)[PANEL])acc, np);
}

#ifdef QC_X86
#define AVX2 __attribute__((target("avx2,fma")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

/* ------------------------------------------------------------------------------------------- AVX2 */

/* 16 values of row n from position p: the vector form of store_one (8 lanes twice). */
static inline AVX2 void store8_avx2(const Job *j, int64_t n, int64_t p, __m256i acc, int np) {
    const QArgs *a = j->a;
    if (a->ys_p != 1 || np < 8 || a->out == OUT_F32) {   /* strided (QGEMM) or a tail: one by one */
        int32_t t[8];
        _mm256_storeu_si256((__m256i *)t, acc);
        for (int q = 0; q < np && q < 8; q++) store_one(j, n, p + q, t[q]);
        return;
    }
    const __m256i v = _mm256_add_epi32(acc, _mm256_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    const int64_t at = n * a->ys_n + p;
    if (a->out == OUT_I32) { _mm256_storeu_si256((__m256i *)((int32_t *)j->y + at), v); return; }
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(((const float *)(intptr_t)a->m)[n]));
    f = _mm256_add_ps(_mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm256_set1_ps((float)a->zp));
    f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps((float)a->lo)), _mm256_set1_ps((float)a->hi));
    const __m256i i = _mm256_cvtps_epi32(f);            /* in [lo, hi]: its low byte is the code */
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    const __m128i b8 = a->out == OUT_U8 ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
    _mm_storel_epi64((__m128i *)((int8_t *)j->y + at), b8);
}

/* 4 rows x 16 positions (two vectors of 8): x's bytes split into int16 (k0, k2) and (k1, k3), each pair times the
   weights' int16 pair by madd (at most 2 * 255 * 128: no saturation). */
static inline AVX2 void rows4_avx2(const Job *j, int64_t nb, int64_t panel, int r0, int half, int np) {
    const QArgs *a = j->a;
    const int64_t K4 = a->K4;
    const int32_t *w = (const int32_t *)(intptr_t)a->w2 + nb * K4 * QR * 2;
    const uint8_t *b = j->b + panel * PANEL * 4 + half * 64;
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    __m256i acc[4][2];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < K4; k++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + k * j->row));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + k * j->row + 32));
        const __m256i e0 = _mm256_and_si256(v0, lo8), o0 = _mm256_srli_epi16(v0, 8);
        const __m256i e1 = _mm256_and_si256(v1, lo8), o1 = _mm256_srli_epi16(v1, 8);
        const int32_t *wk = w + (k * QR + r0) * 2;
        for (int r = 0; r < 4; r++) {
            const __m256i we = _mm256_set1_epi32(wk[2 * r]), wo = _mm256_set1_epi32(wk[2 * r + 1]);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_add_epi32(_mm256_madd_epi16(e0, we),
                                                                     _mm256_madd_epi16(o0, wo)));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_add_epi32(_mm256_madd_epi16(e1, we),
                                                                     _mm256_madd_epi16(o1, wo)));
        }
    }
    const int64_t n0 = nb * QR + r0, p0 = panel * PANEL + half * 16;
    for (int r = 0; r < 4 && n0 + r < a->N; r++) {
        store8_avx2(j, n0 + r, p0, acc[r][0], np);
        if (np > 8) store8_avx2(j, n0 + r, p0 + 8, acc[r][1], np - 8);
    }
}

static AVX2 void tile_avx2(const Job *j, int64_t nb, int64_t panel, int np) {
    for (int half = 0; half * 16 < np; half++) {
        const int left = np - half * 16 < 16 ? np - half * 16 : 16;
        rows4_avx2(j, nb, panel, 0, half, left);
        if (nb * QR + 4 < j->a->N) rows4_avx2(j, nb, panel, 4, half, left);
    }
}

/* ------------------------------------------------------------------------------------ AVX-512 VNNI */

static inline VNNI void store16_vnni(const Job *j, int64_t n, int64_t p, __m512i acc, int np) {
    const QArgs *a = j->a;
    if (a->ys_p != 1 || a->out == OUT_F32) {
        int32_t t[16];
        _mm512_storeu_si512(t, acc);
        for (int q = 0; q < np && q < 16; q++) store_one(j, n, p + q, t[q]);
        return;
    }
    const __mmask16 mask = np >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << np) - 1u);
    const __m512i v = _mm512_add_epi32(acc, _mm512_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    const int64_t at = n * a->ys_n + p;
    if (a->out == OUT_I32) { _mm512_mask_storeu_epi32((int32_t *)j->y + at, mask, v); return; }
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(((const float *)(intptr_t)a->m)[n]));
    f = _mm512_add_ps(_mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                      _mm512_set1_ps((float)a->zp));
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps((float)a->lo)), _mm512_set1_ps((float)a->hi));
    _mm512_mask_cvtepi32_storeu_epi8((int8_t *)j->y + at, mask, _mm512_cvtps_epi32(f));  /* in range: low byte */
}

/* QR rows x 16 * J positions; J is a constant in each caller, so the loops unroll into registers. */
static inline __attribute__((always_inline)) VNNI
void tile_vnni_j(const Job *j, int64_t nb, int64_t panel, int np, const int J) {
    const QArgs *a = j->a;
    const int64_t K4 = a->K4;
    const int32_t *w = (const int32_t *)(intptr_t)a->w + nb * K4 * QR;
    const uint8_t *b = j->b + panel * PANEL * 4;
    __m512i acc[QR][2];
    for (int r = 0; r < QR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int64_t k = 0; k < K4; k++) {
        const __m512i b0 = _mm512_loadu_si512(b + k * j->row);
        const __m512i b1 = J > 1 ? _mm512_loadu_si512(b + k * j->row + 64) : b0;
        const int32_t *wk = w + k * QR;
        for (int r = 0; r < QR; r++) {
            const __m512i wr = _mm512_set1_epi32(wk[r]);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b0, wr);
            if (J > 1) acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b1, wr);
        }
    }
    const int64_t n0 = nb * QR, p0 = panel * PANEL;
    for (int r = 0; r < QR && n0 + r < a->N; r++) {
        store16_vnni(j, n0 + r, p0, acc[r][0], np);
        if (J > 1) store16_vnni(j, n0 + r, p0 + 16, acc[r][1], np - 16);
    }
}

static VNNI void tile_vnni(const Job *j, int64_t nb, int64_t panel, int np) {
    if (np > 16) tile_vnni_j(j, nb, panel, np, 2);
    else tile_vnni_j(j, nb, panel, np, 1);
}
#endif

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

/* Scratch bytes one image needs: its im2col groups, then x's bordered copy and a row of the zero point
   (cpu_qconv.scratch_bytes is the same rule). */
static int64_t groups_bytes(int64_t K4, int64_t P) { return ((P + PANEL - 1) / PANEL) * K4 * PANEL * 4; }
int64_t qconv_scratch_bytes(int64_t K4, int64_t P, int64_t C, int64_t Hp, int64_t Wp) {
    return groups_bytes(K4, P) + C * Hp * Wp + Wp;
}

static void run_tile(const Job *j, int64_t t, int64_t nbs, int isa) {
    const int64_t panel = t / nbs, nb = t % nbs;
    const int64_t left = j->P - panel * PANEL;
    const int np = left < PANEL ? (int)left : PANEL;
#ifdef QC_X86
    if (isa >= ISA_VNNI) { tile_vnni(j, nb, panel, np); return; }
    if (isa == ISA_AVX2) { tile_avx2(j, nb, panel, np); return; }
#endif
    (void)isa;
    tile_c(j, nb, panel, np);
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
    if (qconv_scratch_bytes(a->K4, P, a->C, Hp, Wp) > a->scratch_bytes) return -1;
    int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads, isa = (int)a->isa;
    if (isa > qconv_isa()) isa = qconv_isa();
    const int64_t nbs = (a->N + QR - 1) / QR, panels = (P + PANEL - 1) / PANEL, tiles = nbs * panels;
    const size_t esize = a->out == OUT_I32 || a->out == OUT_F32 ? 4 : 1;
    uint8_t *b = (uint8_t *)(intptr_t)a->scratch, *xp = b + groups_bytes(a->K4, P), *fill = xp + a->C * Hp * Wp;
    memset(fill, (uint8_t)a->zp_u, (size_t)Wp);
    /* no border and x contiguous (a 1x1 convolution, say): im2col reads x itself, flipping int8 x's sign bits */
    const int direct = a->ph == 0 && a->pw == 0 && a->xs_w == 1 && a->xs_h == a->W && a->xs_c == a->H * a->W;
    const uint32_t flip = direct ? (uint32_t)a->flip * 0x01010101u : 0u;
    const int64_t C = direct ? 0 : a->C;                /* channels to copy */
    for (int64_t im = 0; im < a->batch; im++) {
        const uint8_t *x = (const uint8_t *)(intptr_t)a->x + im * a->xs_b, *src = direct ? x : xp;
        const Job job = {a, b, (char *)(intptr_t)a->y + im * a->ys_b * (int64_t)esize, P, panels * PANEL * 4};
        if (nthreads <= 1 || tiles * K <= 65536) {      /* a small product: no parallel region (~1 us each) */
            for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
            for (int64_t k = 0; k < a->K4; k++) im2col_k4(a, src, fill, flip, b, k);
            for (int64_t t = 0; t < tiles; t++) run_tile(&job, t, nbs, isa);
            continue;
        }
#ifdef _OPENMP
        /* dynamic chunks of tiles (about 8 a thread, inside one panel where they fit, so a thread reuses the panel
           it loaded): a thread that lost its core to a neighbour process leaves its share to the others */
        int64_t chunk = tiles / (8 * (int64_t)nthreads);
        chunk = chunk < 1 ? 1 : (chunk > nbs ? nbs : chunk);
#pragma omp parallel num_threads(nthreads)
        {
#pragma omp for schedule(dynamic, 4)
            for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
#pragma omp for schedule(dynamic, 1)
            for (int64_t k = 0; k < a->K4; k++) im2col_k4(a, src, fill, flip, b, k);
#pragma omp for schedule(dynamic, chunk)
            for (int64_t t = 0; t < tiles; t++) run_tile(&job, t, nbs, isa);
        }
#else
        for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
        for (int64_t k = 0; k < a->K4; k++) im2col_k4(a, src, fill, flip, b, k);
        for (int64_t t = 0; t < tiles; t++) run_tile(&job, t, nbs, isa);
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
