/* See qmatmul.h (LK_I8). The products with 8-bit activations: GGML's blocks against each input
 * row rounded to 8 bits per block of 32, the block sums taken in integers.
 *
 * Why another layout: the float32 tiles (qmatmul.c) hold k in a vector's lanes, so any integer
 * sum would cover only a few elements before it needs its block's scales. Here the lanes hold 16
 * outputs, and one AVX-512 VNNI instruction adds 4 elements of k for each of them; a block (32
 * elements) is 8 such instructions per (row, 16 outputs), then one conversion, one multiply and
 * one or two fused multiply-adds apply the scales: 12 instructions for 512 multiply-adds, against
 * 32 fused multiply-adds in float32.
 *
 * Packed weights (lk_qpack_i8), per group of 16 outputs g and block b, groups padded with zero
 * outputs to a multiple of 16:
 *   Q4_1: 256 bytes: for s in 0..3, 64 bytes where byte 4 i + t holds output i's element
 *         4 s + t in its low nibble and element 16 + 4 s + t in its high nibble; then 32 floats,
 *         d of the 16 outputs and m of the 16 outputs.
 *   Q8_0: 512 bytes: for s in 0..7, byte 4 i + t is output i's element 4 s + t plus 128 (so it
 *         reads as unsigned); then 16 floats, d of the 16 outputs.
 * The rows (quant_rows): per row and block, a = max |x|, s = a / 127, p = rint(x * (127 / a))
 * (0 where a is 0), and the block's sum of p. Then, block by block in order,
 *   y = fma(float(sum q p), d * s, y), and for Q4_1 y = fma(m, s * sum p, y):
 * one order for every route (the plain C below, AVX-512 VNNI, AVX2 in qmatmul_i8_avx2.c), every
 * tile and every batch: a row's output is independent of the other rows, bit for bit. */
#include "qmatmul_i8.h"

#include <stdlib.h>

#include "lk_common.h"
#include "qpool.h"

int64_t lk_qpack_i8_bytes(int fmt, int64_t n, int64_t k) { return groups(n) * (k / LK_QK) * packed_q_per_block(fmt); }
int64_t lk_qpack_i8_floats(int fmt, int64_t n, int64_t k) { return groups(n) * (k / LK_QK) * packed_d_per_block(fmt); }

void lk_qpack_i8(int fmt, const uint8_t *qs, const float *dm, int64_t n, int64_t k, uint8_t *pq, float *pdm) {
    int64_t nblk = k / LK_QK, qb = packed_q_per_block(fmt), db = packed_d_per_block(fmt);
    for (int64_t g = 0; g < groups(n); g++)
        for (int64_t b = 0; b < nblk; b++) {
            uint8_t *o = pq + (g * nblk + b) * qb;
            float *od = pdm + (g * nblk + b) * db;
            for (int i = 0; i < G; i++) {
                int64_t out = g * G + i;
                uint8_t w[LK_QK];
                if (out >= n) { /* padding: zero weights and scales */
                    for (int e = 0; e < LK_QK; e++) w[e] = fmt == LK_Q4_1 ? 0 : 128;
                    od[i] = 0.0f;
                    if (fmt == LK_Q4_1) od[G + i] = 0.0f;
                } else if (fmt == LK_Q4_1) {
                    const uint8_t *q = qs + (out * nblk + b) * 16;
                    for (int e = 0; e < 16; e++) {
                        w[e] = q[e] & 15;
                        w[e + 16] = q[e] >> 4;
                    }
                    od[i] = dm[(out * nblk + b) * 2];
                    od[G + i] = dm[(out * nblk + b) * 2 + 1];
                } else {
                    const uint8_t *q = qs + (out * nblk + b) * 32;
                    for (int e = 0; e < LK_QK; e++) w[e] = (uint8_t)(q[e] ^ 0x80);
                    od[i] = dm[out * nblk + b];
                }
                if (fmt == LK_Q4_1) {
                    for (int s = 0; s < 4; s++)
                        for (int t = 0; t < 4; t++)
                            o[s * 64 + 4 * i + t] = (uint8_t)(w[4 * s + t] | (w[16 + 4 * s + t] << 4));
                } else {
                    for (int s = 0; s < 8; s++)
                        for (int t = 0; t < 4; t++) o[s * 64 + 4 * i + t] = w[4 * s + t];
                }
            }
        }
}

