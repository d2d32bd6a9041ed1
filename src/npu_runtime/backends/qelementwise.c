/* Quantized elementwise add of the CPU backend: y = quantize(act(dequantize(a) + dequantize(b))), bit-exact with
   the QADD op's reference (torch_ir.ops.npu_quant.qadd), which is the QDQ chain DEQUANTIZE, add, relu, QUANTIZE.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py (open_library) and called through ctypes by
   cpu_qelementwise.py, which checks every pointer and size, makes the three tensors flat and contiguous (or
   computes through a copy) and refuses scales that are not finite. Keep the argument block (QAddArgs) in step
   with _ARGS there.

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
#ifdef _OPENMP
#include <omp.h>
#endif

enum { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { T_U8 = 0, T_I8 = 1 };
#define CHUNK 16384  /* elements per parallel chunk */

/* qadd_packed's argument block: 13 int64 then 7 doubles, each an exact float32 (_ARGS in cpu_qelementwise.py) */
typedef struct {
    int64_t a, b, y, n, a_type, b_type, y_type, a_zp, b_zp, relu, multiply, nthreads, isa;
    double a_scale, b_scale, y_scale, inv, y_zp, lo, hi;
} QAddArgs;

typedef struct {
    float sa, sb, ys, inv, zy, lo, hi;
    int32_t za, zb;
    int relu, multiply;
} Steps;

#define QADD_BODY(TA, TB, TY)                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                                        \
        const float va = (float)((int32_t)((const TA *)a)[i] - p->za) * p->sa;                              \
        const float vb = (float)((int32_t)((const TB *)b)[i] - p->zb) * p->sb;                              \
        float s = va + vb;                                                                                   \
        if (p->relu) s = s > 0.0f ? s : 0.0f;                                                                \
        float q = p->multiply ? s * p->inv : s / p->ys;                                                      \
        q = rintf(q) + p->zy;                                                                                \
        q = q < p->lo ? p->lo : q;                                                                           \
        q = q > p->hi ? p->hi : q;                                                                           \
        ((TY *)y)[i] = (TY)(int32_t)q;                                                                       \
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

static void run_range(int isa, const QAddArgs *a, const Steps *p, int64_t start, int64_t n) {
    const char *pa = (const char *)(intptr_t)a->a + start, *pb = (const char *)(intptr_t)a->b + start;
    char *py = (char *)(intptr_t)a->y + start;
    const int ta = (int)a->a_type, tb = (int)a->b_type, ty = (int)a->y_type;
#if defined(__x86_64__)
    if (isa >= ISA_AVX512) { qadd_avx512(pa, pb, py, n, ta, tb, ty, p); return; }
    if (isa == ISA_AVX2) { qadd_avx2(pa, pb, py, n, ta, tb, ty, p); return; }
#endif
    (void)isa;
    qadd_c(pa, pb, py, n, ta, tb, ty, p);
}

/* 0, or -2 for arguments out of range (a zero point outside [-255, 255]: no 8-bit code's). */
static int qadd(const QAddArgs *a) {
    if (a->n < 0 || a->a_type < T_U8 || a->a_type > T_I8 || a->b_type < T_U8 || a->b_type > T_I8
        || a->y_type < T_U8 || a->y_type > T_I8 || a->a_zp < -255 || a->a_zp > 255 || a->b_zp < -255
        || a->b_zp > 255) return -2;
    const Steps p = {(float)a->a_scale, (float)a->b_scale, (float)a->y_scale, (float)a->inv, (float)a->y_zp,
                     (float)a->lo, (float)a->hi, (int32_t)a->a_zp, (int32_t)a->b_zp, (int)a->relu,
                     (int)a->multiply};
    int isa = (int)a->isa;
    if (isa > qadd_isa()) isa = qadd_isa();
    const int64_t chunks = (a->n + CHUNK - 1) / CHUNK;
    const int nthreads = a->nthreads < 1 ? 1 : (int)a->nthreads;
    if (nthreads <= 1 || chunks <= 1) {
        run_range(isa, a, &p, 0, a->n);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(nthreads) schedule(static)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t start = c * CHUNK, left = a->n - start;
        run_range(isa, a, &p, start, left < CHUNK ? left : CHUNK);
    }
    return 0;
}

/* qadd() with its arguments in one block (_ARGS in cpu_qelementwise.py): one ctypes argument is cheaper. */
int qadd_packed(const void *block) {
    QAddArgs a;
    __builtin_memcpy(&a, block, sizeof a);  /* a Python bytes object: no alignment promised */
    return qadd(&a);
}
