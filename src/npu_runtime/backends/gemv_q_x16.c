/* The int8 path (activations="int8") on weights interleaved 16 rows at a time: every GGUF layout, AVX-512 VNNI
   or AVX2 (the second kernel at the end: the same records and integer sums, bit-identical results).

   Appended after gemv_q_i8k.c by the loader (one translation unit: QJob, IJob, quantize_x, IM, UNROLL, VNNI,
   chunk_end, kq_codes_c; qgemv_i8 calls x16_range below with its chunks when the call gives the interleaved copy).
   Why a second layout: in GGUF's, one block is one row's weights, so a vector holds one row's codes and every block
   of every row pays its own integer dot, its own scale multiply and its own lane sum: ~10 instructions per 32
   weights, which kept Q4_0 compute-bound at ~20 GB/s a thread and Q4_K at ~11 (the machine streams 2-4x that).
   Here a record holds block b of 16 rows side by side: their fp16 scales, then 4-byte groups of codes as
   [step t][row r][4 bytes], so one 64-byte load is 4 codes of each of the 16 rows, vpdpbusd multiplies them with 4
   bytes of x broadcast to every lane, and 8 steps leave a 32-element group's integer dot of each row in its own
   int32 lane. The scales then apply 16 rows at a time: one conversion, one multiply, one FMA per group of 16 rows.
   Codes are unsigned in the records (vpdpbusd's first operand); each lane starts at -(the offset) * (the sum of the
   q it meets), from quantize_x's xsum / xsum16:
     Q4_0 (288 bytes = 16 x 18): step t < 4 holds bytes 4t..4t+3 of each row's 16 code bytes; their low nibbles are
       elements 4t..4t+3 (they meet q[4t..]), their high nibbles 16+4t..16+4t+3 (q[16+4t..]); offset 8.
     Q5_0 (352 = 16 x 22): Q4_0's, plus the fifth bits as a 64-bit byte mask per step (OR-ed in as 16); offset 16.
     Q8_0 (544 = 16 x 34): 8 steps of each row's bytes 4t..4t+3, flipped when packed (code ^ 0x80 = code + 128).
     Q4_K (2368 = 16 x 148: 4 bytes more a row than GGUF's, its 6-bit scales and mins unpacked to bytes): codes as
       they are (0..15), scales and mins per sub-block of 32 applied in fp32 (D = d * sc, M = dmin * m, exact).
     Q6_K (3360 = 16 x 210): the 6-bit codes + 32 as a plane of low nibbles and one of high 2 bits; a group of 32 is
       two sub-blocks of 16 (steps 0-3, 4-7), whose exact sums are scaled by their int8 scales in int32.
   The enum below has each part's place. Every integer sum is exact in int32 and equals the GGUF kernels' isum (so
   the contract, gemv_q_i8.c's, is the same); only the fp32 steps differ: per row, y_n = sum over groups of
   (D_n * dx_g) * isum_g (- M_n * dx_g * sx_g for Q4_K) in group order, one FMA chain, no lane sum. So a row's result
   does not depend on how many rows of x a call has (the same steps per (row of x, row of W)), and is within fp32
   rounding of the GGUF kernels' (the tests bound it). A weight of N rows packs into ceil(N / 16) groups; the last
   group's missing rows are zero (scale 0, codes 0), their lanes computed and never stored. */

static inline int x16_type(const int qt) { return qt == QT_Q4_0 || qt == QT_Q5_0 || qt == QT_Q8_0 || is_kquant(qt); }
/* bytes of a record: 16 x the block's bytes, but Q4_K's (16 x 148: its 6-bit scales and mins unpacked to bytes) */
static inline int x16_record(const int qt) { return qt == QT_Q4_K ? 16 * 148 : 16 * block_bytes(qt); }

