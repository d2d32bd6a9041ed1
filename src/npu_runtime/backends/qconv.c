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
   prepare time as [N / QR][K4][QR] int32 lanes of 4 consecutive k (VNNI, C) and as the same lanes' 4 int16
   (AVX2). A tile is
   QR output channels x 16 or 32 positions; its int32 sums are exact (unsigned x times signed w: vpdpbusd adds
   groups of 4 products into int32 without saturation; AVX2 widens both to int16 and uses madd, so nothing saturates).
   The epilogue adds off[n] = bias[n] - x_zp_u * sum w[n] (wrapping adds: the result fits, Python checked) and then
   does exactly the reference's float steps: float32(acc) * m[n], rint (ties to even, the default rounding mode),
   + zp, max(lo), min(hi) (lo raised to zp for a fused relu by the caller), or float32(acc) * m[n] for a float
   output, or acc itself for int32. A QGEMM's y [M, N] has its channels contiguous: the VNNI tile then transposes
   its codes and writes 8 channels of a position at once (AVX2: 4). The driver (one call's loops) is qconv_run.c. */
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
   [C][Hp][Wp] with Hp = H + 2 ph, Wp = W + 2 pw: im2col then reads it without a bounds check. The fields are read
   into locals first: the stores are of bytes, which may alias *a, and the compiler would otherwise reload them at
   every store and copy byte by byte (12 % of a 3x3 convolution's time, measured). */
static void pad_channel(const QArgs *a, const uint8_t *x, uint8_t *xp, int64_t c) {
    const int64_t H = a->H, W = a->W, ph = a->ph, pw = a->pw, Hp = H + 2 * ph, Wp = W + 2 * pw;
    const int64_t xs_h = a->xs_h, xs_w = a->xs_w;
    const uint8_t fill = (uint8_t)a->zp_u, flip = (uint8_t)a->flip;
    uint8_t *restrict dst = xp + c * Hp * Wp;
    const uint8_t *restrict src = x + c * a->xs_c;
    memset(dst, fill, (size_t)(ph * Wp));
    if (pw == 0 && xs_w == 1 && xs_h == W) {            /* rows without a border: the channel in one loop */
        uint8_t *restrict r = dst + ph * Wp;
        for (int64_t e = 0; e < H * W; e++) r[e] = (uint8_t)(src[e] ^ flip);
    } else {
        for (int64_t h = 0; h < H; h++) {
            uint8_t *restrict r = dst + (h + ph) * Wp;
            const uint8_t *restrict s = src + h * xs_h;
            memset(r, fill, (size_t)pw);
            if (xs_w == 1) for (int64_t w = 0; w < W; w++) r[pw + w] = (uint8_t)(s[w] ^ flip);
            else for (int64_t w = 0; w < W; w++) r[pw + w] = (uint8_t)(s[w * xs_w] ^ flip);
            memset(r + pw + W, fill, (size_t)pw);
        }
    }
    memset(dst + (ph + H) * Wp, fill, (size_t)(ph * Wp));
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

/* 16 bytes of a row from position e at stride sw (1 or 2). Stride 2 reads 32 bytes and keeps the even ones, so the
   caller asks only when a position of the row follows (the 32nd byte is then one it reads anyway). */
static inline __attribute__((always_inline)) AVX2 __m128i row16_avx2(const uint8_t *r, int64_t sw) {
    if (sw == 1) return _mm_loadu_si128((const __m128i *)r);
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)r), _mm256_set1_epi16(0x00ff));
    return _mm_packus_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* interleave_vnni for AVX2: 16 positions at a time (bytes unpacked to 4-byte groups, the 128-bit lanes in position
   order); the rest of the run, fewer than 16 positions or a stride-2 run's last 16, goes through the scalar loop
   of panel_body (the return value: how many positions were written). */
static AVX2 int interleave_avx2(u32_unaligned *d, const uint8_t *r0, const uint8_t *r1, const uint8_t *r2,
                                const uint8_t *r3, int n, int64_t sw, uint32_t flip) {
    const __m256i f = _mm256_set1_epi32((int)flip);
    int e = 0;
    for (; e + 16 < n + (sw == 1); e += 16) {
        const __m128i a = row16_avx2(r0 + e * sw, sw), b = row16_avx2(r1 + e * sw, sw);
        const __m128i c = row16_avx2(r2 + e * sw, sw), g = row16_avx2(r3 + e * sw, sw);
        const __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        const __m128i cg0 = _mm_unpacklo_epi8(c, g), cg1 = _mm_unpackhi_epi8(c, g);
        const __m256i lo = _mm256_set_m128i(_mm_unpackhi_epi16(ab0, cg0), _mm_unpacklo_epi16(ab0, cg0));
        const __m256i hi = _mm256_set_m128i(_mm_unpackhi_epi16(ab1, cg1), _mm_unpacklo_epi16(ab1, cg1));
        _mm256_storeu_si256((__m256i *)(d + e), _mm256_xor_si256(lo, f));
        _mm256_storeu_si256((__m256i *)(d + e + 8), _mm256_xor_si256(hi, f));
    }
    return e;
}
#endif

/* The im2col panel of positions p0 .. p0 + np - 1 (np <= BLOCK): every group of 4 k, [K4][BLOCK][4] into b (k4's
   group of position p0 + q at (k4 * BLOCK + q) * 4), built by the thread that then runs every channel tile over
   it, so it is read from L1/L2. xp: the bordered copy (flip 0), or x itself when it needs no border (flip: int8 x's
   sign bits). A padding row k >= K meets zero weights: it reads `fill` (Wp bytes), whatever they become. (c, i, j)
   of k are stepped, not divided. The tail q >= np is zeroed (its sums are never stored). vec: the ISA whose
   interleave takes the rows of a stride 1 or 2 convolution (interleave_vnni or _avx2; the caller is compiled for
   it), 0 for none. */
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
            int e0 = 0;                                 /* positions written by a vector path */
#ifdef QC_X86
            if (vec == ISA_VNNI && sw <= 2) interleave_vnni(dq, r0, r1, r2, r3, n, sw, flip), e0 = n;
            else if (vec == ISA_AVX2 && sw <= 2) e0 = interleave_avx2(dq, r0, r1, r2, r3, n, sw, flip);
#endif
            if (sw == 1)
                for (int e = e0; e < n; e++)
                    dq[e] = ((uint32_t)r0[e] | (uint32_t)r1[e] << 8 | (uint32_t)r2[e] << 16 | (uint32_t)r3[e] << 24)
                            ^ flip;
            else
                for (int e = e0; e < n; e++)
                    dq[e] = ((uint32_t)r0[e * sw] | (uint32_t)r1[e * sw] << 8 | (uint32_t)r2[e * sw] << 16
                             | (uint32_t)r3[e * sw] << 24) ^ flip;
            q += n, ow = 0, oh++;
        }
        if (np < BLOCK) memset(d + np, 0, (size_t)(BLOCK - np) * 4);
    }
}

