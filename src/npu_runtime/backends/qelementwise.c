/* The quantized elementwise kernels of the CPU backend. QADD, y = quantize(act(dequantize(a) + dequantize(b))),
   bit-exact with its reference (torch_ir.ops.npu_quant.qadd), which is the QDQ chain DEQUANTIZE, add, relu,
   QUANTIZE, and QMUL, the same with a product (npu_quant.qmul, no relu: `mul` below); then QUANTIZE and
   DEQUANTIZE themselves (below, after QADD), and QLUT's lookup of codes in a table.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (open_library) and called through ctypes by
   cpu_qelementwise.py, which checks every pointer and size, makes the three tensors flat and contiguous (or
   computes through a copy) and refuses scales that are not finite. Keep the argument blocks (QAddArgs, QdqArgs) in
   step with _ARGS and _QDQ_ARGS there.

   Per element, the reference's float32 steps in its order: va = float32(a - a_zp) * a_scale, vb likewise, s = va +
   vb, relu (s > 0 ? s : 0: the same for every value but NaN, which finite scales and codes cannot make), then s /
   y_scale (IEEE division, correctly rounded as torch's) or s * inv (multiply_inverse), rintf (ties to even in the
   default rounding mode, as torch.round), + y_zp, clamp to [lo, hi], stored as a code. The multiply and the add
   must stay two roundings: a contraction into one fma would differ in the last bit, so contraction is off for
   this file (GCC's default for gnu11 is fp-contract=fast). The loop is written once and vectorized by the compiler
   for AVX-512, AVX2 and plain C, chosen at run time. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>  /* QLUT's AVX2 lookup; the other loops are vectorized by the compiler */
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

enum { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { T_U8 = 0, T_I8 = 1 };
#define CHUNK 16384  /* elements per parallel chunk */

/* qadd_packed's argument block: 15 int64 then 7 doubles, each an exact float32 (_ARGS in cpu_qelementwise.py).
   period 0: b has y's n elements; period P > 0: b holds P elements, repeated along y (y's trailing dims: a bias
   [N] against [..., N]), element i reading b[i % P]. */
typedef struct {
    int64_t a, b, y, n, a_type, b_type, y_type, a_zp, b_zp, relu, multiply, nthreads, isa, period, mul;
    double a_scale, b_scale, y_scale, inv, y_zp, lo, hi;
} QAddArgs;

typedef struct {
    float sa, sb, ys, inv, zy, lo, hi;
    int32_t za, zb;
    int relu, multiply, mul;
} Steps;

/* relu as a floor: s > 0 ? s : 0 with relu, s itself without (floor -inf; finite scales and codes make no NaN);
   the quotient's form is a macro argument, so that the loop has no branch and vectorizes (AVX2 included). */
#define QADD_LOOP(TA, TB, TY, OP, QUOTIENT)                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                        \
        const float va = (float)((int32_t)((const TA *)a)[i] - p->za) * p->sa;                              \
        const float vb = (float)((int32_t)((const TB *)b)[i] - p->zb) * p->sb;                              \
        float s = va OP vb;                                                                                  \
        s = s > rfloor ? s : rfloor;                                                                         \
        float q = QUOTIENT;                                                                                  \
        q = rintf(q) + p->zy;                                                                                \
        q = q < p->lo ? p->lo : q;                                                                           \
        q = q > p->hi ? p->hi : q;                                                                           \
        ((TY *)y)[i] = (TY)(int32_t)q;                                                                       \
    }
#define QADD_BODY(TA, TB, TY)                                                                                \
    {                                                                                                        \
        const float rfloor = p->relu ? 0.0f : -INFINITY;                                                     \
        if (p->mul && p->multiply) QADD_LOOP(TA, TB, TY, *, s * p->inv)                                      \
        else if (p->mul) QADD_LOOP(TA, TB, TY, *, s / p->ys)                                                 \
        else if (p->multiply) QADD_LOOP(TA, TB, TY, +, s * p->inv)                                           \
        else QADD_LOOP(TA, TB, TY, +, s / p->ys)                                                             \
    }

