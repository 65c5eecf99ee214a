/* See qmatmul.h (LK_BF16) and qmatmul_tile.h. The bfloat16 products: each weight (formed from its
 * block as the float32 products form it) and each input element rounded to bfloat16, the products
 * summed in float32, one fixed order per (row, output). (Their plain-C route is qmatmul.c's tile_c.)
 *
 * The AVX-512 BF16 tile has the float32 tiles' two routes: a block's 32 weights rounded in
 * registers for few rows, or once into the scratch tile (half the bytes) for more; one vdpbf16ps a
 * block per (row, output) where float32 needs two fused multiply-adds. The rows are rounded once
 * per call, before the parts start (qmatmul.c). */
#include "qmatmul_tile.h"

void lk_rows_to_bf16_c(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_of(x[i]);
}

#ifdef LK_X86

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
    ahead a = ahead_of(j, n0, !w && r0 == 0 && nn == NB ? nblk : 0); /* as qmatmul.c's tile512_fixed */
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nn; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        __m512i wv[NB];
        ahead_step(&a, b);
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

BF16 void lk_tile_bf16_512(const job *j, float *scratch, int64_t n0, int64_t nn) {
    int64_t nblk = j->k / LK_QK, qb = qs_per_block(j->fmt), db = dm_per_block(j->fmt);
    const uint16_t *w = NULL;
    if (j->rows > RB && scratch) {
        uint16_t *ws = (uint16_t *)scratch;
        ahead a = ahead_of(j, n0, nn * nblk);
        for (int64_t c = 0; c < nn; c++)
            for (int64_t b = 0; b < nblk; b++) {
                ahead_step(&a, c * nblk + b);
                _mm512_storeu_si512(ws + c * j->k + b * LK_QK,
                                    wblock_bf16(j->fmt, j->qs + (n0 + c) * nblk * qb, j->dm + (n0 + c) * nblk * db, b));
            }
        w = ws;
    }
    ROW_TILES(tilebf16_fixed, j, w)
}

BF16 void lk_rows_to_bf16_512(const float *x, int64_t n, uint16_t *out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    lk_rows_to_bf16_c(x + i, n - i, out + i);
}

#endif /* LK_X86 */
