/* RMS normalisation of rows, as Llama-family models apply it:
 *
 *   y[r, i] = w[i] * (x[r, i] * (1 / sqrt(mean_i(x[r, i]^2) + eps)))
 *
 * in float32, each row's sum of squares taken in one fixed order (index order), so a row's
 * output never depends on the other rows: a verify forward's row equals the same row of a
 * one-row forward bit for bit. x and y are rows x n, row-major; they may be the same buffer. */
#ifndef LK_RMSNORM_H
#define LK_RMSNORM_H

#include <stdint.h>

void lk_rms_norm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y);

#endif
