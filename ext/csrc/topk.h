/* Top-k of logit rows with their softmax probabilities (Token Recycling's deferred top-k).
 *
 * For each of R rows of n float32 logits: the k largest, most likely first (equal values: the
 * lower index first), and p = exp(v - max) / sum_j exp(x_j - max). torch's topk and logsumexp
 * cost ~0.2 ms a row of 49,152 here, most of it dispatch; this is two passes: the top-k
 * (blocks whose maximum cannot enter are skipped), whose first is the row's maximum, then the sum
 * of exp (rowexp.h: lk_exp.h's polynomial, summed in double in a fixed order per instruction set).
 * Drafting reads these: no output token depends on them. */
#ifndef LK_TOPK_H
#define LK_TOPK_H

#include <stdint.h>

#define LK_TOPK_MAX 64 /* most k */

/* ids: R x k int64, probs: R x k float32. k must be 1..LK_TOPK_MAX and <= n. */
void lk_topk_rows(const float *x, int64_t R, int64_t n, int k, int64_t *ids, float *probs);

#endif
