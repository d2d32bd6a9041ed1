/* int8 convolution and GEMM of the CPU backend: y = requantize(sum (x - x_zp) * w + bias), bit-exact with QCONV/QGEMM.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (open_library: the same compiler, flags and
   cache as gemv.c) and called through ctypes by cpu_qconv.py, whose docstring explains the design. The Python
   side checks every pointer and size before a call and proves at prepare time that no int32 sum can overflow:
   this code trusts both. Keep in step with cpu_qconv.py: the argument block (QArgs / _ARGS), the output codes,
   the packed weight layouts (QR, and the AVX2 pair order) and the scratch size (scratch_bytes).

   Plan: per image, x's codes are copied once with a border of the zero point (int8 x made unsigned by flipping its
   sign bit: x + 128; a 1x1 convolution reads x itself). The threads then take panels of BLOCK output positions: a
   thread lays its panel out as im2col groups of 4 k, [K4][BLOCK][4] uint8 in its own scratch buffer (k = c * kh * kw
   + i * kw + j, as OIHW weights flatten; k padded to a multiple of 4; a position outside the image reads the zero
   point, so the zero-point correction is one constant per channel), and at once runs every output-channel tile
   over it, so the panel is read from L1/L2 and both threads build panels in parallel. The weights come packed at
   prepare time as [N / QR][K4][QR] int32 lanes of 4 consecutive k (VNNI, C) and as pairs of int16 (k0, k2),
   (k1, k3) per lane (AVX2). A tile is
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
#define AVX2 __attribute__((target("avx2,fma")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))
#endif

enum { ISA_C = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };
enum { OUT_U8 = 0, OUT_I8 = 1, OUT_I32 = 2, OUT_F32 = 3 };
#define QR 8       /* output channels per tile */
#define PANEL 32   /* output positions per tile */
#define BLOCK 64   /* output positions a thread lays out at once (BLOCK / PANEL tiles): its im2col panel */
#define ROW (BLOCK * 4)  /* bytes from one group of 4 k to the next in the panel: a constant, so loads take offsets */

/* qconv_packed's argument block: 38 int64 then 4 doubles (_ARGS in cpu_qconv.py). offp: an int32 term per output
   position added with off (0: none; qmatmul.c's per-column sums), so the epilogue serves both kernels. */
typedef struct {
    int64_t x, batch, C, H, W, xs_b, xs_c, xs_h, xs_w, flip, zp_u;  /* input: strides in elements */
    int64_t kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
    int64_t w, w2, N, K4, off, m, offp;                             /* packed weights, per-channel terms */
    int64_t y, ys_b, ys_n, ys_p, out;                               /* output: strides in elements */
    int64_t scratch, scratch_bytes, nthreads, isa, relu;
    double zp, lo, hi, unused;
} QArgs;

typedef struct {
    const QArgs *a;
    const uint8_t *b;   /* the thread's im2col panel, [K4][BLOCK][4]: a tile reads its PANEL positions of it */
    char *y;            /* this image's output */
    int64_t P;          /* positions */
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

#ifdef QC_X86
/* n <= BLOCK bytes of a row at stride sw (1 or 2) into one vector; a masked load touches only the bytes it keeps
   (the last at (n - 1) * sw). Stride 2 keeps the even bytes of 16-bit words (vpmovwb). */
static inline __attribute__((always_inline)) VNNI __m512i row_bytes(const uint8_t *r, int n, int64_t sw) {
    if (sw == 1) return _mm512_maskz_loadu_epi8(n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1), r);
    const int bytes = 2 * n - 1, hi = bytes - 64;        /* bytes to read, and of them past the first 64 */
    const __m512i w0 = _mm512_maskz_loadu_epi8(bytes >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << bytes) - 1), r);
    const __m512i w1 = hi <= 0 ? _mm512_setzero_si512()
                               : _mm512_maskz_loadu_epi8(((__mmask64)1 << hi) - 1, r + 64);  /* hi <= 63 */
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(w0)), _mm512_cvtepi16_epi8(w1), 1);
}

