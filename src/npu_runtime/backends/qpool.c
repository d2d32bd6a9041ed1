/* QMAXPOOL on the CPU: y = quantize(max_pool2d(dequantize(x))), by pooling the codes.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (load_packed) and called through ctypes by
   cpu_qpool.py, which checks every pointer and size, proves every window holds an element of x and computes the
   table: this code trusts them. Keep QPoolArgs in step with _ARGS there.

   For a finite x_scale, dequantize is monotone in the code, so a window's float32 maximum is the dequantized value
   of one code: its largest (x_scale >= 0) or smallest (x_scale < 0). The caller gives `flip`, the byte each code is
   xor-ed with so that an unsigned maximum picks that code (0x80 for int8 codes, and 0xff more for the smallest), and
   `table`, y's code for each flipped maximum, computed by the op's reference (so y is the reference's, bit for bit).
   When the table gives back the code itself (one scale and zero point: a QDQ model's pool) it is not
   read. Padding is the unsigned minimum 0, which never wins against the element every window holds.

   Two loops, by layout: "rows" when x's rows are contiguous (NCHW): per output row the max of the window's rows
   into a padded line, then the max along it; "channels" when x's channels are contiguous (the arena's NHWC): per
   output position the max over the window, a vector of channels at a time. Both written once, vectorized by the
   compiler for AVX-512, AVX2 and plain C, chosen at run time. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* qpool_packed's argument block: 29 int64 (_ARGS in cpu_qpool.py). Strides in elements (bytes). */
typedef struct {
    int64_t x, y, table, flip, identity;
    int64_t batch, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t xs_b, xs_c, xs_h, xs_w, ys_b, ys_c, ys_h, ys_w;
    int64_t nthreads, isa;
} QPoolArgs;

/* The rows of the window of output row oh that lie in x: [*i0, *i1) of i (row h = oh * sh - ph + i * dh). */
static inline void rows_in(const QPoolArgs *a, int64_t oh, int64_t *i0, int64_t *i1) {
    const int64_t h0 = oh * a->sh - a->ph;
    int64_t lo = 0, hi = a->kh;
    while (lo < hi && h0 + lo * a->dh < 0) lo++;
    while (hi > lo && h0 + (hi - 1) * a->dh >= a->H) hi--;
    *i0 = lo, *i1 = hi;
}

/* One output row of one plane (x's rows contiguous): line[pw + w] = max over the window's rows of x ^ flip, 0 in
   the padding, then y[ow] = code of max over j of line[ow * sw + j * dw]. The loops along the output run over OWR,
   OW rounded up to 64, in scratch zeroed past its data, so that they vectorize whole (a 56-wide row would otherwise
   leave most of each loop to the scalar remainder); only OW codes are stored. Every field is read into a local
   first: the stores are of bytes, which may alias anything, so the compiler would reload the fields at every store
   and not vectorize. */
