/* See qmatmul.h. One set of tile routines per instruction set; the dispatch picks one per process.
 *
 * A thread takes a run of whole tiles of NB outputs. With few rows (at most RB) each tile's
 * weights are dequantized in registers as the rows pass. With more, the rows go in chunks of
 * RCHUNK (their activations stay in the core's cache), and for each chunk every tile's weights
 * are dequantized once into a scratch buffer that tiles of RW rows read. Both routes add the
 * same values in the same order to each (row, output) accumulator, so they agree bit for bit. */
#include "qmatmul.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lk_common.h"
#include "qpool.h"

#define NB 4      /* outputs per tile */
#define RB 4      /* rows per tile with few rows (weights dequantized in registers); also the most rows of that route */
#define RW 6      /* rows per tile with many rows (weights dequantized once into a scratch tile) */
#define RCHUNK 48 /* rows whose activations one pass over a thread's output tiles reuses (a multiple of RW) */

typedef struct {
    int fmt;
    const float *x;
    int64_t rows, k, n;
    const uint8_t *qs;
    const uint16_t *dm;
    float *y;
} job;

/* Bytes of qs and float16 scales of dm per block. */
static inline int64_t qs_per_block(int fmt) { return fmt == LK_Q4_1 ? 16 : 32; }
static inline int64_t dm_per_block(int fmt) { return fmt == LK_Q4_1 ? 2 : 1; }
/* Scales are widened to float32 GROUP at a time: 8 Q4_1 blocks, 16 Q8_0 blocks. */
#define GROUP 16
static inline int64_t blocks_per_group(int fmt) { return GROUP / dm_per_block(fmt); }

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The float16 scales dm[first .. first + GROUP - 1] (fewer where the row ends: zeros after) as 16 bytes-aligned
 * halves for a vector conversion. */
static inline void group_halves(const uint16_t *dm, int64_t first, int64_t total, uint16_t out[GROUP]) {
    int64_t n = total - first < GROUP ? total - first : GROUP;
    memcpy(out, dm + first, (size_t)n * 2);
    for (int64_t i = n; i < GROUP; i++) out[i] = 0;
}

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

/* The same for the many-rows route: up to RW rows. */
#define WIDE_CASES(FN, ...)                                              \
    switch (nr * 8 + nn) {                                               \
    case 1 * 8 + 4: FN(__VA_ARGS__, r0, 1, n0, 4); break;                \
    case 2 * 8 + 4: FN(__VA_ARGS__, r0, 2, n0, 4); break;                \
    case 3 * 8 + 4: FN(__VA_ARGS__, r0, 3, n0, 4); break;                \
    case 4 * 8 + 4: FN(__VA_ARGS__, r0, 4, n0, 4); break;                \
    case 5 * 8 + 4: FN(__VA_ARGS__, r0, 5, n0, 4); break;                \
    case 6 * 8 + 4: FN(__VA_ARGS__, r0, 6, n0, 4); break;                \
    default:                                                             \
        for (int c = 0; c < nn; c++) FN(__VA_ARGS__, r0, nr, n0 + c, 1); \
    }

/* ---- plain C: one float accumulator per (row, output), blocks in order, elements in order ---- */

static void dequant_c(int fmt, const uint8_t *q, const uint16_t *dm, int64_t b, float *w) {
    if (fmt == LK_Q4_1) {
        float d = half_to_float(dm[2 * b]), m = half_to_float(dm[2 * b + 1]);
        for (int e = 0; e < 16; e++) {
            w[e] = fmaf(d, (float)(q[16 * b + e] & 15), m);
            w[e + 16] = fmaf(d, (float)(q[16 * b + e] >> 4), m);
        }
    } else {
        float d = half_to_float(dm[b]);
        for (int e = 0; e < LK_QK; e++) w[e] = d * (float)(int8_t)q[32 * b + e];
    }
}

