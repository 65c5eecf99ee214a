/* See layers.h. */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "lk_common.h"
#include "lk_exp.h"
#include "qmatmul.h"
#include "rmsnorm.h"

static void silu_mul_c(const float *g, const float *u, int64_t n, float *a) {
    for (int64_t i = 0; i < n; i++) a[i] = g[i] / (1.0f + lk_exp_c(-g[i])) * u[i];
}

#ifdef LK_X86
#define AVX512 __attribute__((target("avx512f,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

AVX512 static void silu_mul512(const float *g, const float *u, int64_t n, float *a) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 y = lk_exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), y));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    silu_mul_c(g + i, u + i, n - i, a + i);
}

AVX2 static void silu_mul256(const float *g, const float *u, int64_t n, float *a) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 y = lk_exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), y));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    silu_mul_c(g + i, u + i, n - i, a + i);
}
#endif

typedef void (*silu_fn)(const float *, const float *, int64_t, float *);

/* The instruction set the quantized products use (tests can force it): the same set here. */
static silu_fn pick_silu(void) {
#ifdef LK_X86
    const char *name = lk_qmatmul_isa();
    if (strcmp(name, "avx512") == 0) return silu_mul512;
    if (strcmp(name, "avx2") == 0) return silu_mul256;
#endif
    return silu_mul_c;
}

void lk_silu_mul(const float *gu, int64_t R, int64_t inter, float *a) {
    silu_fn f = pick_silu();
    for (int64_t r = 0; r < R; r++) f(gu + r * 2 * inter, gu + r * 2 * inter + inter, inter, a + r * inter);
}

void lk_rotary(const float *x, int64_t R, int64_t heads, int64_t D, const float *cos, const float *sin, float *out) {
    int64_t half = D / 2;
    for (int64_t r = 0; r < R; r++) {
        const float *c = cos + r * D, *s = sin + r * D;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + (r * heads + h) * D;
            float *oh = out + (r * heads + h) * D;
            /* out[d] = x[d] cos[d] + x[(d + D/2) % D] sin[d], in two halves (no division a step). */
            for (int64_t d = 0; d < half; d++) {
                float a = xh[d] * c[d];
                float b = xh[d + half] * s[d];
                oh[d] = a + b;
            }
            for (int64_t d = half; d < D; d++) {
                float a = xh[d] * c[d];
                float b = xh[d - half] * s[d];
                oh[d] = a + b;
            }
        }
    }
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static int product(const lk_qweight *w, const float *in, int64_t R, int64_t k, float *out, int threads) {
    return lk_qmatmul((int)w->fmt, in, R, k, (const uint8_t *)(intptr_t)w->qs, (const float *)(intptr_t)w->dm, w->n,
                      out, threads);
}

int lk_decode_layers(const lk_layer *layers, int n_layers, const lk_shape *sh, float *x, int64_t R,
                     const float *cos, const float *sin, int n_seq, const int64_t *meta, const int64_t *kv,
                     int threads) {
    int64_t hid = sh->hidden, H = sh->heads, Hk = sh->kv_heads, D = sh->head_dim, inter = sh->inter;
    int64_t qkv_n = (H + 2 * Hk) * D, qk_n = (H + Hk) * D, att_n = H * D;
    int64_t widest = hid > att_n ? hid : att_n;
    if (inter > widest) widest = inter;
    /* h: a normed row or an activation; t: a product's output; qkv, qk, att; gu. */
    size_t per_row = (size_t)(2 * widest + qkv_n + qk_n + att_n + 2 * inter);
    float *buf = malloc(sizeof(float) * per_row * (size_t)(R > 0 ? R : 1));
    if (!buf) return LK_ENOMEM;
    float *h = buf, *t = h + R * widest, *qkv = t + R * widest, *qk = qkv + R * qkv_n, *att = qk + R * qk_n;
    float *gu = att + R * att_n;
    silu_fn act = pick_silu();
    int rc = LK_OK;
    for (int li = 0; li < n_layers && rc == LK_OK; li++) {
        const lk_layer *L = &layers[li];
        lk_rms_norm(x, R, hid, (const float *)(intptr_t)L->in_norm, sh->eps, h);
        if ((rc = product(&L->qkv, h, R, hid, qkv, threads)) != LK_OK) break;
        for (int64_t r = 0; r < R; r++)
            lk_rotary(qkv + r * qkv_n, 1, H + Hk, D, cos + r * D, sin + r * D, qk + r * qk_n);
        rc = lk_attend(n_seq, meta, kv, li, qk, qkv + qk_n, qkv_n, (int)H, (int)Hk, (int)D, sh->scale, att, threads);
        if (rc != LK_OK) break;
        if ((rc = product(&L->o, att, R, att_n, t, threads)) != LK_OK) break;
        add_rows(x, t, R * hid);
        lk_rms_norm(x, R, hid, (const float *)(intptr_t)L->post_norm, sh->eps, h);
        if ((rc = product(&L->gate_up, h, R, hid, gu, threads)) != LK_OK) break;
        for (int64_t r = 0; r < R; r++) act(gu + r * 2 * inter, gu + r * 2 * inter + inter, inter, h + r * inter);
        if ((rc = product(&L->down, h, R, inter, t, threads)) != LK_OK) break;
        add_rows(x, t, R * hid);
    }
    free(buf);
    return rc;
}
