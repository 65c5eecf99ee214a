/* See qmatmul.h. One set of tile routines per instruction set; the dispatch picks one per process.
 *
 * A tile is up to RB rows x NB outputs. With few rows the weights are dequantized in
 * registers; with more, a tile's weights are dequantized once into a scratch buffer and
 * every row tile reads them from there. Both routes add the same values in the same
 * order to each (row, output) accumulator, so they agree bit for bit.
 *
 * The bfloat16 products (LK_BF16) have the same two routes: a block's 32 weights rounded to
 * bfloat16 in registers, or once into the scratch tile (half the bytes), and one vdpbf16ps a
 * block per (row, output) where float32 needs two fused multiply-adds. The rows are rounded
 * once per call, before the parts start. */
#include "qmatmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86) /* LK_NO_X86: build as for other CPUs */
#define LK_X86 1
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lk_common.h"
#include "qpool.h"

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

/* ---- plain C: one float accumulator per (row, output), blocks in order, elements in order ---- */

static void dequant_c(int fmt, const uint8_t *q, const float *dm, int64_t b, float *w) {
    if (fmt == LK_Q4_1) {
        for (int e = 0; e < 16; e++) {
            w[e] = fmaf(dm[2 * b], (float)(q[16 * b + e] & 15), dm[2 * b + 1]);
            w[e + 16] = fmaf(dm[2 * b], (float)(q[16 * b + e] >> 4), dm[2 * b + 1]);
        }
    } else {
        for (int e = 0; e < LK_QK; e++) w[e] = dm[b] * (float)(int8_t)q[32 * b + e];
    }
}