/* n <= BLOCK positions of 4 rows (stride sw, 1 or 2) as 4-byte groups: bytes interleaved by unpacks within
   128-bit lanes, then the lanes put back in position order; masked stores write only the n groups. */
static VNNI void interleave_vnni(u32_unaligned *d, const uint8_t *r0, const uint8_t *r1, const uint8_t *r2,
                                 const uint8_t *r3, int n, int64_t sw, uint32_t flip) {
    const __m512i a = row_bytes(r0, n, sw), b = row_bytes(r1, n, sw);
    const __m512i c = row_bytes(r2, n, sw), e = row_bytes(r3, n, sw);
    const __m512i ab0 = _mm512_unpacklo_epi8(a, b), ab1 = _mm512_unpackhi_epi8(a, b);
    const __m512i ce0 = _mm512_unpacklo_epi8(c, e), ce1 = _mm512_unpackhi_epi8(c, e);
    const __m512i f = _mm512_set1_epi32((int)flip);
    /* t_i, lane l: positions 16 l + 4 i .. + 3 */
    const __m512i t0 = _mm512_unpacklo_epi16(ab0, ce0), t1 = _mm512_unpackhi_epi16(ab0, ce0);
    const __m512i t2 = _mm512_unpacklo_epi16(ab1, ce1), t3 = _mm512_unpackhi_epi16(ab1, ce1);
    const __m512i u0 = _mm512_shuffle_i32x4(t0, t1, 0x44), u1 = _mm512_shuffle_i32x4(t2, t3, 0x44);
    const __m512i v0 = _mm512_shuffle_i32x4(t0, t1, 0xee), v1 = _mm512_shuffle_i32x4(t2, t3, 0xee);
    const __m512i out[4] = {_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xdd),
                            _mm512_shuffle_i32x4(v0, v1, 0x88), _mm512_shuffle_i32x4(v0, v1, 0xdd)};
    for (int q = 0; q < 4 && 16 * q < n; q++) {
        const int left = n - 16 * q;
        const __mmask16 mq = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        _mm512_mask_storeu_epi32((void *)(d + 16 * q), mq, _mm512_xor_si512(out[q], f));
    }
}
#endif

/* The im2col panel of positions p0 .. p0 + np - 1 (np <= BLOCK): every group of 4 k, [K4][BLOCK][4] into b (k4's
   group of position p0 + q at (k4 * BLOCK + q) * 4), built by the thread that then runs every channel tile over
   it, so it is read from L1/L2. xp: the bordered copy (flip 0), or x itself when it needs no border (flip: int8 x's
   sign bits). A padding row k >= K meets zero weights: it reads `fill` (Wp bytes), whatever they become. (c, i, j)
   of k are stepped, not divided. The tail q >= np is zeroed (its sums are never stored). vec: the rows of a stride
   1 or 2 convolution go through interleave_vnni (the caller is compiled for it). */
