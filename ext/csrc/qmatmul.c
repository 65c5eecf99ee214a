/* See qmatmul.h. One set of tile routines per instruction set; the dispatch picks one per process.
 *
 * A tile is up to RB rows x NB outputs. With few rows the weights are dequantized in
 * registers; with more, a tile's weights are dequantized once into a scratch buffer and
 * every row tile reads them from there. A third route lies between the two: tall tiles of up to 8
 * rows with the weights in registers, for products of up to lk_qmatmul_tall_rows rows
 * (qmatmul_tall.c); run_part picks the route.
 * Every route adds the same values in the same order to each (row, output) accumulator, so
 * they agree bit for bit.
 * The bfloat16 products (LK_BF16) are in qmatmul_bf16.c; the dispatch here picks them too. */
#include "qmatmul_tile.h"

#include <stdlib.h>
#include <string.h>

#include "lk_common.h"
#include "qpool.h"

/* ---- plain C: one float accumulator per (row, output), blocks in order, elements in order ---- */

/* Both kinds of product: a bfloat16 one (j->xb set) reads the rounded rows and rounds each weight. */
static void tile_c(const job *j, float *scratch, int64_t n0, int64_t nn) {
    (void)scratch;
    int64_t nblk = j->k / LK_QK;
    ahead a = ahead_of(j, n0, nn * nblk);
    for (int64_t c = 0; c < nn; c++) {
        const uint8_t *q = j->qs + (n0 + c) * nblk * qs_per_block(j->fmt);
        const float *dm = j->dm + (n0 + c) * nblk * dm_per_block(j->fmt);
        for (int64_t r = 0; r < j->rows; r++) {
            float acc = 0.0f, w[LK_QK], x[LK_QK];
            for (int64_t b = 0; b < nblk; b++) {
                if (r == 0) ahead_step(&a, c * nblk + b);
                dequant_c(j->fmt, q, dm, b, w);
                for (int e = 0; e < LK_QK; e++) {
                    int64_t i = r * j->k + b * LK_QK + e;
                    x[e] = j->xb ? float_of_bf16(j->xb[i]) : j->x[i];
                    w[e] = j->xb ? float_of_bf16(bf16_of(w[e])) : w[e];
                }
                for (int e = 0; e < LK_QK; e++) acc = fmaf(w[e], x[e], acc);
            }
            j->y[r * j->n + n0 + c] = acc;
        }
    }
}

/* Products of RB + 1 .. tall_rows rows take the tall tiles (tall_tile); both are set with the ISA.
 * AVX-512: up to 24 rows. Above that the scratch tile's single unpacking wins (the model's layer
 * products of 32 rows took the same time either way, of 48-128 rows 2-10% less through the scratch
 * tile; separate processes, same machine). AVX2: up to 8 rows, one tall tile's height; verify
 * forwards of 9-12 rows took two passes and were 15-30% slower than through the scratch tile (AVX2
 * on a 2-core AMD EPYC with AVX-512, benchmarks/forward_widths.py --isa avx2 --compare-routes). */
#define TALL_ROWS_512 24
#define TALL_ROWS_256 8
typedef void (*tall_fn)(const job *, int64_t, int64_t);
static tall_fn tall_tile; /* NULL: the ISA has none */
static int tall_rows;

static int tall_route(const job *j) { return tall_tile && j->rows > RB && j->rows <= tall_rows; }

#ifdef LK_X86 /* the vector routes; other CPUs use the plain C one */

/* ---- AVX-512: per (row, output) one 16-lane accumulator; a block adds its low half, then its high half ---- */

/* Rows r0 .. r0 + nr - 1 against outputs n0 .. n0 + nn - 1; weights from w (nn x k floats) or, if w is
 * NULL, dequantized here. */
INLINE512 void tile512_fixed(const job *j, int fmt, const float *w, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m512 acc[RB][NB];
    /* Unpacking here, the first row tile reads the weights from memory: it asks for the next tile's. */
    ahead a = ahead_of(j, n0, !w && r0 == 0 && nn == NB ? nblk : 0);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512 lo[NB], hi[NB];
        ahead_step(&a, b);
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
        ahead a = ahead_of(j, n0, nn * nblk);
        for (int64_t c = 0; c < nn; c++)
            for (int64_t b = 0; b < nblk; b++) {
                __m512 lo, hi;
                ahead_step(&a, c * nblk + b);
                dequant512(j->fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, &lo, &hi);
                _mm512_storeu_ps(scratch + c * j->k + b * LK_QK, lo);
                _mm512_storeu_ps(scratch + c * j->k + b * LK_QK + 16, hi);
            }
        w = scratch;
    }
    ROW_TILES(tile512_fixed, j, w)
}

