/* See attention_isa.h. */
#include "attention_isa.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86)
#define LK_X86 1
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

#include "lk_exp.h"
#include "qmatmul.h"

/* exp of the scores minus their maximum (x <= 0): lk_exp.h's polynomial, exactly 0 below -87.3 (a
 * masked key); its scalar and vector forms give the same bits. */
static inline float exp_c(float x) { return lk_exp_c(x); }

static void dots_c(const float *const q[TQ], const float *const k[TK], int D, float out[TK * TQ]) {
    for (int c = 0; c < TK; c++)
        for (int i = 0; i < TQ; i++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc = fmaf(q[i][d], k[c][d], acc);
            out[i * TK + c] = acc;
        }
}

static void pv_c(const float *const p[TQ], const float *vals, int64_t n, int64_t stride, int D,
                 float *const o[TQ]) {
    for (int64_t j = 0; j < n; j++)
        for (int i = 0; i < TQ; i++) {
            float pj = p[i][j];
            if (pj == 0.0f) continue; /* adds exactly nothing: a masked key leaves no trace */
            for (int d = 0; d < D; d++) o[i][d] = fmaf(pj, vals[j * stride + d], o[i][d]);
        }
}

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
#define AVX2 __attribute__((target("avx2,fma")))

AVX512 static void dots512(const float *const q[TQ], const float *const k[TK], int D, float out[TK * TQ]) {
    __m512 acc[TK][TQ];
    for (int c = 0; c < TK; c++)
        for (int i = 0; i < TQ; i++) acc[c][i] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 qv[TQ];
        for (int i = 0; i < TQ; i++) qv[i] = _mm512_loadu_ps(q[i] + d);
        for (int c = 0; c < TK; c++) {
            __m512 kv = _mm512_loadu_ps(k[c] + d);
            for (int i = 0; i < TQ; i++) acc[c][i] = _mm512_fmadd_ps(qv[i], kv, acc[c][i]);
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

/* Output chunks of 64 floats: 4 registers for each of the TQ queries (padding ones included, so the
 * loops are fixed and the accumulators stay in registers). */
AVX512 static void pv512(const float *const p[TQ], const float *vals, int64_t n, int64_t stride, int D,
                         float *const o[TQ]) {
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m512 acc[TQ][4];
        for (int i = 0; i < TQ; i++)
            for (int e = 0; e < 4; e++) acc[i][e] = _mm512_loadu_ps(o[i] + d0 + 16 * e);
        for (int64_t j = 0; j < n; j++) {
            const float *v = vals + j * stride + d0;
            for (int e = 0; e < 4; e++) _mm_prefetch((const char *)(v + PV_AHEAD * stride + 16 * e), _MM_HINT_T0);
            __m512 vv[4];
            for (int e = 0; e < 4; e++) vv[e] = _mm512_loadu_ps(v + 16 * e);
            for (int i = 0; i < TQ; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue; /* adds exactly nothing: a masked key leaves no trace */
                __m512 pb = _mm512_set1_ps(pj);
                for (int e = 0; e < 4; e++) acc[i][e] = _mm512_fmadd_ps(pb, vv[e], acc[i][e]);
            }
        }
        for (int i = 0; i < TQ; i++)
            for (int e = 0; e < 4; e++) _mm512_storeu_ps(o[i] + d0 + 16 * e, acc[i][e]);
    }
    for (; d0 < D; d0 += 16) {
        __m512 acc[TQ];
        for (int i = 0; i < TQ; i++) acc[i] = _mm512_loadu_ps(o[i] + d0);
        for (int64_t j = 0; j < n; j++) {
            __m512 vv = _mm512_loadu_ps(vals + j * stride + d0);
            for (int i = 0; i < TQ; i++) {
                float pj = p[i][j];
                if (pj != 0.0f) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(pj), vv, acc[i]);
            }
        }
        for (int i = 0; i < TQ; i++) _mm512_storeu_ps(o[i] + d0, acc[i]);
    }
}

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

AVX2 static void dots256(const float *const q[TQ], const float *const k[TK], int D, float out[TK * TQ]) {
    for (int c = 0; c < TK; c++) {
        __m256 acc[TQ];
        for (int i = 0; i < TQ; i++) acc[i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 kv = _mm256_loadu_ps(k[c] + d);
            for (int i = 0; i < TQ; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q[i] + d), kv, acc[i]);
        }
        for (int i = 0; i < TQ; i++) out[i * TK + c] = hsum256(acc[i]);
    }
}

/* Output chunks of 32 floats: 4 registers for each of the TQ queries, as pv512. */
AVX2 static void pv256(const float *const p[TQ], const float *vals, int64_t n, int64_t stride, int D,
                       float *const o[TQ]) {
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        __m256 acc[TQ][4];
        for (int i = 0; i < TQ; i++)
            for (int e = 0; e < 4; e++) acc[i][e] = _mm256_loadu_ps(o[i] + d0 + 8 * e);
        for (int64_t j = 0; j < n; j++) {
            const float *v = vals + j * stride + d0;
            __m256 vv[4];
            for (int e = 0; e < 4; e++) vv[e] = _mm256_loadu_ps(v + 8 * e);
            for (int i = 0; i < TQ; i++) {
                float pj = p[i][j];
                if (pj == 0.0f) continue;
                __m256 pb = _mm256_set1_ps(pj);
                for (int e = 0; e < 4; e++) acc[i][e] = _mm256_fmadd_ps(pb, vv[e], acc[i][e]);
            }
        }
        for (int i = 0; i < TQ; i++)
            for (int e = 0; e < 4; e++) _mm256_storeu_ps(o[i] + d0 + 8 * e, acc[i][e]);
    }
    for (; d0 < D; d0 += 8) {
        __m256 acc[TQ];
        for (int i = 0; i < TQ; i++) acc[i] = _mm256_loadu_ps(o[i] + d0);
        for (int64_t j = 0; j < n; j++) {
            __m256 vv = _mm256_loadu_ps(vals + j * stride + d0);
            for (int i = 0; i < TQ; i++) {
                float pj = p[i][j];
                if (pj != 0.0f) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(pj), vv, acc[i]);
            }
        }
        for (int i = 0; i < TQ; i++) _mm256_storeu_ps(o[i] + d0, acc[i]);
    }
}

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

static const lk_attn_routines routines_c = {dots_c, pv_c, scale_max_c, exp_all_c};
#ifdef LK_X86
static const lk_attn_routines routines_avx512 = {dots512, pv512, scale_max512, exp_all512};
static const lk_attn_routines routines_avx2 = {dots256, pv256, scale_max256, exp_all256};
#endif

const lk_attn_routines *lk_attn_pick(int D) {
    const char *name = lk_qmatmul_isa();
#ifdef LK_X86
    if (strcmp(name, "avx512") == 0 && D % 16 == 0) return &routines_avx512;
    if ((strcmp(name, "avx512") == 0 || strcmp(name, "avx2") == 0) && D % 8 == 0) return &routines_avx2;
#else
    (void)name;
    (void)D;
#endif
    return &routines_c;
}