/* Where a record's parts lie (bytes from its start), after the 16 fp16 scales d at 0:
     Q4_0: codes at 32, 4 steps of 64 bytes (the low nibbles meet q[4t..], the high ones q[16+4t..]);
     Q5_0: the fifth bits at 32, 8 steps of a 64-bit byte mask (step t < 4: the low nibbles' elements, t >= 4: the
           high ones'); Q4_0's codes at 96;
     Q8_0: codes + 128 at 32, 8 steps of 64 bytes;
     Q4_K: dmin at 32, the sub-blocks' scales at 64 and mins at 192 (unsigned bytes, [sub-block s][row r]), codes at
           320: 4 chunks c of 8 steps (the low nibbles are sub-block 2c's elements 4t..4t+3, the high ones 2c+1's);
     Q6_K: the 16 int8 scales at 32 ([sub-block][row]), the codes' low 4 bits at 288 laid out as Q4_K's, their high 2
           bits at 2336: per step t two 64-byte planes (j = 0: the elements of the low nibbles, j = 1: of the high
           ones), chunk c's 2 bits at bits 2c..2c+1 of each byte. */
enum { X16_Q5_BITS = 32, X16_Q5_CODES = 96, X16_K_DMIN = 32, X16_K_SC = 64, X16_K_MIN = 192, X16_K_CODES = 320,
       X16_Q6_SC = 32, X16_Q6_LOW = 288, X16_Q6_HIGH = 2336 };

/* Block b of up to 16 rows (rows[r] its bytes, NULL past the weight's last row) as one record (zeroed first). */
static void x16_pack_record(const uint8_t *const rows[X16], const int qt, uint8_t *o) {
    memset(o, 0, (size_t)x16_record(qt));
    for (int r = 0; r < X16 && rows[r]; r++) {
        const uint8_t *blk = rows[r];
        uint8_t *lane = o + 4 * r;  /* this row's 4 bytes of a 64-byte step */
        if (qt == QT_Q4_0 || qt == QT_Q8_0 || qt == QT_Q5_0) {
            const int codes = qt == QT_Q5_0 ? 6 : 2, steps = qt == QT_Q8_0 ? 8 : 4;
            const int at = qt == QT_Q5_0 ? X16_Q5_CODES : 32;
            const uint8_t flip = qt == QT_Q8_0 ? 0x80 : 0;
            memcpy(o + 2 * r, blk, 2);
            for (int t = 0; t < steps; t++)
                for (int i = 0; i < 4; i++) lane[at + 64 * t + i] = blk[codes + 4 * t + i] ^ flip;
            if (qt == QT_Q5_0) {
                const uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 |
                                    (uint32_t)blk[5] << 24;
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++) {
                        const int e = t < 4 ? 4 * t + i : 16 + 4 * (t - 4) + i, bit = 4 * r + i;
                        o[X16_Q5_BITS + 8 * t + bit / 8] |= (uint8_t)(((qh >> e) & 1) << (bit % 8));
                    }
            }
            continue;
        }
        int8_t q[QKK];
        kq_codes_c(blk, qt, q);  /* Q4_K: 0..15; Q6_K: code - 32 */
        if (qt == QT_Q4_K) {
            memcpy(o + 2 * r, blk, 2);
            memcpy(o + X16_K_DMIN + 2 * r, blk + 2, 2);
            const uint8_t *sm = blk + 4;
            for (int s = 0; s < 8; s++) {
                o[X16_K_SC + 16 * s + r] = (uint8_t)(s < 4 ? sm[s] & 63 : (sm[s + 4] & 15) | ((sm[s - 4] >> 6) << 4));
                o[X16_K_MIN + 16 * s + r] = (uint8_t)(s < 4 ? sm[s + 4] & 63 : (sm[s + 4] >> 4) | ((sm[s] >> 6) << 4));
            }
        } else {
            memcpy(o + 2 * r, blk + 208, 2);
            for (int s = 0; s < 16; s++) o[X16_Q6_SC + 16 * s + r] = blk[192 + s];
        }
        const int low = qt == QT_Q4_K ? X16_K_CODES : X16_Q6_LOW;
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < 8; t++)
                for (int i = 0; i < 4; i++) {
                    const int e = 64 * c + 4 * t + i;  /* the low nibble's element; e + 32 the high one's */
                    const int u0 = qt == QT_Q4_K ? q[e] : q[e] + 32, u1 = qt == QT_Q4_K ? q[e + 32] : q[e + 32] + 32;
                    lane[low + 512 * c + 64 * t + i] = (uint8_t)((u0 & 15) | (u1 & 15) << 4);
                    if (qt == QT_Q6_K) {
                        lane[X16_Q6_HIGH + 128 * t + i] |= (uint8_t)((u0 >> 4) << (2 * c));
                        lane[X16_Q6_HIGH + 128 * t + 64 + i] |= (uint8_t)((u1 >> 4) << (2 * c));
                    }
                }
    }
}