/* One loop per code-type combination, so the compiler vectorizes each with its types known. */
#define QADD_VARIANT(SUFFIX, ATTR)                                                                           \
    ATTR static void qadd_##SUFFIX(const void *a, const void *b, void *y, int64_t n, int ta, int tb, int ty,  \
                                   const Steps *p) {                                                         \
        const int combo = ta * 4 + tb * 2 + ty;                                                              \
        switch (combo) {                                                                                     \
        case 0: QADD_BODY(uint8_t, uint8_t, uint8_t) break;                                                  \
        case 1: QADD_BODY(uint8_t, uint8_t, int8_t) break;                                                   \
        case 2: QADD_BODY(uint8_t, int8_t, uint8_t) break;                                                   \
        case 3: QADD_BODY(uint8_t, int8_t, int8_t) break;                                                    \
        case 4: QADD_BODY(int8_t, uint8_t, uint8_t) break;                                                   \
        case 5: QADD_BODY(int8_t, uint8_t, int8_t) break;                                                    \
        case 6: QADD_BODY(int8_t, int8_t, uint8_t) break;                                                    \
        default: QADD_BODY(int8_t, int8_t, int8_t) break;                                                    \
        }                                                                                                    \
    }

QADD_VARIANT(c, )
#if defined(__x86_64__)
QADD_VARIANT(avx2, __attribute__((target("avx2"))))
QADD_VARIANT(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))
#endif

int qadd_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl")) return ISA_AVX512;
    return __builtin_cpu_supports("avx2") ? ISA_AVX2 : ISA_C;
#else
    return ISA_C;
#endif
}

#ifdef _OPENMP
int qadd_openmp(void) { return 1; }
#else
int qadd_openmp(void) { return 0; }
#endif

/* n elements from start of a and y, from b_start of b */
static void run_range(int isa, const QAddArgs *a, const Steps *p, int64_t start, int64_t b_start, int64_t n) {
    const char *pa = (const char *)(intptr_t)a->a + start, *pb = (const char *)(intptr_t)a->b + b_start;
    char *py = (char *)(intptr_t)a->y + start;
    const int ta = (int)a->a_type, tb = (int)a->b_type, ty = (int)a->y_type;
#if defined(__x86_64__)
    if (isa >= ISA_AVX512) { qadd_avx512(pa, pb, py, n, ta, tb, ty, p); return; }
    if (isa == ISA_AVX2) { qadd_avx2(pa, pb, py, n, ta, tb, ty, p); return; }
#endif
    (void)isa;
    qadd_c(pa, pb, py, n, ta, tb, ty, p);
}

/* The rows of a repeated b (period P): rows per parallel chunk as many as make about CHUNK elements. */
static void qadd_rows(int isa, const QAddArgs *a, const Steps *p, int nthreads) {
    const int64_t P = a->period, rows = a->n / P, per = P >= CHUNK ? 1 : CHUNK / P;
    const int64_t chunks = (rows + per - 1) / per;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t r = c * per; r < rows && r < (c + 1) * per; r++) run_range(isa, a, p, r * P, 0, P);
    (void)nthreads;
}

/* 0, or -2 for arguments out of range (a zero point outside [-255, 255]: no 8-bit code's; a period that does not
   divide n). */
static int qadd(const QAddArgs *a) {
    if (a->n < 0 || a->a_type < T_U8 || a->a_type > T_I8 || a->b_type < T_U8 || a->b_type > T_I8
        || a->y_type < T_U8 || a->y_type > T_I8 || a->a_zp < -255 || a->a_zp > 255 || a->b_zp < -255
        || a->b_zp > 255 || a->period < 0 || (a->period > 0 && a->n % a->period) || (a->mul && a->relu))
        return -2;
    const Steps p = {(float)a->a_scale, (float)a->b_scale, (float)a->y_scale, (float)a->inv, (float)a->y_zp,
                     (float)a->lo, (float)a->hi, (int32_t)a->a_zp, (int32_t)a->b_zp, (int)a->relu,
                     (int)a->multiply, a->mul != 0};
    int isa = (int)a->isa;
    if (isa > qadd_isa()) isa = qadd_isa();
    const int64_t chunks = (a->n + CHUNK - 1) / CHUNK;
    const int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads;
    if (a->period > 0) {
        qadd_rows(isa, a, &p, nthreads);
        return 0;
    }
    if (nthreads <= 1 || chunks <= 1) {
        run_range(isa, a, &p, 0, 0, a->n);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(nthreads) schedule(static)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t start = c * CHUNK, left = a->n - start;
        run_range(isa, a, &p, start, start, left < CHUNK ? left : CHUNK);
    }
    return 0;
}