static inline __attribute__((always_inline))
void panel_body(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b, int64_t p0,
                int np, const int vec) {
    const int64_t Hp = a->H + 2 * a->ph, Wp = a->W + 2 * a->pw, OW = a->OW, sw = a->sw, K = a->C * a->kh * a->kw;
    const int64_t oh0 = p0 / OW, ow0 = p0 % OW;
    int64_t c = 0, i = 0, jj = 0;                       /* k = c * kh * kw + i * kw + jj */
    for (int64_t k4 = 0; k4 < a->K4; k4++) {
        const uint8_t *base[4];
        int64_t step[4];
        for (int s = 0; s < 4; s++) {
            const int real = 4 * k4 + s < K;
            base[s] = real ? xp + c * Hp * Wp + i * a->dh * Wp + jj * a->dw : fill;
            step[s] = real ? a->sh * Wp : 0;
            if (++jj == a->kw) { jj = 0; if (++i == a->kh) { i = 0; c++; } }
        }
        u32_unaligned *d = (u32_unaligned *)(b + k4 * ROW);
        int64_t oh = oh0, ow = ow0;
        for (int q = 0; q < np;) {                      /* one output row's run of positions at a time */
            const int n = OW - ow < np - q ? (int)(OW - ow) : np - q;
            const uint8_t *r0 = base[0] + oh * step[0] + ow * sw, *r1 = base[1] + oh * step[1] + ow * sw;
            const uint8_t *r2 = base[2] + oh * step[2] + ow * sw, *r3 = base[3] + oh * step[3] + ow * sw;
            u32_unaligned *dq = d + q;
#ifdef QC_X86
            if (vec && sw <= 2) interleave_vnni(dq, r0, r1, r2, r3, n, sw, flip);
            else
#endif
            if (sw == 1)
                for (int e = 0; e < n; e++)
                    dq[e] = ((uint32_t)r0[e] | (uint32_t)r1[e] << 8 | (uint32_t)r2[e] << 16 | (uint32_t)r3[e] << 24)
                            ^ flip;
            else
                for (int e = 0; e < n; e++)
                    dq[e] = ((uint32_t)r0[e * sw] | (uint32_t)r1[e * sw] << 8 | (uint32_t)r2[e * sw] << 16
                             | (uint32_t)r3[e * sw] << 24) ^ flip;
            q += n, ow = 0, oh++;
        }
        if (np < BLOCK) memset(d + np, 0, (size_t)(BLOCK - np) * 4);
    }
}

/* ---------------------------------------------------------------------------------------- epilogue */

static inline void store_one(const Job *j, int64_t n, int64_t p, int32_t acc) {
    const QArgs *a = j->a;
    uint32_t u = (uint32_t)acc + (uint32_t)((const int32_t *)(intptr_t)a->off)[n];
    if (a->offp) u += (uint32_t)((const int32_t *)(intptr_t)a->offp)[p];
    const int32_t v = (int32_t)u;
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
    const uint8_t *b = j->b + panel % (BLOCK / PANEL) * PANEL * 4;
    int32_t acc[QR][PANEL];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < K4; k++) {
        const uint8_t *bk = b + k * ROW;
        for (int r = 0; r < QR; r++) {
            const int8_t *wr = w + (k * QR + r) * 4;
            for (int q = 0; q < PANEL; q++)
                acc[r][q] += bk[q * 4] * wr[0] + bk[q * 4 + 1] * wr[1] + bk[q * 4 + 2] * wr[2] + bk[q * 4 + 3] * wr[3];
        }
    }
    store_tile(j, nb * QR, panel * PANEL, (const int32_t (*)[PANEL])acc, np);
}

#ifdef QC_X86

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
    __m256i v = _mm256_add_epi32(acc, _mm256_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    if (a->offp) v = _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)((const int32_t *)(intptr_t)a->offp + p)));
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
    const uint8_t *b = j->b + panel % (BLOCK / PANEL) * PANEL * 4 + half * 64;
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    __m256i acc[4][2];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < K4; k++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + k * ROW));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + k * ROW + 32));
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
    __m512i v = _mm512_add_epi32(acc, _mm512_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    if (a->offp) v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(mask, (const int32_t *)(intptr_t)a->offp + p));
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
    const uint8_t *b = j->b + panel % (BLOCK / PANEL) * PANEL * 4;
    __m512i acc[QR][2];
#pragma GCC unroll 8
    for (int r = 0; r < QR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int64_t k = 0; k < K4; k++) {
        const __m512i b0 = _mm512_loadu_si512(b + k * ROW);
        const __m512i b1 = J > 1 ? _mm512_loadu_si512(b + k * ROW + 64) : b0;
        const int32_t *wk = w + k * QR;
#pragma GCC unroll 8
        for (int r = 0; r < QR; r++) {
            const __m512i wr = _mm512_set1_epi32(wk[r]);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b0, wr);
            if (J > 1) acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b1, wr);
        }
    }
    /* the sums leave their registers once, through memory: a loop over rows that indexed acc would keep it in
       memory all along (gcc then spills and copies the accumulators in the k loop) */
    __m512i sums[QR][2];
