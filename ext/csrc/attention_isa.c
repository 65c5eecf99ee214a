/* See attention_isa.h. */
#include "attention_isa.h"

#include <math.h>
#include <string.h>

#include "attention_simd.h"
#include "half.h"
#include "lk_exp.h"
#include "qmatmul.h"

/* exp of the scores minus their maximum (x <= 0): lk_exp.h's polynomial, exactly 0 below -87.3 (a
 * masked key); its scalar and vector forms give the same bits. */
static inline float exp_c(float x) { return lk_exp_c(x); }

/* Element d of a cache row: float32, or float16 turned into its exact float32 value. Each routine
 * below is written once over `half` (a constant where it is inlined), so both caches run the same
 * float32 operations in the same order on the same values. */
static inline float elem_c(const void *row, int64_t d, const int half) {
    return half ? lk_half_to_float(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

static inline __attribute__((always_inline)) void dots_c_t(const float *const q[TQ], const void *const k[TK], int D,
                                                           float out[TK * TQ], const int half, const int nq) {
    for (int c = 0; c < TK; c++)
        for (int i = 0; i < nq; i++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc = fmaf(q[i][d], elem_c(k[c], d, half), acc);
            out[i * TK + c] = acc;
        }
}

static inline __attribute__((always_inline)) void pv_c_t(const float *const p[TQ], const void *vals, int64_t n,
                                                         int64_t stride, int D, float *const o[TQ], float l[TQ],
                                                         const int half, const int nq) {
    for (int64_t j = 0; j < n; j++)
        for (int i = 0; i < nq; i++) {
            float pj = p[i][j];
            if (pj == 0.0f) continue; /* adds exactly nothing: a masked key leaves no trace */
            l[i] += pj;
            for (int d = 0; d < D; d++) o[i][d] = fmaf(pj, elem_c(vals, j * stride + d, half), o[i][d]);
        }
}

/* The routines the sets export, over tiles of nq <= TQ real queries: each size its own instance, so the
 * padding queries of a short tile (a one-row step's 3 heads a kv head) cost nothing. A real query's
 * operations are the same in every instance. */
#define DOTS_ROUTINE(name, attr, tmpl, half)                                                               \
    attr static void name(const float *const q[TQ], int nq, const void *const k[TK], int D, float out[TK * TQ]) { \
        switch (nq) {                                                                                      \
        case 1: tmpl(q, k, D, out, half, 1); break;                                                        \
        case 2: tmpl(q, k, D, out, half, 2); break;                                                        \
        case 3: tmpl(q, k, D, out, half, 3); break;                                                        \
        default: tmpl(q, k, D, out, half, TQ);                                                             \
        }                                                                                                  \
    }
#define PV_ROUTINE(name, attr, tmpl, half)                                                                  \
    attr static void name(const float *const p[TQ], int nq, const void *vals, int64_t n, int64_t stride, int D, \
                          float *const o[TQ], float l[TQ]) {                                                \
        switch (nq) {                                                                                      \
        case 1: tmpl(p, vals, n, stride, D, o, l, half, 1); break;                                         \
        case 2: tmpl(p, vals, n, stride, D, o, l, half, 2); break;                                         \
        case 3: tmpl(p, vals, n, stride, D, o, l, half, 3); break;                                         \
        default: tmpl(p, vals, n, stride, D, o, l, half, TQ);                                              \
        }                                                                                                  \
    }
#define PLAIN /* no target attribute */

DOTS_ROUTINE(dots_c, PLAIN, dots_c_t, 0)
DOTS_ROUTINE(dots_c_h, PLAIN, dots_c_t, 1)
PV_ROUTINE(pv_c, PLAIN, pv_c_t, 0)
PV_ROUTINE(pv_c_h, PLAIN, pv_c_t, 1)

/* s = s * scale + bias (bias may be NULL); returns the maximum. Elementwise, so any lane order
 * gives the same bits. */
static float scale_max_c(float *s, const float *bias, int64_t n, float scale) {
    float m = -INFINITY;
    for (int64_t c = 0; c < n; c++) {
        float x = s[c] * scale;
        if (bias) x += bias[c];
        s[c] = x;
        m = x > m ? x : m;
    }
    return m;
}

static void exp_all_c(float *s, int64_t n, float m) {
    for (int64_t j = 0; j < n; j++) s[j] = exp_c(s[j] - m);
}


#ifdef LK_X86
#define PV_AHEAD 16 /* value rows read ahead */

INLINE512 void dots512_t(const float *const q[TQ], const void *const k[TK], int D, float out[TK * TQ], const int half,
                         const int nq) {
    __m512 acc[TK][TQ];
    for (int c = 0; c < TK; c++)
        for (int i = 0; i < TQ; i++) acc[c][i] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 qv[TQ];
        for (int i = 0; i < nq; i++) qv[i] = _mm512_loadu_ps(q[i] + d);
        for (int c = 0; c < TK; c++) {
            __m512 kv = load512(k[c], d, half);
            for (int i = 0; i < nq; i++) acc[c][i] = _mm512_fmadd_ps(qv[i], kv, acc[c][i]);
        }
    }
    /* Sum each accumulator's 16 lanes, all 16 at once: a transpose-and-add network that adds lane l to
     * l + 8, then l + 4, l + 2, l + 1 (one order for every pair); lane 4k + e of the result holds
     * input 4e + k, so with input 4c + i = (key c, query i) lane 4i + c holds (query i, key c). */
    __m512 x[16], t[8], u[4], v[2];
    for (int c = 0; c < TK; c++)
        for (int i = 0; i < TQ; i++) x[4 * c + i] = acc[c][i];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        v[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD)));
}

