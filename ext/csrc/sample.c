/* See sample.h. */
#include "sample.h"

#include "rowexp.h"

int64_t lk_sample_row(const float *x, int64_t n, float temperature, double u, float *e) {
    for (int64_t j = 0; j < n; j++) e[j] = x[j] / temperature;
    double total = lk_row_exp_sum(e, n, lk_row_max(e, n), e), target = u * total, c = 0.0;
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (e[j] > 0.0f) last = j;
        c += e[j];
        if (c > target) return j;
    }
    return last; /* u * total rounded up to the total: the last token with mass */
}