/* Groups [g0, g1) of w (N rows of nb blocks in GGUF layout qt) into p, their records in (group, block) order. */
static void x16_pack_groups(const uint8_t *w, int64_t N, int64_t nb, const int qt, int64_t g0, int64_t g1, uint8_t *p) {
    const int64_t bs = block_bytes(qt), rec = x16_record(qt);
    for (int64_t g = g0; g < g1; g++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *rows[X16];
            for (int r = 0; r < X16; r++) rows[r] = g * X16 + r < N ? w + (g * X16 + r) * nb * bs + b * bs : NULL;
            x16_pack_record(rows, qt, p + (g * nb + b) * rec);
        }
}

/* Pack w [N, K / block elements blocks of qt] into p [ceil(N / 16) * blocks * x16_record(qt) bytes]: 0, or -2 for
   another type. */
int qpack16(const uint8_t *w, int64_t N, int64_t K, int qt, uint8_t *p, int nthreads) {
    if (!x16_type(qt)) return -2;
    const int64_t groups = (N + X16 - 1) / X16, nb = K / block_elems(qt);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthreads < 1 ? 1 : nthreads) if (nthreads > 1)
#endif
    for (int64_t g = 0; g < groups; g++) x16_pack_groups(w, N, nb, qt, g, g + 1, p);
    return 0;
}

/* qpack16() with its arguments in one block of 6 int64 (_PACK_ARGS in cpu_qgemv.py): w N K type p threads. */
int qpack16_packed(const void *block) {
    int64_t a[6];
    memcpy(a, block, sizeof a);
    return qpack16((const uint8_t *)(intptr_t)a[0], a[1], a[2], (int)a[3], (uint8_t *)(intptr_t)a[4], (int)a[5]);
}

#ifdef QG_X86
/* Prefetch 8 KiB ahead into L2: the k-quants' records are 2.3-3.3 KiB, and 2 KiB ahead into L1 (gemv_q.c's) left
   Q6_K's cold calls at ~16 GB/s where this reads ~26 (the others alike within noise, memory-bound). */
#ifndef X16_HINT
#define X16_HINT _MM_HINT_T1
#endif
#ifndef X16_AHEAD
#define X16_AHEAD 8192
#endif
/* 4 bytes of q (one step's) in every lane. */
static inline __attribute__((always_inline)) VNNI __m512i x16_bcast(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* A 32-element block (Q4_0, Q5_0, Q8_0) of group g against M rows of x: its 8 steps' codes unpacked once (u, all
   unsigned), each row's lanes starting at -(the unsigned offset) * (the block's sum of q). */
static inline __attribute__((always_inline)) VNNI
void x16_block32(const IJob *ij, const uint8_t *o, int64_t b, int64_t m0, const int M, const int qt, __m512 *acc) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const int32_t offset = qt == QT_Q4_0 ? -8 : qt == QT_Q5_0 ? -16 : -128;
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512i u[8];
    if (qt == QT_Q8_0) {
        for (int t = 0; t < 8; t++) u[t] = _mm512_loadu_si512((const void *)(o + 32 + 64 * t));
    } else {
        const uint8_t *codes = o + (qt == QT_Q5_0 ? X16_Q5_CODES : 32);
        for (int t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(codes + 64 * t));
            u[t] = _mm512_and_si512(v, m4);
            u[4 + t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        if (qt == QT_Q5_0)
            for (int t = 0; t < 8; t++) {
                __mmask64 fifth;
                memcpy(&fifth, o + X16_Q5_BITS + 8 * t, 8);
                u[t] = _mm512_or_si512(u[t], _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(16)));
            }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
    UNROLL for (int m = 0; m < M; m++) {
        const int8_t *q = ij->qx + (m0 + m) * j->K + QK * b;
        __m512i i0 = _mm512_set1_epi32(offset * ij->xsum[(m0 + m) * G + b]), i1 = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            i0 = _mm512_dpbusd_epi32(i0, u[t], x16_bcast(q + 4 * t));
            i1 = _mm512_dpbusd_epi32(i1, u[4 + t], x16_bcast(q + 16 + 4 * t));
        }
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(ij->dx[(m0 + m) * G + b])),
                                 _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[m]);
    }
}

