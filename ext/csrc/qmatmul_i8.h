/* Internal to the 8-bit products (qmatmul_i8.c: packing, plain C, AVX-512 VNNI and the dispatch;
 * qmatmul_i8_avx2.c: AVX2): the packed layout's sizes, the rounded rows and a product's job. The
 * public interface is qmatmul.h (LK_I8). */
#ifndef LK_QMATMUL_I8_H
#define LK_QMATMUL_I8_H

#include "qmatmul_tile.h"

#define G 16 /* outputs per group */

static inline int64_t groups(int64_t n) { return (n + G - 1) / G; }
/* Packed bytes and floats per (group, block): see qmatmul_i8.c. */
static inline int64_t packed_q_per_block(int fmt) { return fmt == LK_Q4_1 ? 256 : 512; }
static inline int64_t packed_d_per_block(int fmt) { return fmt == LK_Q4_1 ? 32 : 16; }

/* The rows, rounded to 8 bits per block of 32. */
typedef struct {
    int8_t *p;     /* rows x k */
    float *s;      /* rows x nblk: the block's scale */
    float *ssum;   /* rows x nblk: s * sum p (Q4_1's m term) */
    int32_t *psum; /* rows x nblk: 128 * sum p (the VNNI route's Q8_0 offset) */
} qrows;

typedef struct {
    int fmt; /* LK_Q4_1 or LK_Q8_0 */
    qrows x;
    int64_t rows, k, n;
    const uint8_t *pq;
    const float *pdm;
    float *y;
} job8;

/* Rows r0 .. r0 + nr - 1 against groups g0 .. g1 - 1. */
typedef void (*lk_i8_groups_fn)(const job8 *, int64_t r0, int64_t nr, int64_t g0, int64_t g1);

void lk_i8_quant_c(const float *x, int64_t rows, int64_t k, qrows *q);
void lk_i8_groups_c(const job8 *j, int64_t r0, int64_t nr, int64_t g0, int64_t g1);
/* AVX2 (qmatmul_i8_avx2.c): the same rounding and the same bits as plain C. */
int lk_i8_has_avx2(void);
#ifdef LK_X86
void lk_i8_quant_avx2(const float *x, int64_t rows, int64_t k, qrows *q);
void lk_i8_groups_avx2(const job8 *j, int64_t r0, int64_t nr, int64_t g0, int64_t g1);
#endif

#endif
