/* See topk.h. */
#include "topk.h"

#include <string.h>

#include "lk_exp.h"
#include "qmatmul.h"

/* The k best so far, best first; a new (v, i) enters if better than the last. "Better": a larger
 * value, or an equal one at a lower index (indices arrive ascending, so an equal value never enters). */
typedef struct {
    float v[LK_TOPK_MAX];
    int64_t i[LK_TOPK_MAX];
    int k, n;
} best;

static inline float threshold(const best *b) { return b->n < b->k ? -INFINITY : b->v[b->k - 1]; }

static void offer(best *b, float v, int64_t i) {
    if (b->n == b->k && !(v > b->v[b->k - 1])) return;
    int at = b->n < b->k ? b->n++ : b->k - 1;
    while (at > 0 && v > b->v[at - 1]) {
        b->v[at] = b->v[at - 1];
        b->i[at] = b->i[at - 1];
        at--;
    }
    b->v[at] = v;
    b->i[at] = i;
}

static float row_max_c(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* sum of exp(x - m) over j in [from, n), in index order, in double (49,152 float32 additions in a
 * row lose ~1e-4); the top-k offered every element. */
static double sum_offer_c(const float *x, int64_t from, int64_t n, float m, best *b) {
    double s = 0.0;
    for (int64_t j = from; j < n; j++) {
        s += lk_exp_c(x[j] - m);
        if (x[j] > threshold(b) || b->n < b->k) offer(b, x[j], j);
    }
    return s;
}

static void row_c(const float *x, int64_t n, best *b, float *m, double *s) {
    *m = row_max_c(x, n);
    *s = sum_offer_c(x, 0, n, *m, b);
}

#ifdef LK_X86
__attribute__((target("avx512f,fma"))) static void row512(const float *x, int64_t n, best *b, float *m, double *s) {
    int64_t j = 0;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + j));
    float mx = _mm512_reduce_max_ps(mv), tail = row_max_c(x + j, n - j);
    mx = tail > mx ? tail : mx;
    __m512 mm = _mm512_set1_ps(mx);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd(); /* the sum in double, lane by lane */
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        __m512 e = lk_exp512(_mm512_sub_ps(v, mm));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
        __mmask16 hit = b->n < b->k ? 0xFFFF : _mm512_cmp_ps_mask(v, _mm512_set1_ps(threshold(b)), _CMP_GT_OQ);
        while (hit) {
            int lane = __builtin_ctz(hit);
            offer(b, x[j + lane], j + lane);
            hit &= hit - 1;
        }
    }
    double lanes[16], sum = 0.0;
    _mm512_storeu_pd(lanes, lo);
    _mm512_storeu_pd(lanes + 8, hi);
    for (int e = 0; e < 16; e++) sum += lanes[e];
    *m = mx;
    *s = sum + sum_offer_c(x, j, n, mx, b);
}

__attribute__((target("avx2,fma"))) static void row256(const float *x, int64_t n, best *b, float *m, double *s) {
    int64_t j = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + j));
    float lanes[8], mx = row_max_c(x + j, n - j);
    _mm256_storeu_ps(lanes, mv);
    for (int e = 0; e < 8; e++) mx = lanes[e] > mx ? lanes[e] : mx;
    __m256 mm = _mm256_set1_ps(mx);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(); /* the sum in double, lane by lane */
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256 e = lk_exp256(_mm256_sub_ps(v, mm));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        int hit = b->n < b->k ? 0xFF
                              : _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(threshold(b)), _CMP_GT_OQ));
        while (hit) {
            int lane = __builtin_ctz(hit);
            offer(b, x[j + lane], j + lane);
            hit &= hit - 1;
        }
    }
    double sums[8], sum = 0.0;
    _mm256_storeu_pd(sums, lo);
    _mm256_storeu_pd(sums + 4, hi);
    for (int e = 0; e < 8; e++) sum += sums[e];
    *m = mx;
    *s = sum + sum_offer_c(x, j, n, mx, b);
}
#endif

void lk_topk_rows(const float *x, int64_t R, int64_t n, int k, int64_t *ids, float *probs) {
    void (*row)(const float *, int64_t, best *, float *, double *) = row_c;
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) row = row512;
    else if (strcmp(name, "avx2") == 0) row = row256;
#endif
    for (int64_t r = 0; r < R; r++) {
        best b;
        b.k = k;
        b.n = 0;
        float m;
        double s;
        row(x + r * n, n, &b, &m, &s);
        for (int c = 0; c < k; c++) {
            ids[r * k + c] = b.i[c];
            probs[r * k + c] = (float)(lk_exp_c(b.v[c] - m) / s);
        }
    }
}
