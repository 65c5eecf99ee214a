/* Internal to the quantized products (qmatmul.c: float32; qmatmul_bf16.c: bfloat16): what a
 * product's parts share (the job), the tile sizes, the block layouts and the dequantization both
 * files use. The public interface is qmatmul.h. */
#ifndef LK_QMATMUL_TILE_H
#define LK_QMATMUL_TILE_H

#include "qmatmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86) /* LK_NO_X86: build as for other CPUs */
#define LK_X86 1
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#define NB 4 /* outputs per tile */
#define RB 4 /* rows per tile */

typedef struct {
    int fmt; /* LK_Q4_1 or LK_Q8_0 (the LK_BF16 flag taken off) */
    const float *x;
    int64_t rows, k, n;
    const uint8_t *qs;
    const float *dm;
    float *y;
    const uint16_t *xb; /* the rows rounded to bfloat16 (LK_BF16 products), else NULL */
} job;

/* Bytes of qs and floats of dm per block. */
static inline int64_t qs_per_block(int fmt) { return fmt == LK_Q4_1 ? 16 : 32; }
static inline int64_t dm_per_block(int fmt) { return fmt == LK_Q4_1 ? 2 : 1; }

/* Calls FN(ARGS..., r0, nr, n0, nn) with constant sizes for full tiles, one output at a time otherwise. */
#define TILE_CASES(FN, ...)                                              \
    switch (nr * 8 + nn) {                                               \
    case 1 * 8 + 4: FN(__VA_ARGS__, r0, 1, n0, 4); break;                \
    case 2 * 8 + 4: FN(__VA_ARGS__, r0, 2, n0, 4); break;                \
    case 3 * 8 + 4: FN(__VA_ARGS__, r0, 3, n0, 4); break;                \
    case 4 * 8 + 4: FN(__VA_ARGS__, r0, 4, n0, 4); break;                \
    default:                                                             \
        for (int c = 0; c < nn; c++) FN(__VA_ARGS__, r0, nr, n0 + c, 1); \
    }

/* Every row tile of a job against outputs n0 .. n0 + nn - 1 through FIXED(j, fmt, w, r0, nr, n0, nn):
 * on the tile's prepared weights w when there are some (the format then does not matter), else
 * with the weights unpacked in registers, the format a constant so each one's loop is compiled
 * on its own. The AVX-512 and bfloat16 tile routines end with it; AVX2 has a row loop of its own
 * (its prepared weights go through another tile, scratch256 in qmatmul.c). */
#define ROW_TILES(FIXED, j, w)                                                 \
    for (int64_t r0 = 0; r0 < (j)->rows; r0 += RB) {                           \
        int64_t nr = (j)->rows - r0 < RB ? (j)->rows - r0 : RB;                \
        if (w) {                                                               \
            TILE_CASES(FIXED, j, (j)->fmt, w)                                  \
        } else if ((j)->fmt == LK_Q4_1) {                                      \
            TILE_CASES(FIXED, j, LK_Q4_1, NULL)                                \
        } else {                                                               \
            TILE_CASES(FIXED, j, LK_Q8_0, NULL)                                \
        }                                                                      \
    }

static inline void dequant_c(int fmt, const uint8_t *q, const float *dm, int64_t b, float *w) {
    if (fmt == LK_Q4_1) {
        for (int e = 0; e < 16; e++) {
            w[e] = fmaf(dm[2 * b], (float)(q[16 * b + e] & 15), dm[2 * b + 1]);
            w[e + 16] = fmaf(dm[2 * b], (float)(q[16 * b + e] >> 4), dm[2 * b + 1]);
        }
    } else {
        for (int e = 0; e < LK_QK; e++) w[e] = dm[b] * (float)(int8_t)q[32 * b + e];
    }
}

/* float32 -> bfloat16, rounded to nearest even; a subnormal becomes a signed zero and a NaN
 * stays a NaN, as the AVX-512 BF16 conversions do. */
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float float_of_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The next output tile's weights (blocks and scales), asked of the caches a slice at a time while
 * the current tile runs: every tile calls ahead_step(&a, s) for s = 0 .. steps - 1, which covers the
 * whole next tile. A decode step's product reads each weight once, from memory, and the hardware's
 * own prefetch fell behind on these short rows (one-row lm_head, Q8_0, one thread, 2-core AMD EPYC
 * with AVX2: 8.4 ms without, 4.4 ms with). Spread out, not as one burst of some 40 prefetches before
 * the tile: with the burst, the one-row products ran 20-50% slower or not depending only on where
 * the linker placed its loop (benchmarks/layout_check.py); spread, they ran faster than either.
 * Hints only: the sums do not change. Inlined: GCC drops calls to a function that only prefetches. */
typedef struct {
    const char *q, *d;                /* the next tile's blocks and scales; q NULL: nothing ahead */
    int64_t qlen, dlen, qstep, dstep; /* bytes in all; bytes per step */
} ahead;

static inline ahead ahead_of(const job *j, int64_t n0, int64_t steps) {
    ahead a = {NULL, NULL, 0, 0, 0, 0};
    int64_t next = n0 + NB, nblk = j->k / LK_QK;
    if (next >= j->n || steps <= 0) return a;
    int64_t nx = j->n - next < NB ? j->n - next : NB;
    a.q = (const char *)(j->qs + next * nblk * qs_per_block(j->fmt));
    a.d = (const char *)(j->dm + next * nblk * dm_per_block(j->fmt));
    a.qlen = nx * nblk * qs_per_block(j->fmt);
    a.dlen = nx * nblk * dm_per_block(j->fmt) * 4;
    a.qstep = (a.qlen + steps - 1) / steps;
    a.dstep = (a.dlen + steps - 1) / steps;
    return a;
}

