/* See sample.h. */
#include "sample.h"

#include <string.h>

#include "lk_exp.h"
#include "qmatmul.h"

/* e = x / T from `from` on; returns their maximum. */
static float scale_max_c(const float *x, int64_t from, int64_t n, float t, float *e) {
    float m = -INFINITY;
    for (int64_t j = from; j < n; j++) {
        e[j] = x[j] / t;
        m = e[j] > m ? e[j] : m;
    }
    return m;
}

static double exp_sum_c(float *e, int64_t from, int64_t n, float m) {
    double s = 0.0;
    for (int64_t j = from; j < n; j++) {
        e[j] = lk_exp_c(e[j] - m);
        s += e[j];
    }
    return s;
}

static double masses_c(const float *x, int64_t n, float t, float *e) {
    float m = scale_max_c(x, 0, n, t, e);
    return exp_sum_c(e, 0, n, m);
}

#ifdef LK_X86
__attribute__((target("avx512f,fma"))) static double masses512(const float *x, int64_t n, float t, float *e) {
    int64_t j = 0;
    __m512 tv = _mm512_set1_ps(t), mv = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) {
        __m512 s = _mm512_div_ps(_mm512_loadu_ps(x + j), tv);
        _mm512_storeu_ps(e + j, s);
        mv = _mm512_max_ps(mv, s);
    }
    float m = _mm512_reduce_max_ps(mv), tail = scale_max_c(x, j, n, t, e);
    m = tail > m ? tail : m;
    __m512 mm = _mm512_set1_ps(m);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 v = lk_exp512(_mm512_sub_ps(_mm512_loadu_ps(e + j), mm));
        _mm512_storeu_ps(e + j, v);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    double lanes[16], sum = 0.0;
    _mm512_storeu_pd(lanes, lo);
    _mm512_storeu_pd(lanes + 8, hi);
    for (int k = 0; k < 16; k++) sum += lanes[k];
    return sum + exp_sum_c(e, j, n, m);
}

__attribute__((target("avx2,fma"))) static double masses256(const float *x, int64_t n, float t, float *e) {
    int64_t j = 0;
    __m256 tv = _mm256_set1_ps(t), mv = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) {
        __m256 s = _mm256_div_ps(_mm256_loadu_ps(x + j), tv);
        _mm256_storeu_ps(e + j, s);
        mv = _mm256_max_ps(mv, s);
    }
    float lanes_f[8], m = scale_max_c(x, j, n, t, e);
    _mm256_storeu_ps(lanes_f, mv);
    for (int k = 0; k < 8; k++) m = lanes_f[k] > m ? lanes_f[k] : m;
    __m256 mm = _mm256_set1_ps(m);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 v = lk_exp256(_mm256_sub_ps(_mm256_loadu_ps(e + j), mm));
        _mm256_storeu_ps(e + j, v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double lanes[8], sum = 0.0;
    _mm256_storeu_pd(lanes, lo);
    _mm256_storeu_pd(lanes + 4, hi);
    for (int k = 0; k < 8; k++) sum += lanes[k];
    return sum + exp_sum_c(e, j, n, m);
}
#endif

int64_t lk_sample_row(const float *x, int64_t n, float temperature, double u, float *e) {
    double (*masses)(const float *, int64_t, float, float *) = masses_c;
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) masses = masses512;
    else if (strcmp(name, "avx2") == 0) masses = masses256;
#endif
    double total = masses(x, n, temperature, e), target = u * total, c = 0.0;
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (e[j] > 0.0f) last = j;
        c += e[j];
        if (c > target) return j;
    }
    return last; /* u * total rounded up to the total: the last token with mass */
}