DOTS_ROUTINE(dots512, AVX512, dots512_t, 0)
DOTS_ROUTINE(dots512_h, AVX512, dots512_t, 1)

INLINE512 void pv512_t(const float *const p[TQ], const void *vals, int64_t n, int64_t stride, int D,
                        float *const o[TQ], float l[TQ], const int half, const int nq) {
    int d0 = 0, first = 1; /* the first pass over the keys adds the denominators */
    float ls[TQ];
    for (int i = 0; i < nq; i++) ls[i] = l[i];
    for (; d0 + 64 <= D; d0 += 64) {
        __m512 acc[TQ][4];
        for (int i = 0; i < nq; i++)
            for (int e = 0; e < 4; e++) acc[i][e] = _mm512_loadu_ps(o[i] + d0 + 16 * e);
        for (int64_t j = 0; j < n; j++) {
            const void *v = at(vals, j * stride + d0, half);
            for (int e = 0; e < 4; e += 2 - half) /* a line: 16 floats or 32 float16s */
                _mm_prefetch((const char *)at(v, PV_AHEAD * stride + 16 * e, half), _MM_HINT_T0);
            __m512 vv[4];
            for (int e = 0; e < 4; e++) vv[e] = load512(v, 16 * e, half);
            for (int i = 0; i < nq; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue; /* adds exactly nothing: a masked key leaves no trace */
                if (first) ls[i] += pj;
                __m512 pb = _mm512_set1_ps(pj);
                for (int e = 0; e < 4; e++) acc[i][e] = _mm512_fmadd_ps(pb, vv[e], acc[i][e]);
            }
        }
        for (int i = 0; i < nq; i++)
            for (int e = 0; e < 4; e++) _mm512_storeu_ps(o[i] + d0 + 16 * e, acc[i][e]);
        first = 0;
    }
    for (; d0 < D; d0 += 16) {
        __m512 acc[TQ];
        for (int i = 0; i < nq; i++) acc[i] = _mm512_loadu_ps(o[i] + d0);
        for (int64_t j = 0; j < n; j++) {
            __m512 vv = load512(vals, j * stride + d0, half);
            for (int i = 0; i < nq; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue;
                if (first) ls[i] += pj;
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(pj), vv, acc[i]);
            }
        }
        for (int i = 0; i < nq; i++) _mm512_storeu_ps(o[i] + d0, acc[i]);
        first = 0;
    }
    for (int i = 0; i < nq; i++) l[i] = ls[i];
}