#define ROW_BODY                                                                                             \
    {                                                                                                        \
        const uint8_t f = (uint8_t)a->flip;                                                                  \
        const uint8_t *restrict table = (const uint8_t *)(intptr_t)a->table;                                 \
        const int64_t W = a->W, OW = a->OW, sw = a->sw, dw = a->dw, kw = a->kw, dh = a->dh, xs_h = a->xs_h;  \
        const int64_t ys_w = a->ys_w, OWR = (OW + 63) / 64 * 64;                                             \
        int64_t i0, i1;                                                                                      \
        rows_in(a, oh, &i0, &i1);                                                                            \
        uint8_t *restrict m = line + a->pw;                                                                  \
        const uint8_t *r = x + (oh * a->sh - a->ph + i0 * dh) * xs_h;                                        \
        for (int64_t w = 0; w < W; w++) m[w] = (uint8_t)(r[w] ^ f);                                          \
        for (int64_t i = i0 + 1; i < i1; i++) {                                                              \
            r += dh * xs_h;                                                                                  \
            for (int64_t w = 0; w < W; w++) {                                                                \
                const uint8_t v = (uint8_t)(r[w] ^ f);                                                       \
                m[w] = v > m[w] ? v : m[w];                                                                  \
            }                                                                                                \
        }                                                                                                    \
        if (sw == 2) /* the line's even and odd bytes apart (16-bit lanes, which vectorize): stride 1 each */ \
            for (int64_t e = 0; e < half; e++) {                                                             \
                const uint16_t pair = (uint16_t)(line[2 * e] | line[2 * e + 1] << 8);                        \
                even[e] = (uint8_t)pair, odd[e] = (uint8_t)(pair >> 8);                                      \
            }                                                                                                \
        for (int64_t j = 0, at = 0; j < kw; j++, at += dw) {                                                 \
            const uint8_t *restrict src = sw == 2 ? ((at & 1) ? odd : even) + (at >> 1) : line + at;         \
            if ((sw == 1 || sw == 2) && j == 0) for (int64_t ow = 0; ow < OWR; ow++) row_max[ow] = src[ow];  \
            else if (sw == 1 || sw == 2)                                                                     \
                for (int64_t ow = 0; ow < OWR; ow++) row_max[ow] = src[ow] > row_max[ow] ? src[ow] : row_max[ow]; \
            else for (int64_t ow = 0; ow < OW; ow++) {                                                       \
                const uint8_t v = src[ow * sw];                                                              \
                row_max[ow] = j == 0 || v > row_max[ow] ? v : row_max[ow];                                   \
            }                                                                                                \
        }                                                                                                    \
        if (a->identity) {                                                                                   \
            for (int64_t ow = 0; ow < OWR; ow++) row_max[ow] ^= f;                                           \
            if (ys_w == 1) memcpy(yr, row_max, (size_t)OW);                                                  \
            else for (int64_t ow = 0; ow < OW; ow++) yr[ow * ys_w] = row_max[ow];                            \
        } else for (int64_t ow = 0; ow < OW; ow++) yr[ow * ys_w] = table[row_max[ow]];                       \
    }

/* One output position of one image (x's channels contiguous): acc[c] = max over the window of x ^ flip. */
#define POSITION_BODY                                                                                        \
    {                                                                                                        \
        const uint8_t f = (uint8_t)a->flip, id = (uint8_t)a->identity;                                       \
        const uint8_t *restrict table = (const uint8_t *)(intptr_t)a->table;                                 \
        const int64_t C = a->C, kw = a->kw, dw = a->dw, W = a->W, xs_h = a->xs_h, xs_w = a->xs_w;            \
        const int64_t ys_c = a->ys_c;                                                                        \
        int64_t i0, i1, j0, j1;                                                                              \
        rows_in(a, oh, &i0, &i1);                                                                            \
        const int64_t w0 = ow * a->sw - a->pw, h0 = oh * a->sh - a->ph, dh = a->dh;                          \
        for (j0 = 0; j0 < kw && w0 + j0 * dw < 0; j0++) {}                                                   \
        for (j1 = kw; j1 > j0 && w0 + (j1 - 1) * dw >= W; j1--) {}                                           \
        memset(acc, 0, (size_t)C);                                                                           \
        for (int64_t i = i0; i < i1; i++)                                                                    \
            for (int64_t j = j0; j < j1; j++) {                                                              \
                const uint8_t *restrict p = x + (h0 + i * dh) * xs_h + (w0 + j * dw) * xs_w;                 \
                for (int64_t c = 0; c < C; c++) {                                                            \
                    const uint8_t v = (uint8_t)(p[c] ^ f);                                                   \
                    acc[c] = v > acc[c] ? v : acc[c];                                                        \
                }                                                                                            \
            }                                                                                                \
        uint8_t *restrict yp = y + oh * a->ys_h + ow * a->ys_w;                                              \
        if (id && ys_c == 1) for (int64_t c = 0; c < C; c++) yp[c] = (uint8_t)(acc[c] ^ f);                  \
        else if (id) for (int64_t c = 0; c < C; c++) yp[c * ys_c] = (uint8_t)(acc[c] ^ f);                   \
        else for (int64_t c = 0; c < C; c++) yp[c * ys_c] = table[acc[c]];                                   \
    }

#define QPOOL_VARIANT(SUFFIX, ATTR)                                                                          \
    ATTR static void row_##SUFFIX(const QPoolArgs *a, const uint8_t *restrict x, uint8_t *restrict yr,       \
                                  int64_t oh, uint8_t *restrict line, uint8_t *restrict row_max,             \
                                  uint8_t *restrict even, uint8_t *restrict odd, int64_t half) ROW_BODY     \
    ATTR static void position_##SUFFIX(const QPoolArgs *a, const uint8_t *restrict x, uint8_t *restrict y,   \
                                       int64_t oh, int64_t ow, uint8_t *restrict acc) POSITION_BODY