static void range_c(const job *j, float *scratch, int64_t n_lo, int64_t n_hi) {
    (void)scratch;
    int64_t nblk = j->k / LK_QK, n0 = n_lo;
    for (int64_t c = 0; c < n_hi - n_lo; c++) {
        const uint8_t *q = j->qs + (n0 + c) * nblk * qs_per_block(j->fmt);
        const uint16_t *dm = j->dm + (n0 + c) * nblk * dm_per_block(j->fmt);
        for (int64_t r = 0; r < j->rows; r++) {
            const float *x = j->x + r * j->k;
            float acc = 0.0f, w[LK_QK];
            for (int64_t b = 0; b < nblk; b++) {
                dequant_c(j->fmt, q, dm, b, w);
                for (int e = 0; e < LK_QK; e++) acc = fmaf(w[e], x[b * LK_QK + e], acc);
            }
            j->y[r * j->n + n0 + c] = acc;
        }
    }
}

/* ---- AVX-512: per (row, output) one 16-lane accumulator; a block adds its low half, then its high half ---- */

#define AVX512 __attribute__((target("avx512f,fma")))
#define INLINE512 __attribute__((target("avx512f,fma"), always_inline)) static inline

/* Q4_1: the block's 16 possible values d * q + m form a table that vpermps indexes with the nibbles. */
/* Widens group g of a row's float16 scales (dm: the row's, total of them) into s. */
INLINE512 void scales512(const uint16_t *dm, int64_t g, int64_t total, float s[GROUP]) {
    __m256i h;
    if ((g + 1) * GROUP <= total) {
        h = _mm256_loadu_si256((const __m256i *)(dm + g * GROUP));
    } else {
        uint16_t tail[GROUP];
        group_halves(dm, g * GROUP, total, tail);
        h = _mm256_loadu_si256((const __m256i *)tail);
    }
    _mm512_storeu_ps(s, _mm512_cvtph_ps(h));
}

/* Block b's weights; s: its scales widened to float32 (d, then m for Q4_1). */
INLINE512 void dequant512(int fmt, const uint8_t *q, const float *s, int64_t b, __m512 *lo, __m512 *hi) {
    if (fmt == LK_Q4_1) {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(s[0]), iota, _mm512_set1_ps(s[1]));
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * b)));
        *lo = _mm512_permutexvar_ps(v, table); /* reads the index's low 4 bits only */
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    } else {
        __m512 d = _mm512_set1_ps(s[0]);
        __m512i v0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * b)));
        __m512i v1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * b + 16)));
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(v0));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(v1));
    }
}

/* Few rows: rows r0 .. r0 + nr - 1 against outputs n0 .. n0 + nn - 1, weights dequantized in registers
 * (w is unused: NULL). */