/* 16 bytes of a record's [sub-block][row] table as fp32 lanes (unsigned: Q4_K's scales and mins). */
static inline __attribute__((always_inline)) VNNI __m512 x16_u8_ps(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* A Q4_K super-block of group g against M rows of x: per chunk c its 8 steps' two nibbles (sub-blocks 2c and 2c+1),
   then per row of x and sub-block s: acc += (D_s * dx_s) * isum_s, acc -= M_s * (dx_s * sx_s), D_s = d * sc_s and
   M_s = dmin * m_s exact (11 x 6 bits), 16 rows at a time (one accumulator a row of x: with 8 rows of x a second
   one for the mins spilled the unpacked codes). */
static inline __attribute__((always_inline)) VNNI
void x16_q4k(const IJob *ij, const uint8_t *o, int64_t b, int64_t m0, const int M, __m512 *acc) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + X16_K_DMIN)));
    for (int c = 0; c < 4; c++) {
        __m512i u[16];
        for (int t = 0; t < 8; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(o + X16_K_CODES + 512 * c + 64 * t));
            u[t] = _mm512_and_si512(v, m4);
            u[8 + t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        for (int h = 0; h < 2; h++) {
            const int s = 2 * c + h;
            const __m512 D = _mm512_mul_ps(d, x16_u8_ps(o + X16_K_SC + 16 * s));
            const __m512 Mn = _mm512_mul_ps(dmin, x16_u8_ps(o + X16_K_MIN + 16 * s));
            UNROLL for (int m = 0; m < M; m++) {
                const int64_t g = (m0 + m) * G + 8 * b + s;
                const int8_t *q = ij->qx + (m0 + m) * j->K + QKK * b + QK * s;
                __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
                for (int t = 0; t < 4; t++) {
                    i0 = _mm512_dpbusd_epi32(i0, u[8 * h + t], x16_bcast(q + 4 * t));
                    i1 = _mm512_dpbusd_epi32(i1, u[8 * h + 4 + t], x16_bcast(q + 16 + 4 * t));
                }
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(D, _mm512_set1_ps(ij->dx[g])),
                                         _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[m]);
                acc[m] = _mm512_fnmadd_ps(Mn, _mm512_set1_ps(ij->dxs[g]), acc[m]);
            }
        }
    }
}

/* A Q6_K super-block of group g against M rows of x: per chunk c and step t the codes' low nibbles and high 2 bits
   joined (u = code + 32, 0..63; chunk c's 2 bits, at bits 2c..2c+1 of each byte of their plane, shifted to bits
   4..5); group 2c + h of 32 elements is sub-blocks 2(2c + h) (steps 0-3) and +1 (steps 4-7), each lane starting at
   -32 * (its 16 q's sum), their exact sums times the int8 scales in int32, then acc += (d * dx_g) * isum_g (the GGUF
   kernel's contract, gemv_q_i8k.c). Summing the high bits in dot products of their own (masked in place, scaled
   by 4^-c afterwards) measured no faster with one row of x and 2x slower with 8. */