/* ---- the rows, rounded to 8 bits per block ---- */

void lk_i8_quant_c(const float *x, int64_t rows, int64_t k, qrows *q) {
    int64_t nblk = k / LK_QK;
    int8_t *p = q->p;
    float *s = q->s, *ssum = q->ssum;
    int32_t *psum = q->psum;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nblk; b++) {
            const float *v = x + r * k + b * LK_QK;
            float a = 0.0f;
            for (int e = 0; e < LK_QK; e++) a = fabsf(v[e]) > a ? fabsf(v[e]) : a;
            float inv = a > 0.0f ? 127.0f / a : 0.0f;
            int32_t sum = 0;
            for (int e = 0; e < LK_QK; e++) {
                float f = rintf(v[e] * inv);
                int32_t q = !(f <= 127.0f) ? 127 : f < -127.0f ? -127 : (int32_t)f; /* NaN: 127, as the vector route */
                p[r * k + b * LK_QK + e] = (int8_t)q;
                sum += q;
            }
            s[r * nblk + b] = a / 127.0f;
            ssum[r * nblk + b] = s[r * nblk + b] * (float)sum;
            psum[r * nblk + b] = 128 * sum;
        }
}

/* Rows r0 .. r0 + nr - 1 against group g, plain C. */
static void group_c(const job8 *j, int64_t r0, int64_t nr, int64_t g) {
    int64_t nblk = j->k / LK_QK, qb = packed_q_per_block(j->fmt), db = packed_d_per_block(j->fmt);
    for (int64_t r = r0; r < r0 + nr; r++)
        for (int i = 0; i < G && g * G + i < j->n; i++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nblk; b++) {
                const uint8_t *o = j->pq + (g * nblk + b) * qb;
                const float *od = j->pdm + (g * nblk + b) * db;
                const int8_t *p = j->x.p + r * j->k + b * LK_QK;
                int32_t sum = 0;
                for (int e = 0; e < LK_QK; e++) {
                    int s = (e % 16) / 4, t = e % 4;
                    int w = j->fmt == LK_Q4_1 ? (e < 16 ? o[s * 64 + 4 * i + t] & 15 : o[s * 64 + 4 * i + t] >> 4)
                                              : o[(e / 4) * 64 + 4 * i + t];
                    sum += w * p[e];
                }
                if (j->fmt == LK_Q8_0) sum -= j->x.psum[r * nblk + b];
                acc = fmaf((float)sum, od[i] * j->x.s[r * nblk + b], acc);
                if (j->fmt == LK_Q4_1) acc = fmaf(od[G + i], j->x.ssum[r * nblk + b], acc);
            }
            j->y[r * j->n + g * G + i] = acc;
        }
}

void lk_i8_groups_c(const job8 *j, int64_t r0, int64_t nr, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) group_c(j, r0, nr, g);
}

#ifdef LK_X86

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
#define INLINEVNNI __attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline)) static inline

/* R rows against group g (16 outputs): per block, 8 integer dot products of 4 elements per row, then
 * the scales. FMT a constant: each format's loop compiled on its own. */