PV_ROUTINE(pv512, AVX512, pv512_t, 0)
PV_ROUTINE(pv512_h, AVX512, pv512_t, 1)

AVX512 static float scale_max512(float *s, const float *bias, int64_t n, float scale) {
    int64_t c = 0;
    __m512 mv = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    for (; c + 16 <= n; c += 16) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + c), sc);
        if (bias) x = _mm512_add_ps(x, _mm512_loadu_ps(bias + c));
        _mm512_storeu_ps(s + c, x);
        mv = _mm512_max_ps(mv, x);
    }
    float m = scale_max_c(s + c, bias ? bias + c : NULL, n - c, scale), mvec = _mm512_reduce_max_ps(mv);
    return mvec > m ? mvec : m;
}

AVX512 static void exp_all512(float *s, int64_t n, float m) {
    int64_t j = 0;
    const __m512 mv = _mm512_set1_ps(m);
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(s + j, lk_exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv)));
    exp_all_c(s + j, n - j, m);
}

AVX2 static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE256 void dots256_t(const float *const q[TQ], const void *const k[TK], int D, float out[TK * TQ], const int half,
                         const int nq) {
    for (int c = 0; c < TK; c++) {
        __m256 acc[TQ];
        for (int i = 0; i < nq; i++) acc[i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 kv = load256(k[c], d, half);
            for (int i = 0; i < nq; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q[i] + d), kv, acc[i]);
        }
        for (int i = 0; i < nq; i++) out[i * TK + c] = hsum256(acc[i]);
    }
}

DOTS_ROUTINE(dots256, AVX2, dots256_t, 0)
DOTS_ROUTINE(dots256_h, AVX2, dots256_t, 1)

/* Output chunks of 32 floats: 4 registers for each of the TQ queries, as pv512. */
INLINE256 void pv256_t(const float *const p[TQ], const void *vals, int64_t n, int64_t stride, int D,
                        float *const o[TQ], float l[TQ], const int half, const int nq) {
    int d0 = 0, first = 1; /* the first pass over the keys adds the denominators */
    float ls[TQ];
    for (int i = 0; i < nq; i++) ls[i] = l[i];
    for (; d0 + 32 <= D; d0 += 32) {
        __m256 acc[TQ][4];
        for (int i = 0; i < nq; i++)
            for (int e = 0; e < 4; e++) acc[i][e] = _mm256_loadu_ps(o[i] + d0 + 8 * e);
        for (int64_t j = 0; j < n; j++) {
            const void *v = at(vals, j * stride + d0, half);
            __m256 vv[4];
            for (int e = 0; e < 4; e++) vv[e] = load256(v, 8 * e, half);
            for (int i = 0; i < nq; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue;
                if (first) ls[i] += pj;
                __m256 pb = _mm256_set1_ps(pj);
                for (int e = 0; e < 4; e++) acc[i][e] = _mm256_fmadd_ps(pb, vv[e], acc[i][e]);
            }
        }
        for (int i = 0; i < nq; i++)
            for (int e = 0; e < 4; e++) _mm256_storeu_ps(o[i] + d0 + 8 * e, acc[i][e]);
        first = 0;
    }
    for (; d0 < D; d0 += 8) {
        __m256 acc[TQ];
        for (int i = 0; i < nq; i++) acc[i] = _mm256_loadu_ps(o[i] + d0);
        for (int64_t j = 0; j < n; j++) {
            __m256 vv = load256(vals, j * stride + d0, half);
            for (int i = 0; i < nq; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue;
                if (first) ls[i] += pj;
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(pj), vv, acc[i]);
            }
        }
        for (int i = 0; i < nq; i++) _mm256_storeu_ps(o[i] + d0, acc[i]);
        first = 0;
    }
    for (int i = 0; i < nq; i++) l[i] = ls[i];
}