/* qadd() with its arguments in one block (_ARGS in cpu_qelementwise.py): one ctypes argument is cheaper. */
int qadd_packed(const void *block) {
    QAddArgs a;
    __builtin_memcpy(&a, block, sizeof a);  /* a Python bytes object: no alignment promised */
    return qadd(&a);
}

/* ---------------------------------------------------------------------------------------- QUANTIZE, DEQUANTIZE
   Bit-exact with torch_ir.quant.numerics.quantize / dequantize (cpu_qelementwise.py: Quantize, Dequantize).

   QUANTIZE, per element: v = float32(x) (bfloat16 and float16 widen exactly), q = v / scale (IEEE division) or
   v * inv (multiply_inverse: inv is the reference's float32 of 1 / scale taken in float64), rintf, + zp (a
   float32, as the reference adds it), clamp to [lo, hi] as torch.clamp (min then max: NaN stays NaN), then the
   code. NaN has no code: torch's float-to-integer conversion gives 0 for it on x86-64 and AArch64, and so does
   this kernel, explicitly (a C cast of NaN is undefined). DEQUANTIZE: float32(q - zp) * scale, the subtraction in
   int32 wrapping as torch's does, then stored as float32 or rounded to bfloat16 (nearest even).

   Scales and zero points are per tensor (channels = 1) or per channel: element i's channel is (i / inner) %
   channels, so a run of `inner` elements shares one; the vectorized loops take one such run with its scalars. */
enum { F_F32 = 0, F_BF16 = 1, F_F16 = 2 };
/* elements per parallel chunk: larger than QADD's, so that a tensor of up to 64 Ki elements (a few microseconds of
   work) runs on the calling thread alone, with no team to wake (a descheduled member of a loaded machine's team
   holds up the whole region) */
#define QDQ_CHUNK 65536
enum { T_I32 = 2 };

/* qdq_packed's argument block: 14 int64 then 2 doubles (_QDQ_ARGS in cpu_qelementwise.py); scale, inv and zp
   point to `channels` float32 values each (zp: int32 for DEQUANTIZE; inv unread by it) */
typedef struct {
    int64_t x, y, scale, inv, zp, n, channels, inner, x_type, y_type, quantize, multiply, nthreads, isa;
    double lo, hi;
} QdqArgs;

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

/* exact: the magnitude's bits moved into float32's fields and scaled by 2^112 (a power of two: a float16 subnormal,
   then a float32 subnormal, becomes normal exactly; no FTZ/DAZ at -O3 without fast-math), inf and NaN given
   float32's top exponent; no branches, so that AVX2 vectorizes it too */
static inline float f16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)(h & 0x7fff) << 13;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    f *= 0x1p112f;
    __builtin_memcpy(&u, &f, sizeof u);
    u = f >= 65536.0f ? u | 0x7f800000u : u;
    u |= (uint32_t)(h & 0x8000) << 16;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even; NaN cannot reach it (finite scales times integers) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#define LOAD_F32(v) (v)
/* the method chosen outside the loop: a division under a condition would not vectorize (it might trap) */
#define QUANT_LOOP(TX, LOAD, TY, STEP)                                                                       \
    for (int64_t i = 0; i < n; i++) {                                                                        \
        float q = rintf(LOAD(((const TX *)x)[i]) STEP) + zp;                                                 \
        q = q < lo ? lo : q;                                                                                 \
        q = q > hi ? hi : q;                                                                                 \
        ((TY *)y)[i] = q != q ? (TY)0 : (TY)(int32_t)q;                                                      \
    }
#define QUANT_BODY(TX, LOAD, TY)                                                                             \
    if (multiply) { QUANT_LOOP(TX, LOAD, TY, * inv) } else { QUANT_LOOP(TX, LOAD, TY, / s) }