INLINEVNNI void tile_vnni(const job8 *j, int FMT, int R, int64_t r0, int64_t g) {
    int64_t nblk = j->k / LK_QK, qb = packed_q_per_block(FMT), db = packed_d_per_block(FMT), k = j->k;
    __m512 accf[8];
    const __m512i low = _mm512_set1_epi8(15);
    for (int r = 0; r < R; r++) accf[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        /* 1-2 rows: two integer sums per row, added at the block's end (exact), so the multiply-adds
         * form two chains instead of one */
        __m512i acci[8], acc2[8];
        const int SPLIT = R <= 2;
        for (int r = 0; r < R; r++) acci[r] = acc2[r] = _mm512_setzero_si512();
        const int8_t *p = j->x.p + r0 * k + b * LK_QK;
        if (FMT == LK_Q4_1) {
            for (int s = 0; s < 4; s++) {
                __m512i v = _mm512_loadu_si512(j->pq + (g * nblk + b) * qb + 64 * s);
                __m512i wl = _mm512_and_si512(v, low), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                for (int r = 0; r < R; r++) {
                    __m512i a = _mm512_set1_epi32(*(const int32_t *)(p + r * k + 4 * s));
                    __m512i h = _mm512_set1_epi32(*(const int32_t *)(p + r * k + 16 + 4 * s));
                    acci[r] = _mm512_dpbusd_epi32(acci[r], wl, a);
                    if (SPLIT) acc2[r] = _mm512_dpbusd_epi32(acc2[r], wh, h);
                    else acci[r] = _mm512_dpbusd_epi32(acci[r], wh, h);
                }
            }
        } else {
            for (int s = 0; s < 8; s++) {
                __m512i w = _mm512_loadu_si512(j->pq + (g * nblk + b) * qb + 64 * s);
                for (int r = 0; r < R; r++) {
                    __m512i a = _mm512_set1_epi32(*(const int32_t *)(p + r * k + 4 * s));
                    if (SPLIT && (s & 1)) acc2[r] = _mm512_dpbusd_epi32(acc2[r], w, a);
                    else acci[r] = _mm512_dpbusd_epi32(acci[r], w, a);
                }
            }
        }
        const float *od = j->pdm + (g * nblk + b) * db;
        __m512 d = _mm512_loadu_ps(od);
        for (int r = 0; r < R; r++) {
            int64_t i = (r0 + r) * nblk + b;
            __m512i sum = SPLIT ? _mm512_add_epi32(acci[r], acc2[r]) : acci[r];
            if (FMT == LK_Q8_0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(j->x.psum[i]));
            __m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(j->x.s[i]));
            accf[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ds, accf[r]);
            if (FMT == LK_Q4_1) accf[r] = _mm512_fmadd_ps(_mm512_loadu_ps(od + G), _mm512_set1_ps(j->x.ssum[i]), accf[r]);
        }
    }
    int64_t out = g * G;
    __mmask16 m = out + G <= j->n ? 0xffff : (__mmask16)((1u << (j->n - out)) - 1);
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(j->y + (r0 + r) * j->n + out, m, accf[r]);
}

/* Tiles of 8, 4, 2 and 1 rows against one group: a group's weights are one contiguous stream (wider
 * tiles, over 3-4 groups at once, were slower: the layer products of the embedded model, single
 * thread, 2-core AMD EPYC with AVX-512: 1 row 3.7 ms against 4.7 over 4 groups, 2 rows 4.0 against
 * 5.2, 4 rows 5.3-5.5 against 6.6 over 3 groups). */
#define TILE_FN(FMT, R)                                                      \
    VNNI static void t_##FMT##_##R(const job8 *j, int64_t r0, int64_t g) {   \
        tile_vnni(j, FMT, R, r0, g);                                         \
    }
TILE_FN(0, 8) TILE_FN(0, 4) TILE_FN(0, 2) TILE_FN(0, 1) TILE_FN(1, 8) TILE_FN(1, 4) TILE_FN(1, 2) TILE_FN(1, 1)

typedef void (*tile8_fn)(const job8 *, int64_t, int64_t);
static const struct {
    int rows;
    tile8_fn f[2]; /* [fmt] */
} tiles8[] = {{8, {t_0_8, t_1_8}}, {4, {t_0_4, t_1_4}}, {2, {t_0_2, t_1_2}}, {1, {t_0_1, t_1_1}}};

/* Groups g0 .. g1 - 1 outer, the rows r0 .. r0 + nr - 1 inner: a group's weights stay in L1 while
 * every row tile reads them. */
VNNI static void groups_vnni(const job8 *j, int64_t r0, int64_t nr, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) {
        int64_t r = r0;
        for (int t = 0; t < 4; t++)
            for (; r + tiles8[t].rows <= r0 + nr; r += tiles8[t].rows) tiles8[t].f[j->fmt](j, r, g);
    }
}