/* The panel of positions p0 .. p0 + np - 1 of a matrix whose rows are positions and whose k are contiguous (a
   QGEMM's x [P][K] at row stride rs; qmatmul.c's b with trans_b): each group of 4 k is 4 bytes of one row, so the
   panel is a transpose of 32-bit words read in place, with no bordered copy. fb flips int8 codes' sign bits; a
   last group past K takes its real bytes one by one (the rest meet zero weights). k4 outer: the np rows' current
   cache lines stay in L1 while each group's 4 np bytes are written in one run. */
static void panel_rows(const uint8_t *x, int64_t K, int64_t K4, int64_t rs, uint8_t fb, uint8_t *b, int64_t p0,
                       int np) {
    u32_unaligned *d = (u32_unaligned *)b;
    const uint32_t f4 = fb * 0x01010101u;
    const uint8_t *x0 = x + p0 * rs;
    for (int64_t k4 = 0; k4 < K4; k4++) {
        u32_unaligned *dk = d + k4 * BLOCK;
        if (4 * k4 + 4 <= K) {
            for (int q = 0; q < np; q++) dk[q] = *(const u32_unaligned *)(x0 + q * rs + 4 * k4) ^ f4;
        } else {
            for (int q = 0; q < np; q++) {
                uint32_t v = 0;
                for (int e = 0; 4 * k4 + e < K; e++)
                    v |= (uint32_t)(uint8_t)(x0[q * rs + 4 * k4 + e] ^ fb) << 8 * e;
                dk[q] = v;
            }
        }
        if (np < BLOCK) memset(dk + np, 0, (size_t)(BLOCK - np) * 4);
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

/* Row n's int32 sums at positions p .. p + 7 with its offsets added: acc + off[n] (+ offp[p ..]), wrapping. */
static inline AVX2 __m256i sums8_avx2(const QArgs *a, __m256i acc, int64_t n, int64_t p) {
    __m256i v = _mm256_add_epi32(acc, _mm256_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    if (a->offp)
        v = _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)((const int32_t *)(intptr_t)a->offp + p)));
    return v;
}

