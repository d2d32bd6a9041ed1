/* bf16 and IEEE fp16 <-> fp32, one definition for the kernels that read or write half tensors (gemv.c, gemv_q.c's
   parts, decode_ops.c): the loader (cpu_gemv_build.HALF_SOURCE) puts this file before each of them in one
   translation unit. Widening is exact; narrowing rounds to nearest even as c10's BFloat16 and Half do (NaN stays a
   NaN, fp16 overflows to inf). Plain C, and F16C forms of the fp16 ones (below) with the same bits: every ISA variant
   of a kernel gets the same bits. */
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {          /* round to nearest even; NaN stays a (quiet) NaN */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (e == 0x1fu) u = sign | 0x7f800000u | (man << 13);
    else if (e != 0) u = sign | ((e + 112u) << 23) | (man << 13);
    else { float f = (float)man * (1.0f / 16777216.0f); memcpy(&u, &f, 4); u |= sign; }  /* subnormal, 0 */
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f32_to_f16(float f) {           /* round to nearest even, overflow to inf */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                              /* an fp16 subnormal: 2^24 |f| is exact, < 2^10 */
        float v; memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint32_t)__builtin_rintf(v * 16777216.0f));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

/* The fp16 conversions by F16C, for the x86 kernels (gemv.c's epilogues and x, decode_ops.c's x86 variants): the
   bits above (widening is exact; F16C rounds to nearest even, NaN stays a NaN, overflow gives inf), ~10x faster.
   Not always_inline: a portable kernel never calls them and may not inline them. Elsewhere, the C above. */
#if defined(__x86_64__)
#include <immintrin.h>
#define HALF_F16C __attribute__((target("avx2,f16c")))
static inline HALF_F16C float f16c_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline HALF_F16C uint16_t f32_to_f16c(float v) { return (uint16_t)_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); }
static inline HALF_F16C void f16c_row(float *dst, const uint16_t *src, int64_t n) {  /* n values, widened */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
#else
static inline float f16c_to_f32(uint16_t h) { return f16_to_f32(h); }
static inline uint16_t f32_to_f16c(float v) { return f32_to_f16(v); }
static inline void f16c_row(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}
#endif
