/* The small ops of a one-token decode step, one C call each: RMS_NORM, ROPE_QK and ATTENTION over a KV cache
   (grouped-query heads), fp32, bf16 and fp16 tensors, fp32 arithmetic; GATE_UP's silu(gate)·up; and what a whole
   step made by one C call needs (cpu_chain.py): the glue between kernels (a copy, a residual add, the cache update
   of one position) and dops_chain, which makes a list of calls.

   Compiled on first use by npu_runtime/backends/cpu_gemv_build.py and called through ctypes by
   cpu_decode_ops.py, whose docstring explains why. The Python side checks every pointer, shape and size
   before a call: this code trusts them. Keep in step with cpu_decode_ops.py: the dtype and mask codes and the
   argument blocks (_RMS, _ROPE, _ATTN, _SILU, _ADD, _COPY, _KV).

   Rounding: products and sums are never fused into FMAs (fp-contract off below), so each result is rounded
   where PyTorch rounds it, and the sums run in a fixed order of 16 independent lanes, so the portable, AVX2
   and AVX-512 builds of a function (the same code, vectorized for each) give the same bits. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#define DOPS_X86 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
/* fp16 in the x86 variants: the same dtype, converted by F16C's instructions (half.c's plain C takes ~10x as long,
   which made an fp16 model's attention, RMS_NORM and ROPE_QK 2.4x its bf16 twin's). The same bits: widening is
   exact either way, and narrowing rounds to nearest even, as half.c does (NaN stays a NaN, overflow gives inf). */