static void tile_c(const job *j, float *scratch, int64_t n0, int64_t nn) {
    (void)scratch;
    int64_t nblk = j->k / LK_QK;
    for (int64_t c = 0; c < nn; c++) {
        const uint8_t *q = j->qs + (n0 + c) * nblk * qs_per_block(j->fmt);
        const float *dm = j->dm + (n0 + c) * nblk * dm_per_block(j->fmt);
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

/* bfloat16 products in plain C: weights and rows rounded to bfloat16, one float32 accumulator per
 * (row, output), elements in order. */
static void tile_c_bf16(const job *j, float *scratch, int64_t n0, int64_t nn) {
    (void)scratch;
    int64_t nblk = j->k / LK_QK;
    for (int64_t c = 0; c < nn; c++) {
        const uint8_t *q = j->qs + (n0 + c) * nblk * qs_per_block(j->fmt);
        const float *dm = j->dm + (n0 + c) * nblk * dm_per_block(j->fmt);
        for (int64_t r = 0; r < j->rows; r++) {
            const uint16_t *x = j->xb + r * j->k;
            float acc = 0.0f, w[LK_QK];
            for (int64_t b = 0; b < nblk; b++) {
                dequant_c(j->fmt, q, dm, b, w);
                for (int e = 0; e < LK_QK; e++)
                    acc = fmaf(float_of_bf16(bf16_of(w[e])), float_of_bf16(x[b * LK_QK + e]), acc);
            }
            j->y[r * j->n + n0 + c] = acc;
        }
    }
}

static void rows_to_bf16_c(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_of(x[i]);
}

#ifdef LK_X86 /* the vector routes; other CPUs use the plain C one */

/* ---- AVX-512: per (row, output) one 16-lane accumulator; a block adds its low half, then its high half ---- */

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

/* Rows r0 .. r0 + nr - 1 against outputs n0 .. n0 + nn - 1; weights from w (nn x k floats) or, if w is
 * NULL, dequantized here. */
INLINE512 void tile512_fixed(const job *j, int fmt, const float *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m512 acc[RB][NB];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512 lo[NB], hi[NB];
        for (int c = 0; c < nn; c++) {
            if (w) {
                lo[c] = _mm512_loadu_ps(w + c * j->k + b * LK_QK);
                hi[c] = _mm512_loadu_ps(w + c * j->k + b * LK_QK + 16);
            } else {
                dequant512(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, &lo[c], &hi[c]);
            }
        }
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

AVX512 static void tile512(const job *j, float *scratch, int64_t n0, int64_t nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    const float *w = NULL;
    if (j->rows > RB && scratch) {
        for (int64_t c = 0; c < nn; c++)
            for (int64_t b = 0; b < nblk; b++) {
                __m512 lo, hi;
                dequant512(j->fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, &lo, &hi);
                _mm512_storeu_ps(scratch + c * j->k + b * LK_QK, lo);
                _mm512_storeu_ps(scratch + c * j->k + b * LK_QK + 16, hi);
            }
        w = scratch;
    }
    for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
        int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
        if (w) {
            TILE_CASES(tile512_fixed, j, j->fmt, w)  /* fmt does not matter: the weights are in w */
        } else if (j->fmt == LK_Q4_1) {
            TILE_CASES(tile512_fixed, j, LK_Q4_1, NULL)
        } else {
            TILE_CASES(tile512_fixed, j, LK_Q8_0, NULL)
        }
    }
}

/* ---- AVX-512 BF16: per (row, output) one 16-lane accumulator; a block is one dot product of 16 pairs ---- */

#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))
#define INLINEBF16 __attribute__((target("avx512f,avx512bw,avx512bf16,fma"), always_inline)) static inline

/* A block's 32 weights as bfloat16, in element order (the low 16 from lo). */
INLINEBF16 __m512i wblock_bf16(int fmt, const uint8_t *q, const float *dm, int64_t b) {
    __m512 lo, hi;
    dequant512(fmt, q, dm, b, &lo, &hi);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

INLINEBF16 void tilebf16_fixed(const job *j, int fmt, const uint16_t *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m512 acc[RB][NB];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512i wv[NB];
        for (int c = 0; c < nn; c++)
            wv[c] = w ? _mm512_loadu_si512(w + c * j->k + b * LK_QK)
                      : wblock_bf16(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b);
        for (int r = 0; r < nr; r++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(j->xb + (r0 + r) * j->k + b * LK_QK);
            for (int c = 0; c < nn; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv[c], xv);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) j->y[(r0 + r) * j->n + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

BF16 static void tilebf16(const job *j, float *scratch, int64_t n0, int64_t nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    const uint16_t *w = NULL;
    if (j->rows > RB && scratch) {
        uint16_t *ws = (uint16_t *)scratch;
        for (int64_t c = 0; c < nn; c++)
            for (int64_t b = 0; b < nblk; b++)
                _mm512_storeu_si512(ws + c * j->k + b * LK_QK,
                                    wblock_bf16(j->fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b));
        w = ws;
    }
    for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
        int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
        if (w) {
            TILE_CASES(tilebf16_fixed, j, j->fmt, w)
        } else if (j->fmt == LK_Q4_1) {
            TILE_CASES(tilebf16_fixed, j, LK_Q4_1, NULL)
        } else {
            TILE_CASES(tilebf16_fixed, j, LK_Q8_0, NULL)
        }
    }
}

BF16 static void rows_to_bf16_512(const float *x, int64_t n, uint16_t *out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    rows_to_bf16_c(x + i, n - i, out + i);
}

/* ---- AVX2 + FMA: per (row, output) one 8-lane accumulator; a block adds its four quarters in order ---- */

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

INLINE256 void tile256_fixed(const job *j, int fmt, const float *ws, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m256 acc[RB][NB];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m256 w[NB][4];
        for (int c = 0; c < nn; c++) {
            if (ws) {
                for (int e = 0; e < 4; e++) w[c][e] = _mm256_loadu_ps(ws + c * j->k + b * LK_QK + 8 * e);
            } else {
                dequant256(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, w[c]);
            }
        }
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

AVX2 static void tile256(const job *j, float *scratch, int64_t n0, int64_t nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    const float *w = NULL;
    if (j->rows > RB && scratch) {
        for (int64_t c = 0; c < nn; c++)
            for (int64_t b = 0; b < nblk; b++) {
                __m256 v[4];
                dequant256(j->fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, v);
                for (int e = 0; e < 4; e++) _mm256_storeu_ps(scratch + c * j->k + b * LK_QK + 8 * e, v[e]);
            }
        w = scratch;
    }
    for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
        int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
        if (w) {
            TILE_CASES(tile256_fixed, j, j->fmt, w)
        } else if (j->fmt == LK_Q4_1) {
            TILE_CASES(tile256_fixed, j, LK_Q4_1, NULL)
        } else {
            TILE_CASES(tile256_fixed, j, LK_Q8_0, NULL)
        }
    }
}

#endif /* LK_X86 */

/* ---- dispatch ---- */

typedef void (*tile_fn)(const job *, float *, int64_t, int64_t);
typedef void (*round_fn)(const float *, int64_t, uint16_t *);
static tile_fn tile, tile_bf16;
static round_fn round_rows;
static const char *isa;

#ifdef LK_X86
static int has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int has_avx512bf16(void) {
    __builtin_cpu_init();
    return has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
}
#else
static int has_avx512(void) { return 0; }
static int has_avx2(void) { return 0; }
static int has_avx512bf16(void) { return 0; }
#define tile512 tile_c /* never picked: has_avx512() is 0 */
#define tile256 tile_c
#define tilebf16 tile_c_bf16
#define rows_to_bf16_512 rows_to_bf16_c
#endif

/* The bfloat16 products follow the float ones: the BF16 instructions with AVX-512 where the CPU
 * has them, else plain C. */
static void set_isa(tile_fn f, const char *name) {
    tile = f;
    isa = name;
    int vec = f == tile512 && has_avx512bf16();
    tile_bf16 = vec ? tilebf16 : tile_c_bf16;
    round_rows = vec ? rows_to_bf16_512 : rows_to_bf16_c;
}

static void pick_isa(void) {
    if (tile) return;
    if (has_avx512()) {
        set_isa(tile512, "avx512");
    } else if (has_avx2()) {
        set_isa(tile256, "avx2");
    } else {
        set_isa(tile_c, "c");
    }
}

const char *lk_qmatmul_isa(void) {
    pick_isa();
    return isa;
}

int lk_qmatmul_bf16_native(void) { return has_avx512bf16(); }

const char *lk_qmatmul_bf16_isa(void) {
    pick_isa();
    return tile_bf16 == tile_c_bf16 ? "c" : "avx512bf16";
}

int lk_qmatmul_force_isa(const char *name) {
    if (!strcmp(name, "c")) {
        set_isa(tile_c, "c");
    } else if (!strcmp(name, "avx2") && has_avx2()) {
        set_isa(tile256, "avx2");
    } else if (!strcmp(name, "avx512") && has_avx512()) {
        set_isa(tile512, "avx512");
    } else {
        return 0;
    }
    return 1;
}

/* Rows per pass over the weights: a prompt's rows in chunks that stay in L2 while every output
 * tile of a part runs over them (1,024 rows at once streamed the whole input from memory once per
 * 4 outputs: a prefill of 1,024 tokens took 2.0 s against 1.0 s with float32 weights). A row's
 * sums do not depend on its chunk. */
#define ROW_CHUNK 64

/* Part p of parts takes a contiguous run of whole output tiles. */
static void run_part(void *ctx, int part, int parts) {
    const job *j = ctx;
    int64_t tiles = (j->n + NB - 1) / NB;
    int64_t t0 = tiles * part / parts, t1 = tiles * (part + 1) / parts;
    /* Without scratch memory the tiles dequantize in registers: slower for many rows, same sums. */
    float *scratch = j->rows > RB ? aligned_alloc(64, (size_t)((NB * j->k * 4 + 63) / 64 * 64)) : NULL;
    for (int64_t r0 = 0; r0 < j->rows; r0 += ROW_CHUNK) {
        job c = *j;
        c.x = j->x + r0 * j->k;
        c.xb = j->xb ? j->xb + r0 * j->k : NULL;
        c.y = j->y + r0 * j->n;
        c.rows = j->rows - r0 < ROW_CHUNK ? j->rows - r0 : ROW_CHUNK;
        for (int64_t t = t0; t < t1; t++) {
            int64_t n0 = t * NB;
            (j->xb ? tile_bf16 : tile)(&c, scratch, n0, j->n - n0 < NB ? j->n - n0 : NB);
        }
    }
    free(scratch);
}

/* Rounded rows up to this many elements live on the stack (a decode step's: no allocation a product). */
#define SMALL_ROWS_BF16 8192

int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const float *dm, int64_t n,
               float *y, int threads) {
    pick_isa();
    job j = {fmt & ~LK_BF16, x, rows, k, n, qs, dm, y, NULL};
    if (rows <= 0 || n <= 0) return LK_OK;
    uint16_t small[SMALL_ROWS_BF16], *xb = NULL;
    if (fmt & LK_BF16) {
        xb = rows * k <= SMALL_ROWS_BF16 ? small : malloc(sizeof(uint16_t) * (size_t)(rows * k));
        if (!xb) return LK_ENOMEM;
        round_rows(x, rows * k, xb);
        j.xb = xb;
    }
    int64_t tiles = (n + NB - 1) / NB;
    int parts = threads < 1 ? 1 : threads;
    if (parts > tiles) parts = (int)tiles;
    lk_pool_run(run_part, &j, parts); /* complete even where no worker started */
    if (xb != small) free(xb);
    return LK_OK;
}
