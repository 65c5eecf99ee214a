/* Reductions over a row of float32 logits shared by the native kernels that read logits (the top-k,
 * a sampled token): its maximum, and the sum of exp(x - m) with lk_exp.h's polynomial, summed in
 * double (49,152 float32 additions in a row would lose ~1e-4) in a fixed order per instruction set
 * (the one lk_qmatmul_isa() names: AVX-512, AVX2 or plain C). */
#ifndef LK_ROWEXP_H
#define LK_ROWEXP_H

#include <stdint.h>

float lk_row_max(const float *x, int64_t n);

/* numpy's argmax of n >= 1 floats: the index of the first maximum, or of the first NaN if any. */
int64_t lk_row_argmax(const float *x, int64_t n);

/* sum_j exp(x[j] - m); when e is not NULL also e[j] = exp(x[j] - m) (e may be x). */
double lk_row_exp_sum(const float *x, int64_t n, float m, float *e);

#endif