enum { DT_F16C = 3 };
enum { MASK_NONE = 0, MASK_BOOL = 1, MASK_ADD_F32 = 2, MASK_ADD_BF16 = 3, MASK_ADD_F16 = 4 };
enum { ISA_C = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
#define GL 16  /* lanes of a sum: what AVX-512 holds in one register, AVX2 in two */
#define ALWAYS static inline __attribute__((always_inline))

/* bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16 and their F16C forms (f16c_to_f32, f32_to_f16c, f16c_row):
   half.c, before this file */
#ifdef DOPS_X86
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))  /* the AVX2 variants' */
#endif
ALWAYS float half_to_f32(const int dt, uint16_t h) {
    return dt == DT_BF16 ? bf16_to_f32(h) : dt == DT_F16C ? f16c_to_f32(h) : f16_to_f32(h);
}
ALWAYS uint16_t f32_to_half(const int dt, float v) {
    return dt == DT_BF16 ? f32_to_bf16(v) : dt == DT_F16C ? f32_to_f16c(v) : f32_to_f16(v);
}
ALWAYS float ld(const void *p, const int dt, int64_t i) {
    return dt == DT_F32 ? ((const float *)p)[i] : half_to_f32(dt, ((const uint16_t *)p)[i]);
}
ALWAYS void st(void *p, const int dt, int64_t i, float v) {
    if (dt == DT_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = f32_to_half(dt, v);
}
/* v rounded to the tensor's dtype, as a PyTorch op of that dtype rounds each result */
ALWAYS float rnd(const int dt, float v) { return dt == DT_F32 ? v : half_to_f32(dt, f32_to_half(dt, v)); }

ALWAYS float lanes_sum(const float *acc) {  /* a tree, halving: 4 levels rather than 15 dependent adds */
    float h8[8], h4[4];
    for (int l = 0; l < 8; l++) h8[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) h4[l] = h8[l] + h8[l + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}
ALWAYS float dot(const float *a, const float *b, int64_t n) {
    float acc[GL] = {0};
    int64_t i = 0;
    for (; i + GL <= n; i += GL)
        for (int l = 0; l < GL; l++) acc[l] += a[i + l] * b[i + l];
    float s = lanes_sum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
ALWAYS void to_f32(float *dst, const void *src, const int dt, int64_t n) {
    if (dt == DT_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == DT_F16C) f16c_row(dst, (const uint16_t *)src, n);
    else for (int64_t i = 0; i < n; i++) dst[i] = half_to_f32(dt, ((const uint16_t *)src)[i]);
}

/* exp by a polynomial in plain C (no libm call: every variant vectorizes it alike, the same bits; built without FP
   traps, cpu_decode_ops.EXTRA_FLAGS, or gcc keeps its loops scalar in AVX2), within ~2 ulp of expf; overflow as
   expf: inf above 88.72, 0 below -87.34 (-inf gives 0); a NaN stays NaN. */
ALWAYS float exp_poly(float x) {
    const float c = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);  /* NaN passes through */
    const float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round(c / ln 2), ties to even */
    const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;   /* ln 2 in two parts: r exact enough */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * r) * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;                   /* 2^n, n in [-126, 127] */
    float two_n;
    memcpy(&two_n, &bits, 4);
    const float e = p * two_n;
    return x > 88.72283f ? INFINITY : (x < -87.33654f ? 0.0f : e);
}

/* ---------------------------------------------------------------------------------------------- RMS_NORM */
/* y = rnd(x · 1/sqrt(mean(x²) + eps)) · w per row of n, as npu_runtime's RmsNorm and torch_ir's rms_norm. */
typedef struct { int64_t rows, n; const void *x, *w; void *y; int64_t dt; double eps; int64_t isa; } RmsArgs;

ALWAYS void rms_body(const RmsArgs *a, const int dt) {
    const int64_t n = a->n;
    const float eps = (float)a->eps;
    for (int64_t r = 0; r < a->rows; r++) {
        const int64_t o = r * n;
        float acc[GL] = {0};
        int64_t i = 0;
        for (; i + GL <= n; i += GL)
            for (int l = 0; l < GL; l++) { float v = ld(a->x, dt, o + i + l); acc[l] += v * v; }
        float ss = lanes_sum(acc);
        for (; i < n; i++) { float v = ld(a->x, dt, o + i); ss += v * v; }
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
        /* y may be x itself: each element is read before it is written */
        if (a->w) for (i = 0; i < n; i++) st(a->y, dt, o + i, rnd(dt, ld(a->x, dt, o + i) * scale) * ld(a->w, dt, i));
        else for (i = 0; i < n; i++) st(a->y, dt, o + i, ld(a->x, dt, o + i) * scale);
    }
}

/* ----------------------------------------------------------------------------------------------- ROPE_QK */
/* y = x·cos + rotate_half(x)·sin for every row of D of q and of k, one cos and sin row for all; each product
   and the sum rounded to the dtype, as torch_ir's rope. */
typedef struct {
    int64_t q_rows, k_rows, D; const void *q, *k, *cos, *sin; void *q_out, *k_out; int64_t dt, isa;
} RopeArgs;

ALWAYS void rope_rows(const void *x, void *y, const void *c, const void *s, int64_t rows, int64_t D, const int dt) {
    const int64_t half = D / 2;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r * D;
        for (int64_t i = 0; i < half; i++) {  /* both halves of a pair read before either is written: y may be x */
            const float lo = ld(x, dt, o + i), hi = ld(x, dt, o + half + i);
            const float y_lo = rnd(dt, lo * ld(c, dt, i)) + rnd(dt, -hi * ld(s, dt, i));
            const float y_hi = rnd(dt, hi * ld(c, dt, half + i)) + rnd(dt, lo * ld(s, dt, half + i));
            st(y, dt, o + i, y_lo);
            st(y, dt, o + half + i, y_hi);
        }
    }
}
ALWAYS void rope_body(const RopeArgs *a, const int dt) {
    rope_rows(a->q, a->q_out, a->cos, a->sin, a->q_rows, a->D, dt);
    rope_rows(a->k, a->k_out, a->cos, a->sin, a->k_rows, a->D, dt);
}

/* --------------------------------------------------------------------------------------------- ATTENTION */
/* One query token per batch row: out[b, h] = softmax(q[b,h]·k[b,h/g]ᵀ·scale + mask[b,h]) · v[b,h/g], with
   q [B,H,1,D], k and v [B,Hkv,S,D] (the cache, read where it lies), out [B,H,D] (for one token, the merged
   [B,1,H·D] is the same memory), g = H/Hkv. The mask element of (b, h, s) is mask[b·mask_sb + h·mask_sh + s]:
   a bool (0 hides the position) or an additive fp32/bf16/fp16. Scores, softmax and the weighted sum in fp32.

   A hidden position (a false bool, or a score of -inf) adds exp(-inf) = 0 to the softmax sum and 0·v to the
   weighted sum, so it is skipped: the positions some head of the group sees are listed first, and only their
   k and v rows are read. A row whose softmax is not a number (every position hidden, a NaN or +inf score)
   gives zeros, as PyTorch's kernel and the reference do.

   scratch (fp32): g·S scores, g·D query, g·D accumulators, one row of D, then S int32 positions. */