INLINE512 void tile512_fixed(const job *j, int fmt, const float *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    int64_t bpg = blocks_per_group(fmt);
    __m512 acc[RB][NB];
    float sc[NB][GROUP];
    (void)w;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512 lo[NB], hi[NB];
        if (b % bpg == 0)
            for (int c = 0; c < nn; c++) scales512(j->dm + (n0 + c) * nblk * db, b / bpg, nblk * db, sc[c]);
        for (int c = 0; c < nn; c++)
            dequant512(fmt, j->qs + (n0 + c) * nblk * qb, sc[c] + (b % bpg) * db, b, &lo[c], &hi[c]);
        for (int r = 0; r < nr; r++) {
            const float *x = j->x + (r0 + r) * j->k + b * LK_QK;
            __m512 xl = _mm512_loadu_ps(x), xh = _mm512_loadu_ps(x + 16);
            for (int c = 0; c < nn; c++) {
                acc[r][c] = _mm512_fmadd_ps(lo[c], xl, acc[r][c]);
                acc[r][c] = _mm512_fmadd_ps(hi[c], xh, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) j->y[(r0 + r) * j->n + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Many rows: RW rows x nn outputs from the tile's dequantized weights w, a block's low halves before its
 * high halves (each accumulator still adds, per block, its low half then its high half). */
INLINE512 void wide512_fixed(const job *j, const float *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK;
    __m512 acc[RW][NB];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++)
        for (int half = 0; half < 2; half++) {
            __m512 wv[NB];
            for (int c = 0; c < nn; c++) wv[c] = _mm512_loadu_ps(w + c * j->k + b * LK_QK + 16 * half);
            for (int r = 0; r < nr; r++) {
                __m512 xv = _mm512_loadu_ps(j->x + (r0 + r) * j->k + b * LK_QK + 16 * half);
                for (int c = 0; c < nn; c++) acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
            }
        }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) j->y[(r0 + r) * j->n + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Outputs n_lo .. n_hi - 1 (whole tiles) for every row. */
AVX512 static void range512(const job *j, float *scratch, int64_t n_lo, int64_t n_hi) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    if (j->rows <= RB || !scratch) {
        for (int64_t n0 = n_lo; n0 < n_hi; n0 += NB) {
            int64_t nn = n_hi - n0 < NB ? n_hi - n0 : NB;
            for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
                int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
                if (j->fmt == LK_Q4_1) {
                    TILE_CASES(tile512_fixed, j, LK_Q4_1, NULL)
                } else {
                    TILE_CASES(tile512_fixed, j, LK_Q8_0, NULL)
                }
            }
        }
        return;
    }
    /* Rows in chunks whose activations stay in the core's L2 cache while every tile of outputs passes. */
    for (int64_t r_lo = 0; r_lo < j->rows; r_lo += RCHUNK) {
        int64_t r_hi = j->rows - r_lo < RCHUNK ? j->rows : r_lo + RCHUNK;
        for (int64_t n0 = n_lo; n0 < n_hi; n0 += NB) {
            int64_t nn = n_hi - n0 < NB ? n_hi - n0 : NB;
            for (int64_t c = 0; c < nn; c++)
                for (int64_t b = 0; b < nblk; b++) {
                    __m512 lo, hi;
                    float sc[GROUP];
                    int64_t bpg = blocks_per_group(j->fmt);
                    scales512(j->dm + (n0 + c) * nblk * db, b / bpg, nblk * db, sc); /* per block: cheap beside rows */
                    dequant512(j->fmt, j->qs + (n0 + c) * nblk * qb, sc + (b % bpg) * db, b, &lo, &hi);
                    _mm512_storeu_ps(scratch + c * j->k + b * LK_QK, lo);
                    _mm512_storeu_ps(scratch + c * j->k + b * LK_QK + 16, hi);
                }
            for (int64_t r0 = r_lo; r0 < r_hi; r0 += RW) {
                int64_t nr = r_hi - r0 < RW ? r_hi - r0 : RW;
                WIDE_CASES(wide512_fixed, j, scratch)
            }
        }
    }
}

/* ---- AVX2 + FMA: per (row, output) one 8-lane accumulator; a block adds its four quarters in order ---- */

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE256 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

INLINE256 void scales256(const uint16_t *dm, int64_t g, int64_t total, float s[GROUP]) {
    __m128i h0, h1;
    if ((g + 1) * GROUP <= total) {
        h0 = _mm_loadu_si128((const __m128i *)(dm + g * GROUP));
        h1 = _mm_loadu_si128((const __m128i *)(dm + g * GROUP + 8));
    } else {
        uint16_t tail[GROUP];
        group_halves(dm, g * GROUP, total, tail);
        h0 = _mm_loadu_si128((const __m128i *)tail);
        h1 = _mm_loadu_si128((const __m128i *)(tail + 8));
    }
    _mm256_storeu_ps(s, _mm256_cvtph_ps(h0));
    _mm256_storeu_ps(s + 8, _mm256_cvtph_ps(h1));
}

INLINE256 void dequant256(int fmt, const uint8_t *q, const float *s, int64_t b, __m256 w[4]) {
    if (fmt == LK_Q4_1) {
        __m256 d = _mm256_set1_ps(s[0]), m = _mm256_set1_ps(s[1]);
        __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 * b)));
        __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 * b + 8)));
        __m256i low = _mm256_set1_epi32(15);
        w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(v0, low)), m);
        w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(v1, low)), m);
        w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), m);
        w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), m);
    } else {
        __m256 d = _mm256_set1_ps(s[0]);
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

/* Few rows, weights dequantized in registers (ws unused: NULL). */
INLINE256 void tile256_fixed(const job *j, int fmt, const float *ws, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    (void)ws;
    int64_t bpg = blocks_per_group(fmt);
    __m256 acc[RB][NB];
    float sc[NB][GROUP];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m256 w[NB][4];
        if (b % bpg == 0)
            for (int c = 0; c < nn; c++) scales256(j->dm + (n0 + c) * nblk * db, b / bpg, nblk * db, sc[c]);
        for (int c = 0; c < nn; c++)
            dequant256(fmt, j->qs + (n0 + c) * nblk * qb, sc[c] + (b % bpg) * db, b, w[c]);
        for (int r = 0; r < nr; r++) {
            const float *x = j->x + (r0 + r) * j->k + b * LK_QK;
            for (int e = 0; e < 4; e++) {
                __m256 xv = _mm256_loadu_ps(x + 8 * e);
                for (int c = 0; c < nn; c++) acc[r][c] = _mm256_fmadd_ps(w[c][e], xv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) j->y[(r0 + r) * j->n + n0 + c] = hsum256(acc[r][c]);
}

/* Many rows: up to RW rows x nn (<= 2) outputs from dequantized weights w (16 registers: 12 accumulators). */
INLINE256 void wide256_fixed(const job *j, const float *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK;
    __m256 acc[RW][2];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++)
        for (int e = 0; e < 4; e++) {
            __m256 wv[2];
            for (int c = 0; c < nn; c++) wv[c] = _mm256_loadu_ps(w + c * j->k + b * LK_QK + 8 * e);
            for (int r = 0; r < nr; r++) {
                __m256 xv = _mm256_loadu_ps(j->x + (r0 + r) * j->k + b * LK_QK + 8 * e);
                for (int c = 0; c < nn; c++) acc[r][c] = _mm256_fmadd_ps(wv[c], xv, acc[r][c]);
            }
        }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) j->y[(r0 + r) * j->n + n0 + c] = hsum256(acc[r][c]);
}

AVX2 static void range256(const job *j, float *scratch, int64_t n_lo, int64_t n_hi) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    if (j->rows <= RB || !scratch) {
        for (int64_t n0 = n_lo; n0 < n_hi; n0 += NB) {
            int64_t nn = n_hi - n0 < NB ? n_hi - n0 : NB;
            for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
                int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
                if (j->fmt == LK_Q4_1) {
                    TILE_CASES(tile256_fixed, j, LK_Q4_1, NULL)
                } else {
                    TILE_CASES(tile256_fixed, j, LK_Q8_0, NULL)
                }
            }
        }
        return;
    }
    for (int64_t r_lo = 0; r_lo < j->rows; r_lo += RCHUNK) {
        int64_t r_hi = j->rows - r_lo < RCHUNK ? j->rows : r_lo + RCHUNK;
        for (int64_t t0 = n_lo; t0 < n_hi; t0 += NB) {
            int64_t tn = n_hi - t0 < NB ? n_hi - t0 : NB;
            for (int64_t c = 0; c < tn; c++)
                for (int64_t b = 0; b < nblk; b++) {
                    __m256 v[4];
                    float sc[GROUP];
                    int64_t bpg = blocks_per_group(j->fmt);
                    scales256(j->dm + (t0 + c) * nblk * db, b / bpg, nblk * db, sc);
                    dequant256(j->fmt, j->qs + (t0 + c) * nblk * qb, sc + (b % bpg) * db, b, v);
                    for (int e = 0; e < 4; e++) _mm256_storeu_ps(scratch + c * j->k + b * LK_QK + 8 * e, v[e]);
                }
            for (int64_t half = 0; half < tn; half += 2) { /* the tile's outputs two at a time */
                int64_t n0 = t0 + half, nn = tn - half < 2 ? tn - half : 2;
                const float *w = scratch + half * j->k;
                for (int64_t r0 = r_lo; r0 < r_hi; r0 += RW) {
                    int64_t nr = r_hi - r0 < RW ? r_hi - r0 : RW;
                    switch (nr * 8 + nn) {
                    case 1 * 8 + 2: wide256_fixed(j, w, r0, 1, n0, 2); break;
                    case 2 * 8 + 2: wide256_fixed(j, w, r0, 2, n0, 2); break;
                    case 3 * 8 + 2: wide256_fixed(j, w, r0, 3, n0, 2); break;
                    case 4 * 8 + 2: wide256_fixed(j, w, r0, 4, n0, 2); break;
                    case 5 * 8 + 2: wide256_fixed(j, w, r0, 5, n0, 2); break;
                    case 6 * 8 + 2: wide256_fixed(j, w, r0, 6, n0, 2); break;
                    default: wide256_fixed(j, w, r0, (int)nr, n0, (int)nn);
                    }
                }
            }
        }
    }
}