/* Step s's slice; the last step also takes the last bytes' line, which a slice's 64-byte strides
 * can miss where the tile does not start on a line. */
static inline __attribute__((always_inline)) void ahead_step(const ahead *a, int64_t s) {
    if (!a->q) return;
    int64_t o = s * a->qstep, e = o + a->qstep < a->qlen ? o + a->qstep : a->qlen;
    for (; o < e; o += 64) __builtin_prefetch(a->q + o, 0, 3);
    if (e == a->qlen && e > s * a->qstep) __builtin_prefetch(a->q + e - 1, 0, 3);
    o = s * a->dstep;
    e = o + a->dstep < a->dlen ? o + a->dstep : a->dlen;
    for (; o < e; o += 64) __builtin_prefetch(a->d + o, 0, 3);
    if (e == a->dlen && e > s * a->dstep) __builtin_prefetch(a->d + e - 1, 0, 3);
}

#ifdef LK_X86
#define AVX512 __attribute__((target("avx512f,fma")))
#define INLINE512 __attribute__((target("avx512f,fma"), always_inline)) static inline

/* Q4_1: the block's 16 possible values d * q + m form a table that vpermps indexes with the nibbles. */
INLINE512 void dequant512(int fmt, const uint8_t *q, const float *dm, int64_t b, __m512 *lo, __m512 *hi) {
    if (fmt == LK_Q4_1) {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(dm[2 * b]), iota, _mm512_set1_ps(dm[2 * b + 1]));
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * b)));
        *lo = _mm512_permutexvar_ps(v, table); /* reads the index's low 4 bits only */
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    } else {
        __m512 d = _mm512_set1_ps(dm[b]);
        __m512i v0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * b)));
        __m512i v1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * b + 16)));
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(v0));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(v1));
    }
}

/* AVX2 + FMA: a block's four quarters of 8 weights, in order. */
#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE256 __attribute__((target("avx2,fma"), always_inline)) static inline

INLINE256 void dequant256(int fmt, const uint8_t *q, const float *dm, int64_t b, __m256 w[4]) {
    if (fmt == LK_Q4_1) {
        __m256 d = _mm256_set1_ps(dm[2 * b]), m = _mm256_set1_ps(dm[2 * b + 1]);
        __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 * b)));
        __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 * b + 8)));
        __m256i low = _mm256_set1_epi32(15);
        w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(v0, low)), m);
        w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(v1, low)), m);
        w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), m);
        w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), m);
    } else {
        __m256 d = _mm256_set1_ps(dm[b]);
        for (int e = 0; e < 4; e++)
            w[e] = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 32 * b + 8 * e)))));
    }
}

INLINE256 float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows r0 .. r0 + nr - 1 against outputs n0 .. n0 + nc - 1 (nr x nc <= 8), the weights dequantized
 * in registers a block of one output at a time, the inputs read from memory by each multiply-add: no
 * spill of accumulators or weights (tile256_fixed holds 4 x 4 of each). For 3-4 rows x 2 outputs
 * (regs256: with 1-2 rows the inputs held in registers across 4 outputs did better, single-thread
 * timings, 2-core EPYC), and 5-8 rows x 1 output as AVX2's tall tile (lk_tall_tiles256, qmatmul_tall.c). */
INLINE256 void reg256(const job *j, int fmt, int64_t r0, int nr, int64_t n0, int nc, const ahead *a) {
    int64_t k = j->k, nblk = k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    const float *x = j->x + r0 * k;
    __m256 acc[8][2];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        ahead_step(a, b);
        for (int c = 0; c < nc; c++) {
            __m256 w[4];
            dequant256(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, w);
            for (int r = 0; r < nr; r++)
                for (int e = 0; e < 4; e++)
                    acc[r][c] = _mm256_fmadd_ps(w[e], _mm256_loadu_ps(x + r * k + b * LK_QK + 8 * e), acc[r][c]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) j->y[(r0 + r) * j->n + n0 + c] = hsum256(acc[r][c]);
}

#endif

/* The bfloat16 tile with AVX-512 BF16 (qmatmul_bf16.c; the dispatch in qmatmul.c uses it only where
 * the CPU has the instructions), and the rows rounded to bfloat16. */
void lk_rows_to_bf16_c(const float *x, int64_t n, uint16_t *out);
/* The 8-bit products (qmatmul_i8.c). route: 2 where the AVX-512 tiles are picked (AVX-512 VNNI if the
 * CPU has it, else AVX2), 1 AVX2, 0 plain C (the ISA forced to "c"). */
const char *lk_qmatmul_i8_isa(int route);
int lk_qmatmul_i8(int fmt, int route, const float *x, int64_t rows, int64_t k, const uint8_t *pq, const float *pdm,
                  int64_t n, float *y, int threads);
#ifdef LK_X86
void lk_tile_bf16_512(const job *j, float *scratch, int64_t n0, int64_t nn);
void lk_rows_to_bf16_512(const float *x, int64_t n, uint16_t *out);
/* The tall tiles (qmatmul_tall.c), AVX-512 and AVX2: every row of the job against outputs n0 .. n0 + nn - 1. */
void lk_tall_tiles512(const job *j, int64_t n0, int64_t nn);
void lk_tall_tiles256(const job *j, int64_t n0, int64_t nn);
#endif

#endif