typedef struct {
    int64_t B, H, Hkv, S, D; const void *q, *k, *v, *mask; int64_t mask_kind, mask_sb, mask_sh;
    void *out; float *scratch; int64_t dt; double scale; int64_t isa;
} AttnArgs;

ALWAYS float mask_add(const AttnArgs *a, int64_t at) {  /* what the mask adds to a score: -inf hides it */
    if (a->mask_kind == MASK_BOOL) return ((const uint8_t *)a->mask)[at] ? 0.0f : -INFINITY;
    if (a->mask_kind == MASK_ADD_F32) return ((const float *)a->mask)[at];
    return half_to_f32(a->mask_kind == MASK_ADD_BF16 ? DT_BF16 : DT_F16, ((const uint16_t *)a->mask)[at]);
}

/* The positions some of the g heads from mask offset m0 see (in order) into pos; their count. */
ALWAYS int64_t attn_visible(const AttnArgs *a, int64_t m0, int64_t g, int32_t *pos) {
    int64_t n = 0;
    const int64_t heads = a->mask_sh ? g : 1;  /* a mask broadcast over heads is one row for all */
    for (int64_t s = 0; s < a->S; s++) {
        int seen = a->mask_kind == MASK_NONE;
        for (int64_t j = 0; j < heads && !seen; j++) seen = mask_add(a, m0 + j * a->mask_sh + s) != -INFINITY;
        if (seen) pos[n++] = (int32_t)s;
    }
    return n;
}

/* sc[j·n + i] = q_j · k[pos[i]] · scale + mask (j < g): -inf where the mask hides it from head j. */
ALWAYS void attn_scores(const AttnArgs *a, const char *k, int64_t m0, const int32_t *pos, int64_t n, const float *qf,
                        float *sc, float *row, const int dt) {
    const int64_t g = a->H / a->Hkv, D = a->D, esz = dt == DT_F32 ? 4 : 2;
    const float scale = (float)a->scale;
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = pos[i];
        const void *src = k + (size_t)(s * D) * esz;
        const float *kr = (const float *)src;
        if (dt != DT_F32) { to_f32(row, src, dt, D); kr = row; }  /* converted once for the g heads */
        for (int64_t j = 0; j < g; j++) {
            const float add = a->mask_kind == MASK_NONE ? 0.0f : mask_add(a, m0 + j * a->mask_sh + s);
            const float score = add == -INFINITY ? -INFINITY : dot(qf + j * D, kr, D) * scale;
            sc[j * n + i] = a->mask_kind == MASK_BOOL || add == -INFINITY ? score : score + add;
        }
    }
}

/* softmax of each of the g rows of n scores, in place; a hidden position keeps -inf (the weighted sum skips it).
   ok[j]: whether row j's softmax is a number (else its output is zeros). */
ALWAYS void attn_softmax(float *sc, int64_t g, int64_t n, unsigned char *ok) {
    for (int64_t j = 0; j < g; j++) {
        float *r = sc + j * n, mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) if (r[i] > mx) mx = r[i];
        /* exp_poly, not expf, and GL lanes of sums: plain loops every variant vectorizes (expf's calls were ~40 %
           of the time at S = 2048); a hidden position keeps its -inf (the weighted sum skips it), adding 0 */
        for (int64_t i = 0; i < n; i++) {
            const float e = exp_poly(r[i] - mx);
            r[i] = r[i] == -INFINITY ? -INFINITY : e;
        }
        float acc[GL] = {0};
        int64_t i = 0;
        for (; i + GL <= n; i += GL)
            for (int l = 0; l < GL; l++) acc[l] += r[i + l] == -INFINITY ? 0.0f : r[i + l];
        float sum = lanes_sum(acc);
        for (; i < n; i++) sum += r[i] == -INFINITY ? 0.0f : r[i];
        ok[j] = sum > 0.0f;  /* false for NaN (a NaN or +inf score) and for 0 (every position hidden) */
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < n; i++) r[i] *= inv;  /* a hidden -inf stays -inf (inv > 0 where ok[j]) */
    }
}