static inline __attribute__((always_inline)) VNNI
void x16_q6k(const IJob *ij, const uint8_t *o, int64_t b, int64_t m0, const int M, __m512 *acc) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
    for (int c = 0; c < 4; c++) {
        __m512i u[16];
        for (int t = 0; t < 8; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(o + X16_Q6_LOW + 512 * c + 64 * t));
            __m512i h0 = _mm512_loadu_si512((const void *)(o + X16_Q6_HIGH + 128 * t));
            __m512i h1 = _mm512_loadu_si512((const void *)(o + X16_Q6_HIGH + 128 * t + 64));
            /* epi16 shifts: the bits that cross from the neighbour byte are masked */
            h0 = c < 2 ? _mm512_slli_epi16(h0, 4 - 2 * c) : _mm512_srli_epi16(h0, 2 * c - 4);
            h1 = c < 2 ? _mm512_slli_epi16(h1, 4 - 2 * c) : _mm512_srli_epi16(h1, 2 * c - 4);
            u[t] = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_and_si512(h0, m30));
            u[8 + t] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), _mm512_and_si512(h1, m30));
        }
        for (int h = 0; h < 2; h++) {
            const int s = 2 * (2 * c + h);  /* the group's first sub-block of 16 */
            const __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + X16_Q6_SC + 16 * s)));
            const __m512i sb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(o + X16_Q6_SC + 16 * s + 16)));
            UNROLL for (int m = 0; m < M; m++) {
                const int64_t g = (m0 + m) * G + 8 * b + 2 * c + h;
                const int8_t *q = ij->qx + (m0 + m) * j->K + QKK * b + QK * (2 * c + h);
                const int32_t lo = ij->xsum16[g];
                __m512i i0 = _mm512_set1_epi32(-32 * lo), i1 = _mm512_set1_epi32(-32 * (ij->xsum[g] - lo));
                for (int t = 0; t < 4; t++) {
                    i0 = _mm512_dpbusd_epi32(i0, u[8 * h + t], x16_bcast(q + 4 * t));
                    i1 = _mm512_dpbusd_epi32(i1, u[8 * h + 4 + t], x16_bcast(q + 16 + 4 * t));
                }
                const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(i0, sa), _mm512_mullo_epi32(i1, sb));
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(ij->dx[g])), _mm512_cvtepi32_ps(isum),
                                         acc[m]);
            }
        }
    }
}

/* Group g (rows 16g..16g+15) against M rows of x from m0, block by block; the rows past N computed, not stored. */
static inline __attribute__((always_inline)) VNNI
void x16_group(const IJob *ij, const uint8_t *w16, int64_t g, int64_t m0, const int M, const int qt) {
    const QJob *j = ij->j;
    const int rec = x16_record(qt);
    const uint8_t *o = w16 + g * j->nb * rec;
    __m512 acc[IM];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < j->nb; b++, o += rec) {
        for (int l = 0; l < rec; l += 64) _mm_prefetch((const char *)o + X16_AHEAD + l, X16_HINT);
        if (qt == QT_Q4_K) x16_q4k(ij, o, b, m0, M, acc);
        else if (qt == QT_Q6_K) x16_q6k(ij, o, b, m0, M, acc);
        else x16_block32(ij, o, b, m0, M, qt, acc);
    }
    const int64_t rows = j->N - g * X16 < X16 ? j->N - g * X16 : X16;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1u);
    for (int m = 0; m < M; m++) {
        __m512 v = acc[m];
        if (j->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, j->bias + g * X16));
        _mm512_mask_storeu_ps(j->y + (m0 + m) * j->N + g * X16, keep, v);
    }
}

/* Groups [g0, g1) against every row of x, IM rows of x per pass (the chunk's records come from memory once, then
   from L2); M and the type constants in each copy. */
#define X16_PASS(M_, QT) for (int64_t g = g0; g < g1; g++) x16_group(ij, w16, g, m0, M_, QT)
#define X16_TYPE(M_) do { \
    switch (qt) { \
    case QT_Q4_0: X16_PASS(M_, QT_Q4_0); break; \
    case QT_Q5_0: X16_PASS(M_, QT_Q5_0); break; \
    case QT_Q8_0: X16_PASS(M_, QT_Q8_0); break; \
    case QT_Q4_K: X16_PASS(M_, QT_Q4_K); break; \
    default: X16_PASS(M_, QT_Q6_K); break; \
    } \
} while (0)
static VNNI void x16_range_vnni(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt) {
    for (int64_t m0 = 0; m0 < ij->j->M; m0 += IM) {
        const int M = (int)(ij->j->M - m0 < IM ? ij->j->M - m0 : IM);
        switch (M) {
        case 1: X16_TYPE(1); break;
        case 2: X16_TYPE(2); break;
        case 3: X16_TYPE(3); break;
        case 4: X16_TYPE(4); break;
        case 5: X16_TYPE(5); break;
        case 6: X16_TYPE(6); break;
        case 7: X16_TYPE(7); break;
        default: X16_TYPE(8); break;
        }
    }
}