VNNI static void quant_rows_vnni(const float *x, int64_t rows, int64_t k, qrows *q) {
    int64_t nblk = k / LK_QK;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nblk; b++) {
            const float *v = x + r * k + b * LK_QK;
            __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
            float a = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            float inv = a > 0.0f ? 127.0f / a : 0.0f;
            __m512 vi = _mm512_set1_ps(inv), lim = _mm512_set1_ps(127.0f);
            /* rint, then clamped as the C route does (min / max of integral values) */
            __m512 fl = _mm512_roundscale_ps(_mm512_mul_ps(lo, vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512 fh = _mm512_roundscale_ps(_mm512_mul_ps(hi, vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            fl = _mm512_max_ps(_mm512_min_ps(fl, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
            fh = _mm512_max_ps(_mm512_min_ps(fh, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
            __m512i il = _mm512_cvttps_epi32(fl), ih = _mm512_cvttps_epi32(fh);
            _mm_storeu_si128((__m128i *)(q->p + r * k + b * LK_QK), _mm512_cvtepi32_epi8(il));
            _mm_storeu_si128((__m128i *)(q->p + r * k + b * LK_QK + 16), _mm512_cvtepi32_epi8(ih));
            int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(il, ih));
            q->s[r * nblk + b] = a / 127.0f;
            q->ssum[r * nblk + b] = q->s[r * nblk + b] * (float)sum;
            q->psum[r * nblk + b] = 128 * sum;
        }
}

static int has_vnni(void) { /* asked once: every product's dispatch reads it */
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
    }
    return known;
}
#else
static int has_vnni(void) { return 0; }
#define groups_vnni lk_i8_groups_c
#define quant_rows_vnni lk_i8_quant_c
#define lk_i8_groups_avx2 lk_i8_groups_c
#define lk_i8_quant_avx2 lk_i8_quant_c
#endif

int lk_qmatmul_i8_native(void) { return has_vnni() || lk_i8_has_avx2(); }

/* The route of a product under `route` (2: AVX-512 picked, 1: AVX2, 0: plain C): VNNI needs AVX-512 VNNI,
 * else AVX2 takes it where the CPU has AVX2. */
static int i8_route(int route) {
    if (route == 2 && has_vnni()) return 2;
    return route >= 1 && lk_i8_has_avx2() ? 1 : 0;
}

const char *lk_qmatmul_i8_isa(int route) {
    static const char *names[] = {"c", "avx2", "avx512vnni"};
    return names[i8_route(route)];
}

/* Rows per pass over a part's groups (as qmatmul.c's ROW_CHUNK): their 8-bit rows stay in L1 / L2. */
#define ROW_CHUNK8 64

typedef struct {
    const job8 *j;
    lk_i8_groups_fn groups;
} part8;

static void run_part8(void *ctx, int part, int parts) {
    const part8 *pc = ctx;
    const job8 *j = pc->j;
    int64_t ng = groups(j->n), g0 = ng * part / parts, g1 = ng * (part + 1) / parts;
    for (int64_t r0 = 0; r0 < j->rows; r0 += ROW_CHUNK8)
        pc->groups(j, r0, j->rows - r0 < ROW_CHUNK8 ? j->rows - r0 : ROW_CHUNK8, g0, g1);
}

/* 8-bit rows up to this many elements live on the stack (a decode step's: no allocation a product). */
#define SMALL_ROWS_I8 8192

int lk_qmatmul_i8(int fmt, int route, const float *x, int64_t rows, int64_t k, const uint8_t *pq, const float *pdm,
                  int64_t n, float *y, int threads) {
    if (rows <= 0 || n <= 0) return LK_OK;
    int64_t nblk = k / LK_QK;
    int8_t small_p[SMALL_ROWS_I8];
    float small_f[2 * SMALL_ROWS_I8 / LK_QK];
    int32_t small_i[SMALL_ROWS_I8 / LK_QK];
    qrows q;
    void *heap = NULL;
    if (rows * k <= SMALL_ROWS_I8) {
        q = (qrows){small_p, small_f, small_f + rows * nblk, small_i};
    } else {
        heap = malloc((size_t)(rows * k + 3 * rows * nblk * 4));
        if (!heap) return LK_ENOMEM;
        float *f = (float *)heap;
        q = (qrows){(int8_t *)(f + 3 * rows * nblk), f, f + rows * nblk, (int32_t *)(f + 2 * rows * nblk)};
    }
    route = i8_route(route);
    (route == 2 ? quant_rows_vnni : route == 1 ? lk_i8_quant_avx2 : lk_i8_quant_c)(x, rows, k, &q);
    job8 j = {fmt, q, rows, k, n, pq, pdm, y};
    part8 pc = {&j, route == 2 ? groups_vnni : route == 1 ? lk_i8_groups_avx2 : lk_i8_groups_c};
    int64_t ng = groups(n);
    int parts = threads < 1 ? 1 : threads;
    if (parts > ng) parts = (int)ng;
    lk_pool_run(run_part8, &pc, parts);
    free(heap);
    return LK_OK;
}