PV_ROUTINE(pv256, AVX2, pv256_t, 0)
PV_ROUTINE(pv256_h, AVX2, pv256_t, 1)

AVX2 static float scale_max256(float *s, const float *bias, int64_t n, float scale) {
    int64_t c = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    for (; c + 8 <= n; c += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + c), sc);
        if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + c));
        _mm256_storeu_ps(s + c, x);
        mv = _mm256_max_ps(mv, x);
    }
    float m = scale_max_c(s + c, bias ? bias + c : NULL, n - c, scale), buf[8];
    _mm256_storeu_ps(buf, mv);
    for (int e = 0; e < 8; e++) m = buf[e] > m ? buf[e] : m;
    return m;
}

AVX2 static void exp_all256(float *s, int64_t n, float m) {
    int64_t j = 0;
    const __m256 mv = _mm256_set1_ps(m);
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, lk_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)));
    exp_all_c(s + j, n - j, m);
}
#endif

/* dots_block (attention.c: tasks of 5 tiles of queries or more) with AVX-512 only:
 * benchmarks/attention_shapes.py --compare-attention on the AMD EPYC with AVX-512 gave 0.95x for 8 rows
 * of 9 heads over 3 (6 tiles) and 0.71x for 128-row prompt chunks. An AVX2 form (8 keys a vector, in
 * hsum256's order) gave 0.92-1.01x on prompt chunks and 1.11-1.14x at 6 tiles with the AVX2 routes
 * forced there, and was not kept. */
#define HALF_OVERFLOW 65520.0f /* the least magnitude float16 rounds to infinity */

static int to_half_c(const float *src, int64_t n, uint16_t *dst) {
    int over = 0;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = lk_half_from_float(src[i]);
        over += fabsf(src[i]) >= HALF_OVERFLOW;
    }
    return over;
}

#ifdef LK_X86
/* The instruction's rounding (to nearest, ties to even; subnormals kept, the overflow to infinity) is
 * lk_half_from_float's: tests/test_attention_half.py checks both against torch's on edge values. */
AVX512 static int to_half512(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    int over = 0;
    const __m512 limit = _mm512_set1_ps(HALF_OVERFLOW);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        over += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_abs_ps(x), limit, _CMP_GE_OQ));
    }
    return over + to_half_c(src + i, n - i, dst + i);
}

AVX2 static int to_half256(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    int over = 0;
    const __m256 limit = _mm256_set1_ps(HALF_OVERFLOW), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        over += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, x), limit, _CMP_GE_OQ)));
    }
    return over + to_half_c(src + i, n - i, dst + i);
}
#endif

static const lk_attn_routines routines_c = {dots_c, pv_c, scale_max_c, exp_all_c, NULL, dots_c_h, pv_c_h, NULL,
                                            to_half_c};
#ifdef LK_X86
static const lk_attn_routines routines_avx512 = {dots512, pv512, scale_max512, exp_all512, lk_attn_dots_lanes512,
                                                 dots512_h, pv512_h, lk_attn_dots_lanes512_h, to_half512};
static const lk_attn_routines routines_avx2 = {dots256, pv256, scale_max256, exp_all256, NULL, dots256_h, pv256_h,
                                               NULL, to_half256};
#endif

const lk_attn_routines *lk_attn_pick(int D) {
    const char *name = lk_qmatmul_isa();
#ifdef LK_X86
    if (strcmp(name, "avx512") == 0 && D % 16 == 0) return &routines_avx512;
    if ((strcmp(name, "avx512") == 0 || strcmp(name, "avx2") == 0) && D % 8 == 0 && __builtin_cpu_supports("f16c"))
        return &routines_avx2;
#else
    (void)name;
    (void)D;
#endif
    return &routines_c;
}