/* Those sums as codes, store_one's float steps on 8 lanes: float32(v) * m[n], rint, + zp, clamp to [lo, hi]; int32
   lanes in [lo, hi], so packs carry them exactly. zp, lo, hi: the caller's broadcasts of the block's. */
static inline AVX2 __m256i codes8_avx2(const QArgs *a, __m256i v, int64_t n, __m256 zp, __m256 lo, __m256 hi) {
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(((const float *)(intptr_t)a->m)[n]));
    f = _mm256_add_ps(_mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
}

/* 8 values of row n from position p: the vector form of store_one. */
static inline AVX2 void store8_avx2(const Job *j, int64_t n, int64_t p, __m256i acc, int np) {
    const QArgs *a = j->a;
    if (a->ys_p != 1 || np < 8 || a->out == OUT_F32) {   /* strided (QGEMM) or a tail: one by one */
        int32_t t[8];
        _mm256_storeu_si256((__m256i *)t, acc);
        for (int q = 0; q < np && q < 8; q++) store_one(j, n, p + q, t[q]);
        return;
    }
    const __m256i v = sums8_avx2(a, acc, n, p);
    const int64_t at = n * a->ys_n + p;
    if (a->out == OUT_I32) { _mm256_storeu_si256((__m256i *)((int32_t *)j->y + at), v); return; }
    const __m256i i = codes8_avx2(a, v, n, _mm256_set1_ps((float)a->zp), _mm256_set1_ps((float)a->lo),
                                  _mm256_set1_ps((float)a->hi));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    const __m128i b8 = a->out == OUT_U8 ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
    _mm_storel_epi64((__m128i *)((int8_t *)j->y + at), b8);
}

/* 4 rows x 8 positions of uint8/int8 output: each row through codes8_avx2 (the constants broadcast once for the 32
   codes), packed together; per 128-bit lane (positions 0-3, then 4-7) byte r * 4 + q is row r's code of
   position q. Stored as 4 runs of 8 bytes (y's positions contiguous: a convolution's NCHW), or transposed by one
   byte shuffle into 8 runs of 4 (its channels contiguous: a QGEMM's y). One row at a time, the epilogue of a 1x1
   convolution over 64 channels took ~40 % of its time, and storing a QGEMM's codes one by one ~25 %. */
static inline AVX2 void store4x8_avx2(const Job *j, int64_t n0, int64_t p, const __m256i h[4]) {
    const QArgs *a = j->a;
    const __m256 zp = _mm256_set1_ps((float)a->zp), lo = _mm256_set1_ps((float)a->lo);
    const __m256 hi = _mm256_set1_ps((float)a->hi);
    __m256i c[4];
    for (int r = 0; r < 4; r++) c[r] = codes8_avx2(a, sums8_avx2(a, h[r], n0 + r, p), n0 + r, zp, lo, hi);
    const __m256i w0 = _mm256_packs_epi32(c[0], c[1]), w1 = _mm256_packs_epi32(c[2], c[3]);
    const __m256i b = a->out == OUT_U8 ? _mm256_packus_epi16(w0, w1) : _mm256_packs_epi16(w0, w1);
    if (a->ys_p == 1) {                                 /* row r's 8 codes: its two 4-byte groups side by side */
        uint64_t rows[4];
        _mm256_storeu_si256((__m256i *)rows, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        for (int r = 0; r < 4; r++) memcpy(j->y + (n0 + r) * a->ys_n + p, &rows[r], 8);
        return;
    }
    const __m256i order = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                           0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    uint32_t words[8];                                  /* position q's 4 codes: bytes q * 4 + r */
    _mm256_storeu_si256((__m256i *)words, _mm256_shuffle_epi8(b, order));
    for (int q = 0; q < 8; q++) memcpy(j->y + (p + q) * a->ys_p + n0, &words[q], 4);
}

/* 4 rows x 4 nv positions (nv vectors of 4 positions: 2, or 1 for a tile's last 4 or fewer), over groups k0 .. k1 - 1
   of 4 k. A vector is 16 bytes of the panel, 4 positions' groups of 4 k, widened to int16 (vpmovzxbw); the row's 4
   weights come as one int16 quad broadcast to every position, so one madd gives each position its (k0, k1) and
   (k2, k3) sums in adjacent int32 lanes (each at most 2 * 255 * 128: no saturation), and an hadd at the end adds
   them (wrapping, as the int32 sum does). Per 4 k that is one broadcast per row and one widening per 4 positions:
   ~10 % faster than the int16 pairs of 16 positions this replaced (fewer broadcasts and byte splits, measured).
   keep: the 8 accumulators between groups of k (tile_avx2), loaded unless first, stored unless last; the last
   group stores the outputs. */
static inline __attribute__((always_inline)) AVX2 void rows4_avx2(const Job *j, int64_t nb, int64_t panel, int r0,
                                                                  int part, int np, const int nv, int64_t k0,
                                                                  int64_t k1, __m256i *keep, int first, int last) {
    const QArgs *a = j->a;
    const int64_t *w = (const int64_t *)(intptr_t)a->w2 + nb * a->K4 * QR + r0;
    const uint8_t *b = j->b + panel % (BLOCK / PANEL) * PANEL * 4 + part * 32;
    /* named accumulators, not an array: GCC kept an array's rows partly in memory through the loop */
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    if (!first) {
        a00 = keep[0], a01 = keep[1], a10 = keep[2], a11 = keep[3];
        a20 = keep[4], a21 = keep[5], a30 = keep[6], a31 = keep[7];
    }
    for (int64_t k = k0; k < k1; k++) {
        const uint8_t *bk = b + k * ROW;
        const int64_t *wk = w + k * QR;
        const __m256i x0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)bk));
        const __m256i x1 = nv > 1 ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(bk + 16))) : x0;