#pragma GCC unroll 8
    for (int r = 0; r < QR; r++) {
        _mm512_storeu_si512(&sums[r][0], acc[r][0]);
        if (J > 1) _mm512_storeu_si512(&sums[r][1], acc[r][1]);
    }
    const int64_t n0 = nb * QR, p0 = panel * PANEL;
    for (int r = 0; r < QR && n0 + r < a->N; r++) {
        store16_vnni(j, n0 + r, p0, _mm512_loadu_si512(&sums[r][0]), np);
        if (J > 1) store16_vnni(j, n0 + r, p0 + 16, _mm512_loadu_si512(&sums[r][1]), np - 16);
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

/* Scratch bytes one call needs: one im2col panel per thread, then x's bordered copy and a row of the zero point
   (cpu_qconv.scratch_bytes is the same rule). */
static int64_t panel_bytes(int64_t K4) { return K4 * BLOCK * 4; }
int64_t qconv_scratch_bytes(int64_t K4, int64_t C, int64_t Hp, int64_t Wp, int64_t nthreads) {
    return (nthreads < 1 ? 1 : nthreads) * panel_bytes(K4) + C * Hp * Wp + Wp;
}

static void panel_c(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b, int64_t p0,
                    int np) { panel_body(a, xp, fill, flip, b, p0, np, 0); }
#ifdef QC_X86
static AVX2 void panel_avx2(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b,
                            int64_t p0, int np) { panel_body(a, xp, fill, flip, b, p0, np, 0); }
static VNNI void panel_vnni(const QArgs *a, const uint8_t *xp, const uint8_t *fill, uint32_t flip, uint8_t *b,
                            int64_t p0, int np) { panel_body(a, xp, fill, flip, b, p0, np, 1); }
#endif

/* Work item `it` of `groups` per panel: the panel built into this thread's buffer (job->b) unless it holds it
   already (*built: the panel it holds, -1 none), then its share of the channel tiles (all of them when groups is
   1; a small image's panel split in groups keeps both threads busy, each building it once). */
static void run_item(const Job *job, const uint8_t *src, const uint8_t *fill, uint32_t flip, int64_t it,
                     int64_t groups, int isa, int64_t *built) {
    const QArgs *a = job->a;
    const int64_t block = it / groups, g = it % groups, nbs = (a->N + QR - 1) / QR;
    const int64_t left = job->P - block * BLOCK;
    const int nblock = left < BLOCK ? (int)left : BLOCK;
    uint8_t *b = (uint8_t *)job->b;
    if (*built != block) {
        *built = block;
#ifdef QC_X86
        if (isa >= ISA_VNNI) panel_vnni(a, src, fill, flip, b, block * BLOCK, nblock);
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
    const uint32_t flip = direct ? (uint32_t)a->flip * 0x01010101u : 0u;
    const int64_t C = direct ? 0 : a->C;                /* channels to copy */
    if (nthreads > 1 && nbs * panels * (BLOCK / PANEL) * K <= 65536) nthreads = 1;  /* small: no parallel region */
#ifndef _OPENMP
    nthreads = 1;
#endif
    /* items: panels, each split into channel groups until there are about 4 a thread (a 7x7 image has 1 panel) */
    int64_t groups = 1;
    while (nthreads > 1 && panels * groups < 4 * (int64_t)nthreads && groups * 2 <= nbs) groups *= 2;
    const int64_t items = panels * groups;
    for (int64_t im = 0; im < a->batch; im++) {
        const uint8_t *x = (const uint8_t *)(intptr_t)a->x + im * a->xs_b, *src = direct ? x : xp;
        Job job = {a, b, (char *)(intptr_t)a->y + im * a->ys_b * (int64_t)esize, P};
        if (nthreads <= 1) {
            int64_t built = -1;
            for (int64_t c = 0; c < C; c++) pad_channel(a, x, xp, c);
            for (int64_t it = 0; it < items; it++) run_item(&job, src, fill, flip, it, groups, isa, &built);
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
            for (int64_t it = 0; it < items; it++) run_item(&job, src, fill, flip, it, groups, isa, &built);
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
