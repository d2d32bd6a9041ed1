/* The fp32 FMA peak of one core: the compute floor bench/gemv/prefill.py compares the prefill GEMMs with.

   Built by prefill.py with the runtime's own build (npu_runtime/backends/cpu_gemv_build.py), like stream_read.c.
   Twelve independent chains of 8-lane FMAs held in registers: more than the FMA units' latency times their number
   (4 cycles x 2 units on Zen 3 and recent Intel cores), so the units, not a chain, set the rate. */
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

int fma_peak_isa(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* 96 multiply-adds an iteration; the sum of the chains' lanes, so that none is dropped. */
AVX2 float fma_peak_run(int64_t iters) {
    __m256 acc[12];
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    for (int i = 1; i < 12; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    float lanes[8], sum = 0.0f;
    _mm256_storeu_ps(lanes, acc[0]);
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}
#else
int fma_peak_isa(void) { return 0; }
float fma_peak_run(int64_t iters) { (void)iters; return 0.0f; }
#endif