#define QUAD(r) { const __m256i wq = _mm256_set1_epi64x(wk[r]);                                                    \
                  a##r##0 = _mm256_add_epi32(a##r##0, _mm256_madd_epi16(x0, wq));                                  \
                  if (nv > 1) a##r##1 = _mm256_add_epi32(a##r##1, _mm256_madd_epi16(x1, wq)); }
        QUAD(0) QUAD(1) QUAD(2) QUAD(3)
#undef QUAD
    }
    const __m256i acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    if (!last) {
        for (int r = 0; r < 4; r++) keep[2 * r] = acc[r][0], keep[2 * r + 1] = acc[r][1];
        return;
    }
    const int64_t n0 = nb * QR + r0, p0 = panel * PANEL + part * 8;
    __m256i h[4];
    for (int r = 0; r < 4; r++)  /* hadd: [p0 p1 p4 p5 | p2 p3 p6 p7] (one vector: p0 p1 p0 p1 | p2 p3 p2 p3) */
        h[r] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][0], nv > 1 ? acc[r][1] : acc[r][0]), 0xd8);
    if (np == 8 && n0 + 4 <= a->N && (a->out == OUT_U8 || a->out == OUT_I8) && (a->ys_p == 1 || a->ys_n == 1)) {
        store4x8_avx2(j, n0, p0, h);
        return;
    }
    for (int r = 0; r < 4 && n0 + r < a->N; r++) store8_avx2(j, n0 + r, p0, h[r], np);
}

/* The tile in groups of KC4 groups of 4 k, each run over every 8 positions and 4 rows before the next: a group's
   panel rows (KC4 x 256 bytes) and weights (KC4 x 64) stay in L1 while the tile's 8 sub-tiles read them. Without
   the grouping a deep layer's sub-tiles each streamed both from L2 (a 512-channel 3x3 ran 6 % slower than the
   16-position tile before it). */
#define KC4 64
static AVX2 void tile_avx2(const Job *j, int64_t nb, int64_t panel, int np) {
    const int rows = nb * QR + 4 < j->a->N ? 2 : 1;     /* groups of 4 rows in this tile */
    const int64_t K4 = j->a->K4;
    __m256i keep[PANEL / 8][2][8];
    for (int64_t k0 = 0; k0 < K4; k0 += KC4) {
        const int64_t k1 = k0 + KC4 < K4 ? k0 + KC4 : K4;
        const int first = k0 == 0, last = k1 == K4;
        for (int part = 0; part * 8 < np; part++) {
            const int left = np - part * 8 < 8 ? np - part * 8 : 8;
            for (int g = 0; g < rows; g++)
                if (left > 4) rows4_avx2(j, nb, panel, 4 * g, part, left, 2, k0, k1, keep[part][g], first, last);
                else rows4_avx2(j, nb, panel, 4 * g, part, left, 1, k0, k1, keep[part][g], first, last);
        }
    }
}

/* ------------------------------------------------------------------------------------ AVX-512 VNNI */

