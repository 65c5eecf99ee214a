/* See rowexp.h. */
#include "rowexp.h"

#include <string.h>

#include "lk_exp.h"
#include "qmatmul.h"

static float max_c(const float *x, int64_t from, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = from; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static double exp_sum_c(const float *x, int64_t from, int64_t n, float m, float *e) {
    double s = 0.0;
    for (int64_t j = from; j < n; j++) {
        float v = lk_exp_c(x[j] - m);
        if (e) e[j] = v;
        s += v;
    }
    return s;
}

#ifdef LK_X86
__attribute__((target("avx512f,fma"))) static float max512(const float *x, int64_t n) {
    int64_t j = 0;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + j));
    float m = _mm512_reduce_max_ps(mv), tail = max_c(x, j, n);
    return tail > m ? tail : m;
}

__attribute__((target("avx512f,fma"))) static double exp_sum512(const float *x, int64_t n, float m, float *e) {
    int64_t j = 0;
    __m512 mm = _mm512_set1_ps(m);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd(); /* the sum in double, lane by lane */
    for (; j + 16 <= n; j += 16) {
        __m512 v = lk_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + j), mm));
        if (e) _mm512_storeu_ps(e + j, v);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    double lanes[16], s = 0.0;
    _mm512_storeu_pd(lanes, lo);
    _mm512_storeu_pd(lanes + 8, hi);
    for (int k = 0; k < 16; k++) s += lanes[k];
    return s + exp_sum_c(x, j, n, m, e);
}

__attribute__((target("avx2,fma"))) static float max256(const float *x, int64_t n) {
    int64_t j = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + j));
    float lanes[8], m = max_c(x, j, n);
    _mm256_storeu_ps(lanes, mv);
    for (int k = 0; k < 8; k++) m = lanes[k] > m ? lanes[k] : m;
    return m;
}

__attribute__((target("avx2,fma"))) static double exp_sum256(const float *x, int64_t n, float m, float *e) {
    int64_t j = 0;
    __m256 mm = _mm256_set1_ps(m);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(); /* the sum in double, lane by lane */
    for (; j + 8 <= n; j += 8) {
        __m256 v = lk_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + j), mm));
        if (e) _mm256_storeu_ps(e + j, v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double lanes[8], s = 0.0;
    _mm256_storeu_pd(lanes, lo);
    _mm256_storeu_pd(lanes + 4, hi);
    for (int k = 0; k < 8; k++) s += lanes[k];
    return s + exp_sum_c(x, j, n, m, e);
}
#endif

float lk_row_max(const float *x, int64_t n) {
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) return max512(x, n);
    if (strcmp(name, "avx2") == 0) return max256(x, n);
#endif
    return max_c(x, 0, n);
}

double lk_row_exp_sum(const float *x, int64_t n, float m, float *e) {
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) return exp_sum512(x, n, m, e);
    if (strcmp(name, "avx2") == 0) return exp_sum256(x, n, m, e);
#endif
    return exp_sum_c(x, 0, n, m, e);
}
