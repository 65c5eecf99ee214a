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

/* The first NaN from ``from`` on, or -1. */
static int64_t first_nan(const float *x, int64_t from, int64_t n) {
    for (int64_t j = from; j < n; j++)
        if (x[j] != x[j]) return j;
    return -1;
}

/* argmax from ``from`` on, given the best (m, at) of x[0..from) without a NaN there. */
static int64_t argmax_c(const float *x, int64_t from, int64_t n, float m, int64_t at) {
    int64_t nan = first_nan(x, from, n);
    if (nan >= 0) return nan;
    for (int64_t j = from; j < n; j++)
        if (x[j] > m) { m = x[j]; at = j; }
    return at;
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

/* Each lane keeps its largest value and the first index it came at (strict >); the row's argmax is
 * the lowest index among the lanes holding the largest value. A NaN anywhere: the first NaN. */
__attribute__((target("avx512f,fma"))) static int64_t argmax512(const float *x, int64_t n) {
    int64_t j = 0;
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i at = _mm512_setzero_si512(), cur = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best = _mm512_mask_blend_ps(gt, best, v);
        at = _mm512_mask_blend_epi32(gt, at, cur);
        cur = _mm512_add_epi32(cur, step);
    }
    if (nan) return first_nan(x, 0, j);
    float vals[16], m = -INFINITY;
    int32_t idx[16];
    int64_t a = 0;
    _mm512_storeu_ps(vals, best);
    _mm512_storeu_si512(idx, at);
    for (int k = 0; k < 16 && j; k++)
        if (vals[k] > m || (vals[k] == m && idx[k] < a)) { m = vals[k]; a = idx[k]; }
    return argmax_c(x, j, n, m, a);
}

__attribute__((target("avx2,fma"))) static int64_t argmax256(const float *x, int64_t n) {
    int64_t j = 0;
    __m256 best = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    __m256i at = _mm256_setzero_si256(), cur = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, v, gt);
        at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(cur), gt));
        cur = _mm256_add_epi32(cur, step);
    }
    if (_mm256_movemask_ps(nan)) return first_nan(x, 0, j);
    float vals[8], m = -INFINITY;
    int32_t idx[8];
    int64_t a = 0;
    _mm256_storeu_ps(vals, best);
    _mm256_storeu_si256((__m256i *)idx, at);
    for (int k = 0; k < 8 && j; k++)
        if (vals[k] > m || (vals[k] == m && idx[k] < a)) { m = vals[k]; a = idx[k]; }
    return argmax_c(x, j, n, m, a);
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

int64_t lk_row_argmax(const float *x, int64_t n) {
    if (n <= 0) return 0;
#ifdef LK_X86
    if (n < 1LL << 31) { /* lane indices are int32 */
        const char *name = lk_qmatmul_isa();
        if (strcmp(name, "avx512") == 0) return argmax512(x, n);
        if (strcmp(name, "avx2") == 0) return argmax256(x, n);
    }
#endif
    if (first_nan(x, 0, n) >= 0) return first_nan(x, 0, n);
    return argmax_c(x, 1, n, x[0], 0);
}

double lk_row_exp_sum(const float *x, int64_t n, float m, float *e) {
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) return exp_sum512(x, n, m, e);
    if (strcmp(name, "avx2") == 0) return exp_sum256(x, n, m, e);
#endif
    return exp_sum_c(x, 0, n, m, e);
}