/* ---- dispatch ---- */

/* Computes outputs n_lo .. n_hi - 1 of every row; scratch holds NB x k floats (NULL: none). */
typedef void (*range_fn)(const job *, float *, int64_t, int64_t);
static range_fn range;
static const char *isa;

static int has_avx512(void) { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"); }
static int has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static void pick_isa(void) {
    if (range) return;
    __builtin_cpu_init();
    if (has_avx512()) {
        range = range512;
        isa = "avx512";
    } else if (has_avx2()) {
        range = range256;
        isa = "avx2";
    } else {
        range = range_c;
        isa = "c";
    }
}

const char *lk_qmatmul_isa(void) {
    pick_isa();
    return isa;
}

int lk_qmatmul_force_isa(const char *name) {
    __builtin_cpu_init();
    if (!strcmp(name, "c")) {
        range = range_c;
        isa = "c";
    } else if (!strcmp(name, "avx2") && has_avx2()) {
        range = range256;
        isa = "avx2";
    } else if (!strcmp(name, "avx512") && has_avx512()) {
        range = range512;
        isa = "avx512";
    } else {
        return 0;
    }
    return 1;
}

/* Part p of parts takes a contiguous run of whole output tiles. */
static void run_part(void *ctx, int part, int parts) {
    const job *j = ctx;
    int64_t tiles = (j->n + NB - 1) / NB;
    int64_t t0 = tiles * part / parts, t1 = tiles * (part + 1) / parts;
    if (t0 >= t1) return;
    /* Without scratch memory the tiles dequantize in registers: slower for many rows, same sums. */
    float *scratch = j->rows > RB ? aligned_alloc(64, (size_t)((NB * j->k * 4 + 63) / 64 * 64)) : NULL;
    range(j, scratch, t0 * NB, t1 * NB < j->n ? t1 * NB : j->n);
    free(scratch);
}

int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const uint16_t *dm, int64_t n,
               float *y, int threads) {
    pick_isa();
    job j = {fmt, x, rows, k, n, qs, dm, y};
    if (rows <= 0 || n <= 0) return LK_OK;
    int64_t tiles = (n + NB - 1) / NB;
    int parts = threads < 1 ? 1 : threads;
    if (parts > tiles) parts = (int)tiles;
    return lk_pool_run(run_part, &j, parts);
}