ALWAYS void attn_body(const AttnArgs *a, const int dt) {
    const int64_t g = a->H / a->Hkv, S = a->S, D = a->D, esz = dt == DT_F32 ? 4 : 2;
    float *sc = a->scratch, *qf = sc + g * S, *acc = qf + g * D, *row = acc + g * D;
    int32_t *pos = (int32_t *)(row + D);
    unsigned char ok[256];  /* g <= 256: checked in Python */
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t kvh = 0; kvh < a->Hkv; kvh++) {
            const int64_t h0 = kvh * g, m0 = b * a->mask_sb + h0 * a->mask_sh;
            const size_t cache = (size_t)((b * a->Hkv + kvh) * S * D) * esz;
            const int64_t n = attn_visible(a, m0, g, pos);
            to_f32(qf, (const char *)a->q + (size_t)((b * a->H + h0) * D) * esz, dt, g * D);
            attn_scores(a, (const char *)a->k + cache, m0, pos, n, qf, sc, row, dt);
            attn_softmax(sc, g, n, ok);
            memset(acc, 0, (size_t)(g * D) * sizeof(float));
            for (int64_t i = 0; i < n; i++) {
                const void *src = (const char *)a->v + cache + (size_t)(pos[i] * D) * esz;
                const float *vr = (const float *)src;
                if (dt != DT_F32) { to_f32(row, src, dt, D); vr = row; }
                for (int64_t j = 0; j < g; j++) {
                    const float p = sc[j * n + i];
                    if (p == -INFINITY || !ok[j]) continue;
                    float *y = acc + j * D;
                    for (int64_t d = 0; d < D; d++) y[d] += p * vr[d];
                }
            }
            for (int64_t j = 0; j < g; j++)
                for (int64_t d = 0; d < D; d++) st(a->out, dt, (b * a->H + h0 + j) * D + d, acc[j * D + d]);
        }
}

/* ------------------------------------------------------------------------------------------- SILU_MUL */
/* y[i] = silu(g[i]) · u[i] = g[i] / (1 + exp(-g[i])) · u[i] (GATE_UP's epilogue), fp32 arithmetic rounded to the
   dtype where PyTorch's silu then mul round it: after the silu and after the product (exp_poly: exp(-g) = inf below
   g = -88.72, so silu(-inf) is NaN, as PyTorch's). */
typedef struct { int64_t n; const void *g, *u; void *y; int64_t dt, isa; } SiluArgs;

ALWAYS void silu_body(const SiluArgs *a, const int dt) {
    for (int64_t i = 0; i < a->n; i++) {
        const float g = ld(a->g, dt, i);
        st(a->y, dt, i, rnd(dt, g / (1.0f + exp_poly(-g))) * ld(a->u, dt, i));
    }
}

/* -------------------------------------------------------------------------------- ISA variants, entry points */
/* Each op's body, specialized for its dtype, compiled three times: portable (SSE2 on x86-64, what the target
   gives elsewhere), AVX2 and AVX-512; the same operations in the same order, so the same results. */
#define BY_DTYPE(NAME, a, F16)                                                                                  \
    do { if ((a)->dt == DT_F32) NAME##_body(a, DT_F32); else if ((a)->dt == DT_BF16) NAME##_body(a, DT_BF16);  \
         else NAME##_body(a, F16); } while (0)
#define VARIANTS(NAME, ARGS)                                                                                    \
    static void NAME##_c(const ARGS *a) { BY_DTYPE(NAME, a, DT_F16); }                                          \
    X86_VARIANTS(NAME, ARGS)
#ifdef DOPS_X86
#if defined(__clang__)  /* clang takes no vector-width preference in a target attribute */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#else                   /* gcc would otherwise keep to 256-bit vectors for AVX-512 code */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c,prefer-vector-width=512"
#endif
#define X86_VARIANTS(NAME, ARGS)                                                                                \
    AVX2_TARGET static void NAME##_avx2(const ARGS *a) { BY_DTYPE(NAME, a, DT_F16C); }                          \
    __attribute__((target(AVX512_TARGET))) static void NAME##_avx512(const ARGS *a) {                        \
        BY_DTYPE(NAME, a, DT_F16C);                                                                             \
    }
