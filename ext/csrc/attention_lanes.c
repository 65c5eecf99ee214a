/* The keys-in-lanes scoring of the AVX-512 routines (dots_block, attention_isa.h): a block of up to
 * KB_MAX keys transposed once, so that many queries score 16 keys a vector, with the 4 x 4 tiles'
 * sums bit for bit. */
#include "attention_simd.h"

#ifdef LK_X86
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

/* The keys-in-lanes scoring (lk_attn_dots_lanes512): scores of BQ queries over the 16 keys of columns
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

AVX512 void lk_attn_dots_lanes512(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk,
                                  int D, float *const *out, float *kt) {
    dots512_block_t(q, nq, keys, stride, nk, D, out, kt, 0);
}
AVX512 void lk_attn_dots_lanes512_h(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk,
                                    int D, float *const *out, float *kt) {
    dots512_block_t(q, nq, keys, stride, nk, D, out, kt, 1);
}
#endif