/* The same records on AVX2 without VNNI: a 64-byte step is two 256-bit halves (rows 0-7, 8-15), and vpdpbusd becomes
   vpmaddubsw (pairs of u * q summed in int16) then vpmaddwd by ones (pairs of those in int32). The int16 sums are
   exact where they may hold several steps: |u * q| <= umax * 127 per product, 2 a pair, so 8 steps of Q4_0's and
   Q4_K's nibbles (8 * 2 * 15 * 127 = 30480), 4 of Q5_0's (31496), 2 of Q6_K's (32004) and 1 of Q8_0's fit int16;
   Q8_0's codes go back to signed (u ^ 0x80) and meet q through the sign trick (|code| * (q with code's sign):
   2 * 128 * 127 = 32512), so its lanes start at 0 instead of -128 * xsum. Every lane's integer sum is the VNNI
   kernel's, and its fp32 steps are the same operations: the results are the AVX-512 kernel's, bit for bit. One row
   of x at a time (two accumulators: AVX2's 16 registers), the group's records re-read from L1/L2 for the next. */
/* The AVX2 kernel prefetches 2 KiB ahead into L1: on a Zen 3 (28 layers of Q4_0 read cold, two threads, the copy's
   time over the GGUF kernel's in the same run) 0.87-0.91 where the VNNI kernel's 8 KiB into L2 gave 0.95-0.97; Q4_K
   alike within noise. */
#ifndef X16A_HINT
#define X16A_HINT _MM_HINT_T0
#endif
#ifndef X16A_AHEAD
#define X16A_AHEAD 2048
#endif
static inline __attribute__((always_inline)) AVX2 __m256i x16a_bcast(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* int16 pairs to int32 lanes (the exact sums of 4 products each) */
static inline __attribute__((always_inline)) AVX2 __m256i x16a_widen(const __m256i s16) {
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}

/* 32 bits of a Q5_0 fifth-bit mask as bytes of 16 (bit i of the mask: byte i) */
static inline __attribute__((always_inline)) AVX2 __m256i x16a_fifth(const uint8_t *bits) {
    uint32_t mask;
    memcpy(&mask, bits, 4);
    const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  /* byte i: mask byte i/8 */
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)mask), which);
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* Half hf (rows 8hf..8hf+7) of a 32-element block (Q4_0, Q5_0, Q8_0) against one row of x (q its 32 codes): the
   integer sums, each lane starting at -(the offset) * xsum (0 for Q8_0: signed codes). */
static inline __attribute__((always_inline)) AVX2
__m256i x16a_block32(const uint8_t *o, const int hf, const int8_t *q, const int32_t xsum, const int qt) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (qt == QT_Q8_0) {
        __m256i i32 = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            const __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(o + 32 + 64 * t + 32 * hf)),
                                               _mm256_set1_epi8((char)0x80));
            const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(x16a_bcast(q + 4 * t), c));
            i32 = _mm256_add_epi32(i32, x16a_widen(p));
        }
        return i32;
    }
    const uint8_t *codes = o + (qt == QT_Q5_0 ? X16_Q5_CODES : 32) + 32 * hf;
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  /* Q5_0: low nibbles', high ones' */
    for (int t = 0; t < 4; t++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + 64 * t));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qt == QT_Q5_0) {
            lo = _mm256_or_si256(lo, x16a_fifth(o + X16_Q5_BITS + 8 * t + 4 * hf));
            hi = _mm256_or_si256(hi, x16a_fifth(o + X16_Q5_BITS + 8 * (4 + t) + 4 * hf));
        }
        s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(lo, x16a_bcast(q + 4 * t)));
        s[qt == QT_Q5_0] = _mm256_add_epi16(s[qt == QT_Q5_0], _mm256_maddubs_epi16(hi, x16a_bcast(q + 16 + 4 * t)));
    }
    __m256i i32 = _mm256_add_epi32(_mm256_set1_epi32((qt == QT_Q4_0 ? -8 : -16) * xsum), x16a_widen(s[0]));
    return qt == QT_Q5_0 ? _mm256_add_epi32(i32, x16a_widen(s[1])) : i32;
}