#define DEQUANT_BODY(TQ, STORE, TY)                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                                        \
        const int32_t v = (int32_t)((uint32_t)(int32_t)((const TQ *)x)[i] - (uint32_t)zp);                   \
        ((TY *)y)[i] = STORE((float)v * s);                                                                  \
    }

/* One run of n elements with one channel's scalars; one loop per type combination, vectorized per ISA. */
#define QDQ_VARIANT(SUFFIX, ATTR)                                                                            \
    ATTR static void quant_##SUFFIX(const void *x, void *y, int64_t n, int tx, int ty, int multiply, float s,  \
                                    float inv, float zp, float lo, float hi) {                               \
        switch (tx * 2 + ty) {                                                                               \
        case 0: QUANT_BODY(float, LOAD_F32, uint8_t) break;                                                  \
        case 1: QUANT_BODY(float, LOAD_F32, int8_t) break;                                                   \
        case 2: QUANT_BODY(uint16_t, bf16_to_f32, uint8_t) break;                                            \
        case 3: QUANT_BODY(uint16_t, bf16_to_f32, int8_t) break;                                             \
        case 4: QUANT_BODY(uint16_t, f16_to_f32, uint8_t) break;                                             \
        default: QUANT_BODY(uint16_t, f16_to_f32, int8_t) break;                                             \
        }                                                                                                    \
    }                                                                                                        \
    ATTR static void dequant_##SUFFIX(const void *x, void *y, int64_t n, int tq, int ty, float s,             \
                                      int32_t zp) {                                                          \
        switch (tq * 2 + ty) {                                                                               \
        case 0: DEQUANT_BODY(uint8_t, LOAD_F32, float) break;                                                \
        case 1: DEQUANT_BODY(uint8_t, f32_to_bf16, uint16_t) break;                                          \
        case 2: DEQUANT_BODY(int8_t, LOAD_F32, float) break;                                                 \
        case 3: DEQUANT_BODY(int8_t, f32_to_bf16, uint16_t) break;                                           \
        case 4: DEQUANT_BODY(int32_t, LOAD_F32, float) break;                                                \
        default: DEQUANT_BODY(int32_t, f32_to_bf16, uint16_t) break;                                         \
        }                                                                                                    \
    }

QDQ_VARIANT(c, )
#if defined(__x86_64__)
QDQ_VARIANT(avx2, __attribute__((target("avx2"))))
QDQ_VARIANT(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))
#endif

static const int X_SIZE[] = {4, 2, 2};        /* QUANTIZE's x: F_F32, F_BF16, F_F16 */
static const int Q_SIZE[] = {1, 1, 4};        /* DEQUANTIZE's codes: T_U8, T_I8, T_I32 */

/* Elements [start, start + n): split into runs of one channel, each run by the ISA's loop. */
static void qdq_range(int isa, const QdqArgs *a, int64_t start, int64_t n) {
    const float *scale = (const float *)(intptr_t)a->scale, *inv = (const float *)(intptr_t)a->inv;
    const int tx = (int)a->x_type, ty = (int)a->y_type;
    const int xsize = a->quantize ? X_SIZE[tx] : Q_SIZE[tx], ysize = a->quantize ? 1 : (ty == F_F32 ? 4 : 2);
    const float lo = (float)a->lo, hi = (float)a->hi;
    for (int64_t i = start, end = start + n; i < end;) {
        const int64_t row = i / a->inner, c = row % a->channels;
        const int64_t stop = (row + 1) * a->inner < end ? (row + 1) * a->inner : end;
        const void *px = (const char *)(intptr_t)a->x + i * xsize;
        void *py = (char *)(intptr_t)a->y + i * ysize;
        const int64_t m = stop - i;
        if (a->quantize) {
            const float zp = ((const float *)(intptr_t)a->zp)[c];
#if defined(__x86_64__)
            if (isa >= ISA_AVX512) quant_avx512(px, py, m, tx, ty, (int)a->multiply, scale[c], inv[c], zp, lo, hi);
            else if (isa == ISA_AVX2) quant_avx2(px, py, m, tx, ty, (int)a->multiply, scale[c], inv[c], zp, lo, hi);
            else
#endif
            quant_c(px, py, m, tx, ty, (int)a->multiply, scale[c], inv[c], zp, lo, hi);
        } else {
            const int32_t zp = ((const int32_t *)(intptr_t)a->zp)[c];
#if defined(__x86_64__)
            if (isa >= ISA_AVX512) dequant_avx512(px, py, m, tx, ty, scale[c], zp);
            else if (isa == ISA_AVX2) dequant_avx2(px, py, m, tx, ty, scale[c], zp);
            else
#endif
            dequant_c(px, py, m, tx, ty, scale[c], zp);
        }
        i = stop;
    }
}

