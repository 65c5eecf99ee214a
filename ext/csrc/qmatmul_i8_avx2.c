/* The 8-bit products with AVX2 (see qmatmul.h, LK_I8, and qmatmul_i8.c for the layout). AVX2 has no
 * VNNI: vpmaddubsw multiplies unsigned by signed bytes and adds pairs into 16 bits, vpmaddwd adds
 * those pairs into 32. A block's sums are the VNNI route's integers exactly, so the scales, applied
 * in the same order, give the same bits.
 *   Q4_1: the nibbles (0..15) against the rows' bytes (-127..127): a pair is at most 3,810, so a
 *         block's 8 pair sums add up in 16 bits (at most 30,480) before one vpmaddwd.
 *   Q8_0: the packed bytes are q + 128; back to q (-127..127), |q| against the row's bytes with q's
 *         sign (vpsignb): a pair is at most 2 x 128 x 127 = 32,512, then vpmaddwd at every step. */
#include "qmatmul_i8.h"

#ifdef LK_X86
#define AVX2I8 __attribute__((target("avx2,fma")))
#define INLINEAVX2I8 __attribute__((target("avx2,fma"), always_inline)) static inline

/* R rows x halves h0 .. h0 + H - 1 (8 outputs each) of group g. */
INLINEAVX2I8 void tile_avx2(const job8 *j, int FMT, int R, int h0, int H, int64_t r0, int64_t g) {
    int64_t nblk = j->k / LK_QK, qb = packed_q_per_block(FMT), db = packed_d_per_block(FMT), k = j->k;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 accf[4][2];
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) accf[r][h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t *o = j->pq + (g * nblk + b) * qb;
        const int8_t *p = j->x.p + r0 * k + b * LK_QK;
        __m256i isum[4][2];
        for (int r = 0; r < R; r++)
            for (int h = 0; h < H; h++) isum[r][h] = _mm256_setzero_si256();
        if (FMT == LK_Q4_1) {
            for (int s = 0; s < 4; s++) {
                __m256i wl[2], wh[2];
                for (int h = 0; h < H; h++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(o + 64 * s + 32 * (h0 + h)));
                    wl[h] = _mm256_and_si256(v, low);
                    wh[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                }
                for (int r = 0; r < R; r++) {
                    __m256i a = _mm256_set1_epi32(*(const int32_t *)(p + r * k + 4 * s));
                    __m256i ah = _mm256_set1_epi32(*(const int32_t *)(p + r * k + 16 + 4 * s));
                    for (int h = 0; h < H; h++) /* 16-bit sums: at most 8 x 3,810 */
                        isum[r][h] = _mm256_add_epi16(
                            isum[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(wl[h], a), _mm256_maddubs_epi16(wh[h], ah)));
                }
            }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < H; h++) isum[r][h] = _mm256_madd_epi16(isum[r][h], ones);
        } else {
            for (int s = 0; s < 8; s++) {
                __m256i w[2], aw[2];
                for (int h = 0; h < H; h++) {
                    w[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(o + 64 * s + 32 * (h0 + h))), flip);
                    aw[h] = _mm256_abs_epi8(w[h]);
                }
                for (int r = 0; r < R; r++) {
                    __m256i a = _mm256_set1_epi32(*(const int32_t *)(p + r * k + 4 * s));
                    for (int h = 0; h < H; h++)
                        isum[r][h] = _mm256_add_epi32(
                            isum[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(a, w[h])), ones));
                }
            }
        }
        const float *od = j->pdm + (g * nblk + b) * db;
        for (int h = 0; h < H; h++) {
            __m256 d = _mm256_loadu_ps(od + 8 * (h0 + h));
            for (int r = 0; r < R; r++) {
                int64_t i = (r0 + r) * nblk + b;
                __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(j->x.s[i]));
                accf[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), ds, accf[r][h]);
                if (FMT == LK_Q4_1)
                    accf[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(od + G + 8 * (h0 + h)), _mm256_set1_ps(j->x.ssum[i]),
                                                 accf[r][h]);
            }
        }
    }
    for (int h = 0; h < H; h++) {
        int64_t out = g * G + 8 * (h0 + h), left = j->n - out;
        if (left <= 0) continue;
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left > 8 ? 8 : (int)left),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r = 0; r < R; r++) _mm256_maskstore_ps(j->y + (r0 + r) * j->n + out, mask, accf[r][h]);
    }
}

/* 4-row tiles a half group at a time (their accumulators fill the 16 registers), then 2 and 1 rows
 * over the whole group. */
#define T(FMT, R, H0, H)                                                            \
    AVX2I8 static void t##FMT##_##R##_##H0##_##H(const job8 *j, int64_t r0, int64_t g) { \
        tile_avx2(j, FMT, R, H0, H, r0, g);                                         \
    }
T(0, 4, 0, 1) T(0, 4, 1, 1) T(0, 2, 0, 2) T(0, 1, 0, 2) T(1, 4, 0, 1) T(1, 4, 1, 1) T(1, 2, 0, 2) T(1, 1, 0, 2)

AVX2I8 void lk_i8_groups_avx2(const job8 *j, int64_t r0, int64_t nr, int64_t g0, int64_t g1) {
    int q41 = j->fmt == LK_Q4_1;
    for (int64_t g = g0; g < g1; g++) {
        int64_t r = r0, end = r0 + nr;
        for (; r + 4 <= end; r += 4) {
            (q41 ? t0_4_0_1 : t1_4_0_1)(j, r, g);
            (q41 ? t0_4_1_1 : t1_4_1_1)(j, r, g);
        }
        for (; r + 2 <= end; r += 2) (q41 ? t0_2_0_2 : t1_2_0_2)(j, r, g);
        for (; r < end; r++) (q41 ? t0_1_0_2 : t1_1_0_2)(j, r, g);
    }
}

AVX2I8 static float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

AVX2I8 void lk_i8_quant_avx2(const float *x, int64_t rows, int64_t k, qrows *q) {
    int64_t nblk = k / LK_QK;
    const __m256 sign = _mm256_set1_ps(-0.0f), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nblk; b++) {
            const float *v = x + r * k + b * LK_QK;
            __m256 f[4];
            __m256 m = _mm256_setzero_ps();
            for (int e = 0; e < 4; e++) {
                f[e] = _mm256_loadu_ps(v + 8 * e);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, f[e]));
            }
            float a = hmax256(m);
            __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
            __m256i iv[4];
            for (int e = 0; e < 4; e++) {
                __m256 t = _mm256_round_ps(_mm256_mul_ps(f[e], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                iv[e] = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(t, lim), nlim));
            }
            __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
            _mm256_storeu_si256((__m256i *)(q->p + r * k + b * LK_QK), _mm256_permutevar8x32_epi32(packed, order));
            __m256i t = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
            int32_t sum = _mm_cvtsi128_si32(t4);
            q->s[r * nblk + b] = a / 127.0f;
            q->ssum[r * nblk + b] = q->s[r * nblk + b] * (float)sum;
            q->psum[r * nblk + b] = 128 * sum;
        }
}

int lk_i8_has_avx2(void) { /* asked once: every product's dispatch reads it */
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}
#else
int lk_i8_has_avx2(void) { return 0; }
#endif