/* 8 bytes of a record's [sub-block][row] table as fp32 lanes (unsigned: Q4_K's scales and mins). */
static inline __attribute__((always_inline)) AVX2 __m256 x16a_u8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Half hf of a Q4_K super-block against row m of x, into acc: x16_q4k's steps, sub-block by sub-block. */
static inline __attribute__((always_inline)) AVX2
__m256 x16a_q4k(const IJob *ij, const uint8_t *o, int64_t b, int64_t m, const int hf, __m256 acc) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * hf)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + X16_K_DMIN + 16 * hf)));
    UNROLL for (int c = 0; c < 4; c++) {
        const int8_t *q = ij->qx + m * j->K + QKK * b + QK * 2 * c;
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(o + X16_K_CODES + 512 * c + 64 * t + 32 * hf));
            s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(v, m4), x16a_bcast(q + 4 * t)));
            s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                           x16a_bcast(q + QK + 4 * t)));
        }
        for (int h = 0; h < 2; h++) {
            const int s = 2 * c + h;
            const int64_t g = m * G + 8 * b + s;
            const __m256 D = _mm256_mul_ps(d, x16a_u8_ps(o + X16_K_SC + 16 * s + 8 * hf));
            const __m256 Mn = _mm256_mul_ps(dmin, x16a_u8_ps(o + X16_K_MIN + 16 * s + 8 * hf));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(D, _mm256_set1_ps(ij->dx[g])),
                                  _mm256_cvtepi32_ps(x16a_widen(h ? s1 : s0)), acc);
            acc = _mm256_fnmadd_ps(Mn, _mm256_set1_ps(ij->dxs[g]), acc);
        }
    }
    return acc;
}

/* Half hf of a Q6_K super-block against row m of x, into acc: x16_q6k's steps (codes + 32, the sub-blocks of 16 each
   starting at -32 * their q's sum, times their int8 scales in int32). */
static inline __attribute__((always_inline)) AVX2
__m256 x16a_q6k(const IJob *ij, const uint8_t *o, int64_t b, int64_t m, const int hf, __m256 acc) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * hf)));
    UNROLL for (int c = 0; c < 4; c++) {
        UNROLL for (int h = 0; h < 2; h++) {
            const int64_t g = m * G + 8 * b + 2 * c + h;
            const int8_t *q = ij->qx + m * j->K + QKK * b + QK * (2 * c + h);
            __m256i s16[4];
            UNROLL for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(o + X16_Q6_LOW + 512 * c + 64 * t + 32 * hf));
                __m256i hb = _mm256_loadu_si256((const __m256i *)(o + X16_Q6_HIGH + 128 * t + 64 * h + 32 * hf));
                hb = c < 2 ? _mm256_slli_epi16(hb, 4 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 4);
                const __m256i lo = h ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
                const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(lo, _mm256_and_si256(hb, m30)),
                                                       x16a_bcast(q + 4 * t));
                s16[t / 2] = t % 2 ? _mm256_add_epi16(s16[t / 2], p) : p;
            }
            const int s = 2 * (2 * c + h);
            const int32_t lo = ij->xsum16[g];
            const __m256i i0 = _mm256_add_epi32(_mm256_set1_epi32(-32 * lo),
                                                _mm256_add_epi32(x16a_widen(s16[0]), x16a_widen(s16[1])));
            const __m256i i1 = _mm256_add_epi32(_mm256_set1_epi32(-32 * (ij->xsum[g] - lo)),
                                                _mm256_add_epi32(x16a_widen(s16[2]), x16a_widen(s16[3])));
            const uint8_t *sc = o + X16_Q6_SC + 16 * s + 8 * hf;
            const __m256i sa = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc));
            const __m256i sb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16)));
            const __m256i isum = _mm256_add_epi32(_mm256_mullo_epi32(i0, sa), _mm256_mullo_epi32(i1, sb));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ij->dx[g])), _mm256_cvtepi32_ps(isum), acc);
        }
    }
    return acc;
}

