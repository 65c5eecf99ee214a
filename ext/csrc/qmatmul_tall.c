/* See qmatmul_tile.h. The tall tiles, for AVX-512 and AVX2: the float32 products of a few rows more
 * than the 4-row register tiles take (qmatmul.c picks them for up to lk_qmatmul_tall_rows rows), each
 * (row, output) summed in the same order as the other routes. */
#include "qmatmul_tile.h"

#ifdef LK_X86

/* Rows r0 .. r0 + nr - 1 (nr <= TALL_RB) against outputs n0 .. n0 + nc - 1 (nc <= TALL_NB), the weights
 * unpacked in registers: each block of an output is unpacked once for up to 8 rows, and nothing is
 * stored. For 5-8 rows the 4 x 4 tile would unpack every block twice, and the scratch tile stores and
 * reloads every weight: a verify forward of 5 rows took 14.4 ms through it against 10.5 in these tiles,
 * of 8 rows 19.4 against 15.0 (2-core AMD EPYC with AVX-512, benchmarks/forward_widths.py
 * --compare-routes). 16 accumulators, 4 weight halves and 2 input halves: 22 of the 32 vector registers. */
#define TALL_RB 8
#define TALL_NB 2
INLINE512 void tall512(const job *j, int fmt, int64_t r0, int nr, int64_t n0, int nc, const ahead *a) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(fmt), db = dm_per_block(fmt);
    __m512 acc[TALL_RB][TALL_NB];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512 lo[TALL_NB], hi[TALL_NB];
        ahead_step(a, b);
        for (int c = 0; c < nc; c++)
            dequant512(fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b, &lo[c], &hi[c]);
        for (int r = 0; r < nr; r++) {
            const float *x = j->x + (r0 + r) * j->k + b * LK_QK;
            __m512 xl = _mm512_loadu_ps(x), xh = _mm512_loadu_ps(x + 16);
            for (int c = 0; c < nc; c++) {
                acc[r][c] = _mm512_fmadd_ps(lo[c], xl, acc[r][c]);
                acc[r][c] = _mm512_fmadd_ps(hi[c], xh, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) j->y[(r0 + r) * j->n + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* tall512 with constant sizes: nr rows against TALL_NB outputs, or one output at a time. */
#define TALL_CASE(FMT, NR)                                                                           \
    case NR:                                                                                         \
        if (nc == TALL_NB) {                                                                         \
            tall512(j, FMT, r0, NR, n0 + c0, TALL_NB, a);                                            \
        } else {                                                                                     \
            for (int c = 0; c < nc; c++) tall512(j, FMT, r0, NR, n0 + c0 + c, 1, c ? &none : a);     \
        }                                                                                            \
        break;

/* CASE(FMT, nr) with nr a constant of 1-8 (the tall tiles' row counts). */
#define ROWS_1_TO_8(CASE, FMT)                                                                       \
    switch (nr) {                                                                                    \
        CASE(FMT, 1)                                                                                 \
        CASE(FMT, 2)                                                                                 \
        CASE(FMT, 3)                                                                                 \
        CASE(FMT, 4)                                                                                 \
        CASE(FMT, 5)                                                                                 \
        CASE(FMT, 6)                                                                                 \
        CASE(FMT, 7)                                                                                 \
    default:                                                                                         \
        CASE(FMT, 8)                                                                                 \
    }

/* Every row of the job against outputs n0 .. n0 + nn - 1 in tall tiles; the first asks for the next
 * output tile's weights (as tile512_fixed's first row tile does). */
AVX512 void lk_tall_tiles512(const job *j, int64_t n0, int64_t nn) {
    ahead first = ahead_of(j, n0, nn == NB ? j->k / LK_QK : 0), none = ahead_of(j, n0, 0);
    for (int64_t c0 = 0; c0 < nn; c0 += TALL_NB) {
        int nc = nn - c0 < TALL_NB ? (int)(nn - c0) : TALL_NB;
        for (int64_t r0 = 0; r0 < j->rows; r0 += TALL_RB) {
            int nr = j->rows - r0 < TALL_RB ? (int)(j->rows - r0) : TALL_RB;
            const ahead *a = c0 == 0 && r0 == 0 ? &first : &none;
            if (j->fmt == LK_Q4_1) {
                ROWS_1_TO_8(TALL_CASE, LK_Q4_1)
            } else {
                ROWS_1_TO_8(TALL_CASE, LK_Q8_0)
            }
        }
    }
}

/* AVX2's tall tiles: every row of the job against outputs n0 .. n0 + nn - 1 in reg256's 8 rows x 1
 * output (16 vector registers: 8 accumulators and a block's 4 weight quarters); the first asks for
 * the next output tile's weights. The model's layer products of 5 rows took 9.5 ms in them against
 * 11.5 through the scratch tile, of 8 rows 13.5 against 14.3 (2 threads; AVX2 on a 2-core AMD EPYC
 * with AVX-512, benchmarks/product_routes.py --isa avx2; not timed on an AVX2-only CPU). Tiles of
 * 10 or 12 rows, and 4-6 rows x 2 outputs with a quarter of each output's block at a time, were no
 * faster. */
#define TALL2_CASE(FMT, NR)                       \
    case NR:                                      \
        reg256(j, FMT, r0, NR, n0 + c, 1, a);     \
        break;

AVX2 void lk_tall_tiles256(const job *j, int64_t n0, int64_t nn) {
    ahead first = ahead_of(j, n0, nn == NB ? j->k / LK_QK : 0), none = ahead_of(j, n0, 0);
    for (int64_t c = 0; c < nn; c++) {
        for (int64_t r0 = 0; r0 < j->rows; r0 += 8) {
            int nr = j->rows - r0 < 8 ? (int)(j->rows - r0) : 8;
            const ahead *a = c == 0 && r0 == 0 ? &first : &none;
            if (j->fmt == LK_Q4_1) {
                ROWS_1_TO_8(TALL2_CASE, LK_Q4_1)
            } else {
                ROWS_1_TO_8(TALL2_CASE, LK_Q8_0)
            }
        }
    }
}

#endif /* LK_X86 */