/* ---- AVX2 + FMA: per (row, output) one 8-lane accumulator; a block adds its four quarters in order
 * (dequant256, hsum256 and the register tile reg256 are in qmatmul_tile.h) ---- */

/* Rows r0 .. r0 + nr - 1 against outputs n0 .. n0 + nn - 1, the weights unpacked in registers: the
 * 1-2-row products (the inputs stay in registers across 4 outputs), and those above the tall tiles'
 * rows when the scratch tile could not be allocated (3-4 rows take regs256 either way). */
INLINE256 void tile256_fixed(const job *j, int fmt, int64_t r0, int nr, int64_t n0, int nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m256 acc[RB][NB];
    ahead a = ahead_of(j, n0, r0 == 0 && nn == NB ? nblk : 0); /* as tile512_fixed */
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m256 w[NB][4];
        ahead_step(&a, b);
        for (int c = 0; c < nn; c++) dequant256(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, w[c]);
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

/* 3-4 rows against nn <= 4 outputs, in passes of 2 outputs; the first pass asks for the next tile's weights. */
INLINE256 void regs256(const job *j, int fmt, int64_t n0, int nn) {
    ahead first = ahead_of(j, n0, nn == NB ? j->k / LK_QK : 0), none = ahead_of(j, n0, 0);
    for (int c0 = 0; c0 < nn; c0 += 2) {
        const ahead *a = c0 ? &none : &first;
        if (nn - c0 == 1) {
            if (j->rows == 3) reg256(j, fmt, 0, 3, n0 + c0, 1, a); else reg256(j, fmt, 0, 4, n0 + c0, 1, a);
        } else {
            if (j->rows == 3) reg256(j, fmt, 0, 3, n0 + c0, 2, a); else reg256(j, fmt, 0, 4, n0 + c0, 2, a);
        }
    }
}

/* Rows r0 .. r0 + nr - 1 (nr <= 3) against outputs n0 .. n0 + nc - 1 (nc <= 4), whose weights the
 * scratch tile ws holds dequantized (nc x k floats). AVX2 has 16 vector registers: 3 x 4
 * accumulators, the 3 rows' input quarters and one weight quarter fill them. tile256_fixed's
 * 4 x 4 accumulators and 4 x 4 weight quarters spilled to the stack: on a 2-core AMD EPYC (AVX2)
 * this tile took 17-27% off a verify forward of 8-32 rows. */
INLINE256 void scratch256(const job *j, const float *ws, int64_t r0, int nr, int64_t n0, int nc) {
    int64_t k = j->k;
    const float *x = j->x + r0 * k;
    __m256 acc[3][4];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) { /* block i / 32, quarter (i % 32) / 8: the same order as above */
        __m256 xv[3];
        for (int r = 0; r < nr; r++) xv[r] = _mm256_loadu_ps(x + r * k + i);
        for (int c = 0; c < nc; c++) {
            __m256 w = _mm256_loadu_ps(ws + c * k + i);
            for (int r = 0; r < nr; r++) acc[r][c] = _mm256_fmadd_ps(w, xv[r], acc[r][c]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) j->y[(r0 + r) * j->n + n0 + c] = hsum256(acc[r][c]);
}

AVX2 static void tile256(const job *j, float *scratch, int64_t n0, int64_t nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    if (j->rows > RB && scratch) {
        const uint8_t *q = j->qs + n0 * nblk * qb;
        const float *dm = j->dm + n0 * nblk * db;
        ahead a = ahead_of(j, n0, nn * nblk);
        for (int64_t i = 0; i < nn * nblk; i++) { /* the nn outputs' blocks lie one after another */
            __m256 v[4];
            ahead_step(&a, i);
            dequant256(j->fmt, q, dm, i, v);
            for (int e = 0; e < 4; e++) _mm256_storeu_ps(scratch + i * LK_QK + 8 * e, v[e]);
        }
        for (int64_t r0 = 0; r0 < j->rows; r0 += 3) {
            int nr = j->rows - r0 < 3 ? (int)(j->rows - r0) : 3;
            if (nn == 4) {
                if (nr == 3) scratch256(j, scratch, r0, 3, n0, 4);
                else if (nr == 2) scratch256(j, scratch, r0, 2, n0, 4);
                else scratch256(j, scratch, r0, 1, n0, 4);
            } else {
                for (int c = 0; c < nn; c++) scratch256(j, scratch + c * j->k, r0, nr, n0 + c, 1);
            }
        }
        return;
    }
    if (j->rows > 2 && j->rows <= RB) {
        if (j->fmt == LK_Q4_1) regs256(j, LK_Q4_1, n0, (int)nn);
        else regs256(j, LK_Q8_0, n0, (int)nn);
        return;
    }
    for (int64_t r0 = 0; r0 < j->rows; r0 += RB) {
        int64_t nr = j->rows - r0 < RB ? j->rows - r0 : RB;
        if (j->fmt == LK_Q4_1) {
            TILE_CASES(tile256_fixed, j, LK_Q4_1)
        } else {
            TILE_CASES(tile256_fixed, j, LK_Q8_0)
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
#define lk_tile_bf16_512 tile_c
#define lk_rows_to_bf16_512 lk_rows_to_bf16_c
#endif

/* The bfloat16 products follow the float ones: the BF16 instructions with AVX-512 where the CPU
 * has them, else plain C. */
static void set_isa(tile_fn f, const char *name) {
    tile = f;
    isa = name;
    tall_tile = NULL;
    tall_rows = 0;
#ifdef LK_X86
    if (f == tile512) {
        tall_tile = lk_tall_tiles512;
        tall_rows = TALL_ROWS_512;
    } else if (f == tile256) {
        tall_tile = lk_tall_tiles256;
        tall_rows = TALL_ROWS_256;
    }
#endif
    int vec = f == tile512 && has_avx512bf16();
    tile_bf16 = vec ? lk_tile_bf16_512 : tile_c;
    round_rows = vec ? lk_rows_to_bf16_512 : lk_rows_to_bf16_c;
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

/* The 8-bit products' route under the instruction set in use (qmatmul_tile.h). */
static int i8_route(void) { return tile == tile512 ? 2 : tile == tile256 ? 1 : 0; }

const char *lk_qmatmul_i8_route(void) {
    pick_isa();
    return lk_qmatmul_i8_isa(i8_route());
}

const char *lk_qmatmul_bf16_isa(void) {
    pick_isa();
    return tile_bf16 == tile_c ? "c" : "avx512bf16";
}

int lk_qmatmul_tall_rows(int rows) {
    pick_isa();
    int before = tall_rows;
    if (rows >= 0) tall_rows = rows;
    return before;
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
    /* The tall tiles need no scratch memory; without it the other tiles dequantize in registers:
     * slower for many rows, same sums. */
    int tall = !j->xb && tall_route(j);
    float *scratch = j->rows > RB && !tall ? aligned_alloc(64, (size_t)((NB * j->k * 4 + 63) / 64 * 64)) : NULL;
    for (int64_t r0 = 0; r0 < j->rows; r0 += ROW_CHUNK) {
        job c = *j;
        c.x = j->x + r0 * j->k;
        c.xb = j->xb ? j->xb + r0 * j->k : NULL;
        c.y = j->y + r0 * j->n;
        c.rows = j->rows - r0 < ROW_CHUNK ? j->rows - r0 : ROW_CHUNK;
        for (int64_t t = t0; t < t1; t++) {
            int64_t n0 = t * NB;
            int64_t nn = j->n - n0 < NB ? j->n - n0 : NB;
            if (tall) tall_tile(&c, n0, nn);
            else (j->xb ? tile_bf16 : tile)(&c, scratch, n0, nn);
        }
    }
    free(scratch);
}

/* Rounded rows up to this many elements live on the stack (a decode step's: no allocation a product). */
#define SMALL_ROWS_BF16 8192

int lk_qmatmul(int fmt, const float *x, int64_t rows, int64_t k, const uint8_t *qs, const float *dm, int64_t n,
               float *y, int threads) {
    pick_isa();
    if (fmt & LK_I8) return lk_qmatmul_i8(fmt & ~LK_I8, i8_route(), x, rows, k, qs, dm, n, y, threads);
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
