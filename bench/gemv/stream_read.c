/* The streaming-read loop of bench/gemv: the floor a decode step's GEMVs are compared with.

   Built by bandwidth.py with the runtime's own build (npu_runtime/backends/cpu_gemv_build.py: the same
   compiler, flags and cache as the GEMV kernel, gemv.c), so that both are compiled alike. */
#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define GEMV_X86 1
#endif

#ifdef GEMV_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) AVX2 float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* 1: the AVX2 loop runs on this CPU (the same test as gemv.c's gemv_isa), 0: the portable one */
int stream_isa(void) {
#ifdef GEMV_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

/* The sum of n floats read by nthreads threads, in chunks of 256 KiB handed out like the GEMV's, each read
   as 8 streams of 32 KiB side by side: the fastest plain read measured here (8.7 GB/s one stream, 13.5 eight
   streams, one thread), so that the floor it sets for the GEMV is the machine's, not a weak loop's. */
#define SR_CHUNK 65536
#define SR_STREAMS 8
#ifdef GEMV_X86
static AVX2 float sum_avx2(const float *p, int64_t n) {
    const int64_t part = n / SR_STREAMS / 8 * 8;
    __m256 a[SR_STREAMS];
    for (int r = 0; r < SR_STREAMS; r++) a[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < part; i += 8)
        for (int r = 0; r < SR_STREAMS; r++) a[r] = _mm256_add_ps(a[r], _mm256_loadu_ps(p + r * part + i));
    __m256 t = a[0];
    for (int r = 1; r < SR_STREAMS; r++) t = _mm256_add_ps(t, a[r]);
    float s = hsum8(t);
    for (int64_t i = SR_STREAMS * part; i < n; i++) s += p[i];
    return s;
}
#endif
static float sum_generic(const float *p, int64_t n) {
    const int64_t part = n / SR_STREAMS;
    float acc[SR_STREAMS] = {0};
    for (int64_t i = 0; i < part; i++)
        for (int r = 0; r < SR_STREAMS; r++) acc[r] += p[r * part + i];
    float s = 0.0f;
    for (int r = 0; r < SR_STREAMS; r++) s += acc[r];
    for (int64_t i = SR_STREAMS * part; i < n; i++) s += p[i];
    return s;
}
double stream_read(const float *p, int64_t n, int nthreads, int isa) {
    const int64_t chunks = (n + SR_CHUNK - 1) / SR_CHUNK;
    double total = 0.0;
    if (nthreads < 1) nthreads = 1;
    (void)isa;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1) reduction(+:total)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * SR_CHUNK, len = i0 + SR_CHUNK < n ? SR_CHUNK : n - i0;
#ifdef GEMV_X86
        if (isa == 1) { total += sum_avx2(p + i0, len); continue; }
#endif
        total += sum_generic(p + i0, len);
    }
    return total;
}