/* Half hf of group g's sums v (+ bias) into row m of y: the rows up to N (the lanes past it never stored). */
static inline __attribute__((always_inline)) AVX2
void x16a_store(const QJob *j, int64_t g, int64_t m, const int hf, __m256 v) {
    const int64_t row = g * X16 + 8 * hf, rows = j->N - row < 8 ? j->N - row : 8;
    if (rows <= 0) return;
    float lanes[8] = {0};
    if (j->bias) {
        memcpy(lanes, j->bias + row, (size_t)rows * sizeof(float));
        v = _mm256_add_ps(v, _mm256_loadu_ps(lanes));  /* lanes past N: 0, never stored */
    }
    _mm256_storeu_ps(lanes, v);
    memcpy(j->y + m * j->N + row, lanes, (size_t)rows * sizeof(float));
}

/* Group g against row m of x: both halves block by block, stored as x16_group stores. */
static inline __attribute__((always_inline)) AVX2
void x16a_group(const IJob *ij, const uint8_t *w16, int64_t g, int64_t m, const int qt) {
    const QJob *j = ij->j;
    const int64_t G = j->K / QK;
    const int rec = x16_record(qt);
    const uint8_t *o = w16 + g * j->nb * rec;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < j->nb; b++, o += rec) {
        for (int l = 0; l < rec; l += 64) _mm_prefetch((const char *)o + X16A_AHEAD + l, X16A_HINT);
        for (int hf = 0; hf < 2; hf++) {
            if (qt == QT_Q4_K) { acc[hf] = x16a_q4k(ij, o, b, m, hf, acc[hf]); continue; }
            if (qt == QT_Q6_K) { acc[hf] = x16a_q6k(ij, o, b, m, hf, acc[hf]); continue; }
            const int8_t *q = ij->qx + m * j->K + QK * b;
            const __m256i i32 = x16a_block32(o, hf, q, ij->xsum[m * G + b], qt);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16 * hf)));
            acc[hf] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ij->dx[m * G + b])), _mm256_cvtepi32_ps(i32),
                                      acc[hf]);
        }
    }
    for (int hf = 0; hf < 2; hf++) x16a_store(j, g, m, hf, acc[hf]);
}

/* APPLY(QT) with the layout qt a constant in each copy (every layout of the copies; gemv_q_x16t.c too) */
#define X16_BY_TYPE(qt, APPLY) do { \
    switch (qt) { \
    case QT_Q4_0: APPLY(QT_Q4_0); break; \
    case QT_Q5_0: APPLY(QT_Q5_0); break; \
    case QT_Q8_0: APPLY(QT_Q8_0); break; \
    case QT_Q4_K: APPLY(QT_Q4_K); break; \
    default: APPLY(QT_Q6_K); break; \
    } \
} while (0)
#define X16A_PASS(QT) \
    for (int64_t g = g0; g < g1; g++) \
        for (int64_t m = 0; m < ij->j->M; m++) x16a_group(ij, w16, g, m, QT)
static AVX2 void x16_range_avx2(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt) {
    X16_BY_TYPE(qt, X16A_PASS);
}

/* Groups [g0, g1) on the int8 kernel isa has: AVX-512 VNNI or AVX2 (qgemv_i8 refuses w16 below AVX2). */
/* rows of x from which an AVX2 call decodes each group once into a scratch (gemv_q_x16t.c; below, x16a_group, which
   decodes them again for each row of x: the same results) */
#ifndef X16T_MIN_ROWS
#define X16T_MIN_ROWS 4
#endif
static int x16t_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt);  /* gemv_q_x16t.c */
static void x16_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt, const int isa) {
    if (isa == ISA_AVX512_VNNI) x16_range_vnni(ij, w16, g0, g1, qt);
    else if (ij->j->M < X16T_MIN_ROWS || x16t_range(ij, w16, g0, g1, qt) != 0) x16_range_avx2(ij, w16, g0, g1, qt);
}
#else
static void x16_range(const IJob *ij, const uint8_t *w16, int64_t g0, int64_t g1, const int qt, const int isa) {
    (void)ij; (void)w16; (void)g0; (void)g1; (void)qt; (void)isa;  /* never called: qgemv_i8 refuses w16 below AVX2 */
}
#endif