/* Row n's 16 sums from position p with its terms added (off[n], and offp when there is one; mask: the positions
   inside), then, for a code output, the reference's float32 steps as store_one's: codes in [lo, hi] as int32. */
static inline VNNI __m512i sums16_vnni(const QArgs *a, int64_t n, int64_t p, __m512i acc, __mmask16 mask) {
    __m512i v = _mm512_add_epi32(acc, _mm512_set1_epi32(((const int32_t *)(intptr_t)a->off)[n]));
    if (a->offp) v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(mask, (const int32_t *)(intptr_t)a->offp + p));
    return v;
}
static inline VNNI __m512i codes16_vnni(const QArgs *a, int64_t n, __m512i v) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(((const float *)(intptr_t)a->m)[n]));
    f = _mm512_add_ps(_mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                      _mm512_set1_ps((float)a->zp));
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps((float)a->lo)), _mm512_set1_ps((float)a->hi));
    return _mm512_cvtps_epi32(f);
}

static inline __mmask16 mask16(int np) { return np >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << np) - 1u); }

static inline VNNI void store16_vnni(const Job *j, int64_t n, int64_t p, __m512i acc, int np) {
    const QArgs *a = j->a;
    if (a->ys_p != 1 || a->out == OUT_F32) {
        int32_t t[16];
        _mm512_storeu_si512(t, acc);
        for (int q = 0; q < np && q < 16; q++) store_one(j, n, p + q, t[q]);
        return;
    }
    const __mmask16 mask = mask16(np);
    const __m512i v = sums16_vnni(a, n, p, acc, mask);
    const int64_t at = n * a->ys_n + p;
    if (a->out == OUT_I32) { _mm512_mask_storeu_epi32((int32_t *)j->y + at, mask, v); return; }
    _mm512_mask_cvtepi32_storeu_epi8((int8_t *)j->y + at, mask, codes16_vnni(a, n, v));  /* in range: low byte */
}

/* QR = 8 rows n0.. (all inside N) x 16 positions from p of a code output whose rows are its contiguous dim (QGEMM's
   y [M, N]: ys_n 1): each row's codes as 16 bytes, transposed to 8 bytes per position, one 8-byte store each. */
static inline VNNI void store8x16_t_vnni(const Job *j, int64_t n0, int64_t p, const __m512i acc[QR][2], int h,
                                         int np) {
    const QArgs *a = j->a;
    const __mmask16 mask = mask16(np);
    __m128i c[QR];
    for (int r = 0; r < QR; r++)
        c[r] = _mm512_cvtepi32_epi8(codes16_vnni(a, n0 + r, sums16_vnni(a, n0 + r, p, acc[r][h], mask)));
    __m128i t[QR], u[QR];
    for (int r = 0; r < QR; r += 2) {                   /* t: rows r, r + 1 interleaved, positions 0-7 and 8-15 */
        t[r] = _mm_unpacklo_epi8(c[r], c[r + 1]);
        t[r + 1] = _mm_unpackhi_epi8(c[r], c[r + 1]);
    }
    for (int g = 0; g < 2; g++)                         /* u: rows 4g .. 4g + 3 of positions 0-3, 4-7, 8-11, 12-15 */
        for (int s = 0; s < 2; s++) {
            u[4 * g + 2 * s] = _mm_unpacklo_epi16(t[4 * g + s], t[4 * g + 2 + s]);
            u[4 * g + 2 * s + 1] = _mm_unpackhi_epi16(t[4 * g + s], t[4 * g + 2 + s]);
        }
    int8_t *y = (int8_t *)j->y + n0;
    for (int i = 0; i < 4; i++) {                       /* positions 4i .. 4i + 3: 8 bytes each */
        const __m128i lo = _mm_unpacklo_epi32(u[i], u[4 + i]), hi = _mm_unpackhi_epi32(u[i], u[4 + i]);
        const __m128i pos[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
        for (int e = 0; e < 4 && 4 * i + e < np; e++)
            _mm_storel_epi64((__m128i *)(y + (p + 4 * i + e) * a->ys_p), pos[e]);
    }
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
    if (a->ys_n == 1 && a->ys_p != 1 && (a->out == OUT_U8 || a->out == OUT_I8) && n0 + QR <= a->N) {
        store8x16_t_vnni(j, n0, p0, (const __m512i (*)[2])sums, 0, np);
        if (J > 1) store8x16_t_vnni(j, n0, p0 + 16, (const __m512i (*)[2])sums, 1, np - 16);
        return;
    }
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
