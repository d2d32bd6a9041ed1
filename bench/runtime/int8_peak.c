/* The int8 dot-product peak of this CPU: how many multiply-adds per second one core's vector units do with each way
   of summing int8 products, in register-resident loops (no memory traffic, many independent accumulators), so
   the only limit is the instructions' throughput. bench/runtime/int8_peak.py compiles it (cpu_gemv_build, the
   kernels' compiler and cache) and prints the rates beside our QCONV's: no convolution summing that way runs faster.

   kind 0, exact on AVX2: vpmaddwd on int16 pairs then vpaddd, 16 products an instruction pair. This is what
          qconv.c's AVX2 tile does (x widened to int16): no sum can saturate.
   kind 1, saturating on AVX2: vpmaddubsw (uint8 x int8, pairs summed into int16 with saturation), vpmaddwd by
          ones, vpaddd: 32 products for three instructions. onnxruntime's and OpenVINO's AVX2 int8 kernels sum
          this way; a pair beyond 32767 is clipped, so their result is not exact.
   kind 2, exact with AVX-512 VNNI: vpdpbusd, 64 products an instruction (qconv.c's VNNI tile).
   Each returns a checksum the caller verifies against its own arithmetic: the loops did the products asked.
   Not a kernel of the runtime; a benchmark's probe. */
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#endif

/* 1: AVX2, 2: AVX-512 VNNI as well, 0: neither (no probe runs) */
int int8_peak_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512vnni") ? 2 : 1;
#else
    return 0;
#endif
}

#if defined(__x86_64__)
#define ACCS 6  /* independent accumulators (more than latency x throughput), each with its own x: 12 of 16 ymm */

/* The accumulators' 32-bit lanes summed, as int64: the checksum. */
static AVX2 int64_t lanes256(__m256i a) {
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, a);
    int64_t s = 0;
    for (int l = 0; l < 8; l++) s += v[l];
    return s;
}

/* Six named accumulators and xs (not arrays, which GCC kept in memory through the loop), x = 3 (int16 or uint8
   lanes), w = -2 (int16 or int8), iters rounds of six instruction groups. The empty asm says each x may have
   changed, so the compiler cannot hoist or merge the products out of the loop. */
#define SIX(S) S(0) S(1) S(2) S(3) S(4) S(5)
#define DECLARE(i) __m256i acc##i = _mm256_setzero_si256(), x##i = x;
#define TOUCH __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5))
#define CHECKSUM(i) s += lanes256(acc##i);

static AVX2 int64_t madd16(int64_t iters) {
    const __m256i x = _mm256_set1_epi16(3), w = _mm256_set1_epi16(-2);
    SIX(DECLARE)
#define MADD(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(x##i, w));
    for (int64_t it = 0; it < iters; it++) { TOUCH; SIX(MADD) }
    int64_t s = 0;
    SIX(CHECKSUM)
    return s;
}

static AVX2 int64_t maddubs8(int64_t iters) {
    const __m256i x = _mm256_set1_epi8(3), w = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    SIX(DECLARE)
#define MADDUBS(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(_mm256_maddubs_epi16(x##i, w), ones));
    for (int64_t it = 0; it < iters; it++) { TOUCH; SIX(MADDUBS) }
    int64_t s = 0;
    SIX(CHECKSUM)
    return s;
}

static VNNI int64_t dpbusd(int64_t iters) {
    const __m512i x = _mm512_set1_epi8(3), w = _mm512_set1_epi8(-2);
    __m512i acc[ACCS];
    for (int i = 0; i < ACCS; i++) acc[i] = _mm512_setzero_si512();
    for (int64_t it = 0; it < iters; it++)  /* each instruction reads its accumulator: nothing to hoist */
        for (int i = 0; i < ACCS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], x, w);
    int64_t s = 0;
    for (int i = 0; i < ACCS; i++) s += _mm512_reduce_add_epi32(acc[i]);
    return s;
}
#endif

/* Run probe `kind` for `iters` rounds; its checksum, or INT64_MIN when this CPU lacks the instructions. A round is
   ACCS instructions of 16 (kind 0), 32 (1) or 64 (2) products each, every product 3 * -2. */
int64_t int8_peak_run(int kind, int64_t iters) {
#if defined(__x86_64__)
    const int isa = int8_peak_isa();
    if (kind == 0 && isa >= 1) return madd16(iters);
    if (kind == 1 && isa >= 1) return maddubs8(iters);
    if (kind == 2 && isa >= 2) return dpbusd(iters);
#endif
    (void)kind, (void)iters;
    return INT64_MIN;
}