/* 0, or -2 for arguments out of range */
static int qdq(const QdqArgs *a) {
    if (a->n < 0 || a->channels < 1 || a->inner < 1 || a->x_type < 0 || a->y_type < 0
        || (a->quantize ? a->x_type > F_F16 || a->y_type > T_I8 : a->x_type > T_I32 || a->y_type > F_BF16))
        return -2;
    int isa = (int)a->isa;
    if (isa > qadd_isa()) isa = qadd_isa();
    const int64_t chunks = (a->n + QDQ_CHUNK - 1) / QDQ_CHUNK;
    const int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads;
    if (nthreads <= 1 || chunks <= 1) {
        qdq_range(isa, a, 0, a->n);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(nthreads) schedule(static)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t start = c * QDQ_CHUNK, left = a->n - start;
        qdq_range(isa, a, start, left < QDQ_CHUNK ? left : QDQ_CHUNK);
    }
    return 0;
}

int qdq_packed(const void *block) {
    QdqArgs a;
    __builtin_memcpy(&a, block, sizeof a);
    return qdq(&a);
}

/* QLUT: y[i] = table[x[i]] over bytes (int8 codes as their bytes: the table is indexed so), the table made by the
   op's numerics when the weights are bound (cpu_qelementwise.py, QLut). y may be x itself (no restrict: each
   element is read before it is written). Plain C: one byte load per element (~1 cycle). AVX2: 32 bytes at a time,
   the table as 16 rows of 16 bytes: for each row k, vpshufb picks row k's entries by the low nibbles and a byte
   blend keeps them where the high nibble is k (~0.5 cycle a byte); the tail in C. Parallel in chunks as QUANTIZE.
   0, or -2 for a negative count. */
static void qlut_c(const uint8_t *x, uint8_t *y, int64_t n, const uint8_t *restrict table) {
    for (int64_t i = 0; i < n; i++) y[i] = table[x[i]];
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void qlut_avx2(const uint8_t *x, uint8_t *y, int64_t n,
                                                       const uint8_t *restrict table) {
    __m256i rows[16];
    for (int k = 0; k < 16; k++)
        rows[k] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(table + 16 * k)));
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
        const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        __m256i r = _mm256_setzero_si256();
        for (int k = 0; k < 16; k++) {
            const __m256i row_k = _mm256_cmpeq_epi8(hi, _mm256_set1_epi8((char)k));
            r = _mm256_blendv_epi8(r, _mm256_shuffle_epi8(rows[k], lo), row_k);
        }
        _mm256_storeu_si256((__m256i *)(y + i), r);
    }
    qlut_c(x + i, y + i, n - i, table);
}
#endif

int qlut_map(const uint8_t *x, uint8_t *y, int64_t n, const uint8_t *restrict table, int64_t nthreads, int64_t isa) {
    if (n < 0) return -2;
    if (isa > qadd_isa()) isa = qadd_isa();
    const int64_t chunks = (n + QDQ_CHUNK - 1) / QDQ_CHUNK;
    const int threads = nthreads < 1 ? 1 : (int)nthreads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && chunks > 1)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t start = c * QDQ_CHUNK, m = n - start < QDQ_CHUNK ? n - start : QDQ_CHUNK;
#if defined(__x86_64__)
        if (isa >= ISA_AVX2) { qlut_avx2(x + start, y + start, m, table); continue; }
#endif
        qlut_c(x + start, y + start, m, table);
    }
    return 0;
}
