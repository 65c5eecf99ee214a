/* See topk.h. */
#include "topk.h"

#include <math.h>
#include <stddef.h>

#include "lk_exp.h"
#include "rowexp.h"

/* The k best so far, best first; a new (v, i) enters if better than the last. "Better": a larger
 * value, or an equal one at a lower index (indices arrive ascending, so an equal value never enters). */
typedef struct {
    float v[LK_TOPK_MAX];
    int64_t i[LK_TOPK_MAX];
    int k, n;
} best;

static void offer(best *b, float v, int64_t i) {
    int at = b->n < b->k ? b->n++ : b->k - 1;
    while (at > 0 && v > b->v[at - 1]) {
        b->v[at] = b->v[at - 1];
        b->i[at] = b->i[at - 1];
        at--;
    }
    b->v[at] = v;
    b->i[at] = i;
}

#define CHUNK 256

void lk_topk_rows(const float *x, int64_t R, int64_t n, int k, int64_t *ids, float *probs) {
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * n;
        best b = {.k = k, .n = 0};
        /* Past the first k, a value enters only above the k-th: a block of CHUNK logits whose
         * maximum is not above it is skipped whole (most of them, once the k-th is high). */
        float floor_v = -INFINITY;
        for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
            int64_t j1 = j0 + CHUNK < n ? j0 + CHUNK : n;
            if (b.n == k && !(lk_row_max(row + j0, j1 - j0) > floor_v)) continue;
            for (int64_t j = j0; j < j1; j++) {
                if (b.n < k || row[j] > floor_v) {
                    offer(&b, row[j], j);
                    if (b.n == k) floor_v = b.v[k - 1];
                }
            }
        }
        float m = b.n ? b.v[0] : lk_row_max(row, n); /* the top-1 is the maximum */
        double s = lk_row_exp_sum(row, n, m, NULL);
        for (int c = 0; c < k; c++) {
            ids[r * k + c] = b.i[c];
            probs[r * k + c] = (float)(lk_exp_c(b.v[c] - m) / s);
        }
    }
}
