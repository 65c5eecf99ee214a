/* exp(x) in float32 for the native kernels: Cephes' expf polynomial on x - n ln2, scaled by 2^n;
 * exactly 0 below -87.3 (also for -inf and NaN), +inf above 88. The scalar form and the vector
 * forms run the same fused operations in the same order, so every lane and the scalar tail give
 * the same bits for the same x. Used by the attention's softmax (x <= 0), the SiLU of the native
 * layers and the top-k's softmax. */
#ifndef LK_EXP_H
#define LK_EXP_H

#include <math.h>
#include <stdint.h>

#if (defined(__x86_64__) || defined(__i386__)) && !defined(LK_NO_X86)
#define LK_X86 1
#include <immintrin.h>
#endif

#define LK_EXP_LO (-87.3f)
#define LK_EXP_HI 88.0f
#define LK_LOG2E 1.44269504088896341f
#define LK_LN2_HI 0.693359375f
#define LK_LN2_LO (-2.12194440e-4f)
#define LK_P0 1.9875691500e-4f
#define LK_P1 1.3981999507e-3f
#define LK_P2 8.3334519073e-3f
#define LK_P3 4.1665795894e-2f
#define LK_P4 1.6666665459e-1f
#define LK_P5 5.0000001201e-1f

static inline float lk_exp_c(float x) {
    if (!(x >= LK_EXP_LO)) return 0.0f;
    if (x > LK_EXP_HI) return INFINITY;
    float n = nearbyintf(x * LK_LOG2E);
    float r = fmaf(n, -LK_LN2_HI, x);
    r = fmaf(n, -LK_LN2_LO, r);
    float p = fmaf(LK_P0, r, LK_P1);
    p = fmaf(p, r, LK_P2);
    p = fmaf(p, r, LK_P3);
    p = fmaf(p, r, LK_P4);
    p = fmaf(p, r, LK_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    union { float f; int32_t i; } s;
    s.i = ((int32_t)n + 127) << 23;
    return y * s.f;
}

#ifdef LK_X86
__attribute__((target("avx512f,fma"))) static inline __m512 lk_exp512(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(LK_EXP_LO), _CMP_GE_OQ);
    __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(LK_EXP_HI), _CMP_GT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(LK_EXP_HI));
    __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LK_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LK_LN2_HI), x);
    r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LK_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(LK_P0), r, _mm512_set1_ps(LK_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LK_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LK_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LK_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LK_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nn), _mm512_set1_epi32(127)), 23);
    y = _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
    return _mm512_mask_mov_ps(y, big, _mm512_set1_ps(INFINITY));
}

__attribute__((target("avx2,fma"))) static inline __m256 lk_exp256(__m256 x) {
    __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(LK_EXP_LO), _CMP_GE_OQ);
    __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(LK_EXP_HI), _CMP_GT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(LK_EXP_HI));
    __m256 nn = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LK_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LK_LN2_HI), x);
    r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LK_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(LK_P0), r, _mm256_set1_ps(LK_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LK_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LK_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LK_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LK_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    y = _mm256_and_ps(ok, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), big);
}
#endif

#endif