QPOOL_VARIANT(c, )
#if defined(__x86_64__)
QPOOL_VARIANT(avx2, __attribute__((target("avx2"))))
QPOOL_VARIANT(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))
#endif

int qpool_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    return __builtin_cpu_supports("avx2") ? ISA_AVX2 : ISA_C;
#else
    return ISA_C;
#endif
}

#ifdef _OPENMP
int qpool_openmp(void) { return 1; }
#else
int qpool_openmp(void) { return 0; }
#endif

/* scratch: the padded line (2 half bytes), the row's maxima (OW rounded up to 64), the line's even and odd bytes */
static void run_row(const QPoolArgs *a, int isa, const uint8_t *x, uint8_t *yr, int64_t oh, uint8_t *scratch,
                    int64_t half) {
    uint8_t *row_max = scratch + 2 * half, *even = row_max + (a->OW + 63) / 64 * 64, *odd = even + half;
#if defined(__x86_64__)
    if (isa >= ISA_AVX512) { row_avx512(a, x, yr, oh, scratch, row_max, even, odd, half); return; }
    if (isa == ISA_AVX2) { row_avx2(a, x, yr, oh, scratch, row_max, even, odd, half); return; }
#endif
    (void)isa;
    row_c(a, x, yr, oh, scratch, row_max, even, odd, half);
}

static void run_position(const QPoolArgs *a, int isa, const uint8_t *x, uint8_t *y, int64_t oh, int64_t ow,
                         uint8_t *acc) {
#if defined(__x86_64__)
    if (isa >= ISA_AVX512) { position_avx512(a, x, y, oh, ow, acc); return; }
    if (isa == ISA_AVX2) { position_avx2(a, x, y, oh, ow, acc); return; }
#endif
    (void)isa;
    position_c(a, x, y, oh, ow, acc);
}

/* Work item `it`: one output row of one plane (rows), or one output row of one image (channels). Each thread has its
   own scratch: the padded line and a row of maxima, or a vector of channels. 0, or -1 when out of memory. */
static int qpool(const QPoolArgs *a) {
    const int channels = a->xs_c == 1;                  /* else x's rows are contiguous: xs_w == 1 (the caller) */
    const int64_t items = channels ? a->batch * a->OH : a->batch * a->C * a->OH;
    /* the line: the padded row, and as far as the loops over OW rounded up to 64 read (zeros), in 2 half bytes, half
       a multiple of 64 */
    const int64_t owr = (a->OW + 63) / 64 * 64, reach = (owr - 1) * a->sw + (a->kw - 1) * a->dw + 1;
    const int64_t half = ((a->W + 2 * a->pw > reach ? a->W + 2 * a->pw : reach) + 127) / 128 * 64;
    const size_t scratch = channels ? (size_t)a->C : (size_t)(4 * half + owr);
    int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads, failed = 0;
    const int isa = (int)(a->isa < qpool_isa() ? a->isa : qpool_isa());
    if ((items * (channels ? a->OW * a->C : a->OW)) < 65536) nthreads = 1;  /* small: no parallel region */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1) reduction(| : failed)
    {
        uint8_t *buf = (uint8_t *)calloc(scratch, 1);   /* zeroed: the line's padding stays 0 */
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!buf) continue;
            if (channels) {
                const int64_t b = it / a->OH, oh = it % a->OH;
                const uint8_t *x = (const uint8_t *)(intptr_t)a->x + b * a->xs_b;
                uint8_t *y = (uint8_t *)(intptr_t)a->y + b * a->ys_b;
                for (int64_t ow = 0; ow < a->OW; ow++) run_position(a, isa, x, y, oh, ow, buf);
            } else {
                const int64_t plane = it / a->OH, oh = it % a->OH, b = plane / a->C, c = plane % a->C;
                const uint8_t *x = (const uint8_t *)(intptr_t)a->x + b * a->xs_b + c * a->xs_c;
                uint8_t *yr = (uint8_t *)(intptr_t)a->y + b * a->ys_b + c * a->ys_c + oh * a->ys_h;
                run_row(a, isa, x, yr, oh, buf, half);
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* qpool() with its arguments in one block (_ARGS in cpu_qpool.py): one ctypes argument is cheaper. */
int qpool_packed(const void *block) {
    QPoolArgs a;
    memcpy(&a, block, sizeof a);                        /* a Python bytes object: no alignment promised */
    return qpool(&a);
}