#define DISPATCH(NAME, a)                                                                                       \
    do { if ((a)->isa == ISA_AVX512) NAME##_avx512(a); else if ((a)->isa == ISA_AVX2) NAME##_avx2(a); else NAME##_c(a); } while (0)
#else
#define X86_VARIANTS(NAME, ARGS)
#define DISPATCH(NAME, a) NAME##_c(a)
#endif

VARIANTS(rms, RmsArgs)
VARIANTS(rope, RopeArgs)
VARIANTS(attn, AttnArgs)
VARIANTS(silu, SiluArgs)

/* The best ISA this CPU runs (asked at run time: one .so serves any x86-64); Python may pass a lower one. */
int dops_isa(void) {
#ifdef DOPS_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    return avx2 ? ISA_AVX2 : ISA_C;
#else
    return ISA_C;
#endif
}
int dops_openmp(void) { return 0; }  /* one thread by design: a decode op is microseconds of work */

/* Each entry takes one packed argument block (ctypes converts one pointer far faster than a dozen arguments). */
int dops_rms_norm(const char *block) { RmsArgs a; memcpy(&a, block, sizeof a); DISPATCH(rms, &a); return 0; }
int dops_rope(const char *block) { RopeArgs a; memcpy(&a, block, sizeof a); DISPATCH(rope, &a); return 0; }
int dops_attention(const char *block) { AttnArgs a; memcpy(&a, block, sizeof a); DISPATCH(attn, &a); return 0; }
int dops_silu_mul(const char *block) { SiluArgs a; memcpy(&a, block, sizeof a); DISPATCH(silu, &a); return 0; }

/* The glue of a chained decode step (cpu_chain.py): plain copies and fp32 adds between the kernels' buffers. */
typedef struct { int64_t n; const float *a; float *y; } AddArgs;  /* y += a, n floats */
int dops_add(const char *block) {
    AddArgs a; memcpy(&a, block, sizeof a);
    for (int64_t i = 0; i < a.n; i++) a.y[i] += a.a[i];
    return 0;
}
typedef struct { int64_t bytes; const void *src; void *dst; } CopyArgs;
int dops_copy(const char *block) {
    CopyArgs a; memcpy(&a, block, sizeof a);
    memmove(a.dst, a.src, (size_t)a.bytes);
    return 0;
}

/* KV_UPDATE of one token: row src[r] (r < rows, `bytes` each) to cache + (r·S + position)·bytes, the position read
   now from *index (an int64 the step computed). 1, nothing written, when it is outside [0, S): the caller runs
   the step's PyTorch code, which raises its own error. */
typedef struct { int64_t rows, S, bytes; const int64_t *index; const char *src; char *cache; } KvArgs;
int dops_kv_update(const char *block) {
    KvArgs a; memcpy(&a, block, sizeof a);
    const int64_t p = *a.index;
    if (p < 0 || p >= a.S) return 1;
    for (int64_t r = 0; r < a.rows; r++)
        memmove(a.cache + (size_t)((r * a.S + p) * a.bytes), a.src + (size_t)(r * a.bytes), (size_t)a.bytes);
    return 0;
}

/* A chain of calls, one ctypes call for a whole decode step: calls[2i] the address of an `int f(const char *)`
   of these libraries, calls[2i + 1] its argument block. Returns -1, or the index of the first call that did not
   return 0 (the rest not run). ns, when not NULL: each call's wall time in nanoseconds (a profile of the chain). */
typedef int (*ChainFn)(const char *);
static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
int64_t dops_chain(const int64_t *calls, int64_t n, int64_t *ns) {
    int64_t t0 = ns ? now_ns() : 0;
    for (int64_t i = 0; i < n; i++) {
        ChainFn f;
        const int64_t fn = calls[2 * i];
        memcpy(&f, &fn, sizeof f);
        const int status = f((const char *)(intptr_t)calls[2 * i + 1]);
        if (ns) { const int64_t t1 = now_ns(); ns[i] = t1 - t0; t0 = t1; }
        if (status != 0) return i;
    }
    return -1;
}
