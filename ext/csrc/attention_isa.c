/* See attention_isa.h. */
#include "attention_isa.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86)
#define LK_X86 1
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

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
#define AVX512 __attribute__((target("avx512f,fma")))
#define AVX2 __attribute__((target("avx2,fma,f16c"))) /* F16C: a float16 cache's elements */
#define INLINE512 AVX512 static inline __attribute__((always_inline))
#define INLINE256 AVX2 static inline __attribute__((always_inline))

/* 16 (8) elements of a cache row from element d: float32, or float16 turned into float32 (exact). */
INLINE512 __m512 load512(const void *row, int64_t d, const int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d)))
                : _mm512_loadu_ps((const float *)row + d);
}
INLINE256 __m256 load256(const void *row, int64_t d, const int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)))
                : _mm256_loadu_ps((const float *)row + d);
}
/* The address of element d of a cache row. */
static inline const void *at(const void *row, int64_t d, const int half) {
    return half ? (const void *)((const uint16_t *)row + d) : (const void *)((const float *)row + d);
}

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

/* 16 rows of 16 floats transposed in registers: r[j] becomes column j. */
AVX512 static void transpose16(__m512 r[16]) {
    __m512 t[16], s[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* s[4g + e], 128-bit lane L: column 4L + e of rows 4g..4g+3 */
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        s[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        s[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        s[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        s[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int e = 0; e < 4; e++) { /* column 4L + e: lane L of s[e], s[4 + e], s[8 + e], s[12 + e] */
        __m512 p = _mm512_shuffle_f32x4(s[e], s[4 + e], 0x44), q = _mm512_shuffle_f32x4(s[e], s[4 + e], 0xEE);
        __m512 u = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0x44), w = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0xEE);
        r[e] = _mm512_shuffle_f32x4(p, u, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(p, u, 0xDD);
        r[8 + e] = _mm512_shuffle_f32x4(q, w, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(q, w, 0xDD);
    }
}

#define BQ 4 /* queries per dots16_keys call */

/* The keys-in-lanes scoring (dots512_block): scores of BQ queries over the 16 keys of columns
 * kt[.. + c]. For each query, lane l's partial sum of dots512 (the products of d = l, l + 16, .. by
 * one chain of fused multiply-adds from 0) is its own register P_l, and the partials are added as
 * dots512's network adds its lanes: l + 8, then l + 4, l + 2, l + 1. So each score has dots512's bits. */

/* S_l = P_l + P_{l+8} for BQ queries (M = D / 16 products in each chain). */
INLINE512 void pair16_keys(const float *const q[BQ], const float *kt, int l, int M, __m512 s[BQ]) {
    __m512 p[BQ][2];
#pragma GCC unroll 8
    for (int i = 0; i < BQ; i++) p[i][0] = p[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < M; m++)
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            int d = l + 8 * e + 16 * m;
            __m512 kv = _mm512_loadu_ps(kt + (int64_t)d * KB_MAX);
#pragma GCC unroll 8
            for (int i = 0; i < BQ; i++) p[i][e] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), kv, p[i][e]);
        }
#pragma GCC unroll 8
    for (int i = 0; i < BQ; i++) s[i] = _mm512_add_ps(p[i][0], p[i][1]);
}

/* T_l = S_l + S_{l+4} for BQ queries, added into t (t = T_l) or onto it (t += T_l). */
INLINE512 void quad16_keys(const float *const q[BQ], const float *kt, int l, int M, __m512 t[BQ], int add) {
    __m512 a[BQ], b[BQ];
    pair16_keys(q, kt, l, M, a);
    pair16_keys(q, kt, l + 4, M, b);
#pragma GCC unroll 8
    for (int i = 0; i < BQ; i++) {
        __m512 x = _mm512_add_ps(a[i], b[i]);
        t[i] = add ? _mm512_add_ps(t[i], x) : x;
    }
}

/* R = U_0 + U_1, U_h = T_h + T_{h+2}: the network's last two levels. */
INLINE512 void dots16_keys(const float *const q[BQ], const float *kt, int M, __m512 r[BQ]) {
    __m512 u[BQ];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512 t[BQ];
        quad16_keys(q, kt, h, M, t, 0);
        quad16_keys(q, kt, h + 2, M, t, 1);
#pragma GCC unroll 8
        for (int i = 0; i < BQ; i++) u[i] = h ? _mm512_add_ps(u[i], t[i]) : t[i];
    }
#pragma GCC unroll 8
    for (int i = 0; i < BQ; i++) r[i] = u[i];
}

INLINE512 void dots512_block_t(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                                float *const *out, float *kt, const int half) {
    for (int64_t c0 = 0; c0 < nk; c0 += 16)
        for (int d0 = 0; d0 < D; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = c0 + i < nk ? load512(keys, (c0 + i) * stride + d0, half) : _mm512_setzero_ps();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(kt + (int64_t)(d0 + j) * KB_MAX + c0, r[j]);
        }
    for (int i0 = 0; i0 < nq; i0 += BQ) {
        const float *qs[BQ];
        for (int i = 0; i < BQ; i++) qs[i] = q[i0 + i < nq ? i0 + i : i0]; /* padding: computed, dropped */
        for (int64_t c0 = 0; c0 < nk; c0 += 16) {
            __m512 r[BQ];
            if (D == 64) /* the common head size, its loops unrolled */
                dots16_keys(qs, kt + c0, 4, r);
            else
                dots16_keys(qs, kt + c0, D / 16, r);
            __mmask16 keep = nk - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nk - c0)) - 1);
            for (int i = 0; i < BQ && i0 + i < nq; i++) _mm512_mask_storeu_ps(out[i0 + i] + c0, keep, r[i]);
        }
    }
}

AVX512 static void dots512_block(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                                 float *const *out, float *kt) {
    dots512_block_t(q, nq, keys, stride, nk, D, out, kt, 0);
}
AVX512 static void dots512_block_h(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                                   float *const *out, float *kt) {
    dots512_block_t(q, nq, keys, stride, nk, D, out, kt, 1);
}

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
static const lk_attn_routines routines_avx512 = {dots512, pv512, scale_max512, exp_all512, dots512_block,
                                                 dots512_h, pv512_h, dots512_block_h, to_half512};
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
