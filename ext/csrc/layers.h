/* The decoder layers of a decode or verify step in one native call (the fast forward's
 * quantized format).
 *
 * A one-row step of the embedded model runs 30 layers of about twenty small operations each
 * (norms, four products, rotary, attention, the gated MLP, two residual adds). Driven from
 * Python, each operation costs a few microseconds of dispatch whatever its work; this routine
 * runs the same operations from C, calling the same native products (qmatmul.h), norm
 * (rmsnorm.h) and attention (attention.h), with rotary and the gated activation in C.
 *
 * Every operation is row-wise in one fixed order: a row's output depends only on its own input
 * row, its sequence's cache and the instruction set, never on the other rows of the step, other
 * sequences or the thread count (the property the products and the attention already have).
 *
 *   rotary:  out[h, d] = x[h, d] * cos[d] + x[h, (d + D/2) % D] * sin_signed[d]
 *            (each a float32 product, then one float32 add: no fused multiply-add);
 *   act:     a[i] = silu(g[i]) * u[i],  silu(g) = g / (1 + e(-g)), where e is the Cephes
 *            polynomial exp of lk_exp.h (exactly 0 below -87.3, +inf above 88: silu(g) is -0
 *            for g < -88, where the true value is within 1e-36 of it);
 *            every vector lane and the scalar tail run the same fused operations. */
#ifndef LK_LAYERS_H
#define LK_LAYERS_H

#include <stdint.h>

/* One product's weights: format (LK_Q4_1 / LK_Q8_0), blocks and scales as qmatmul.h lays them
 * out, output size n (input size is implied by the layer). */
typedef struct {
    int64_t fmt, qs, dm, n;
} lk_qweight;

/* One decoder layer (addresses as int64, so Python builds the table as an int64 tensor). */
typedef struct {
    int64_t in_norm, post_norm; /* float32 (hidden,) */
    lk_qweight qkv;             /* (H + 2 Hk) D outputs from hidden */
    lk_qweight o;               /* hidden outputs from H D */
    lk_qweight gate_up;         /* 2 inter outputs (gate first) from hidden */
    lk_qweight down;            /* hidden outputs from inter */
} lk_layer;

#define LK_LAYER_INT64S 18 /* int64s per lk_layer */

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    float eps, scale;
} lk_shape;

/* Runs n_layers layers on the R residual rows x (R x hidden, updated in place): per layer
 *   x += o(attend(rotary(qkv(rms(x, in_norm)))));  x += down(act(gate_up(rms(x, post_norm))))
 * cos, sin: R x D rotary tables of the rows' positions (sin with its first half negated);
 * n_seq, meta, kv: the sequences of the rows, as lk_attend takes them (their keys and values
 * are written into their caches). Returns LK_OK, or LK_ENOMEM or lk_attend's LK_ERANGE (x is then
 * undefined). */
int lk_decode_layers(const lk_layer *layers, int n_layers, const lk_shape *shape, float *x, int64_t R,
                     const float *cos, const float *sin, int n_seq, const int64_t *meta, const int64_t *kv,
                     int threads);

/* The two element-wise routines alone, for tests: rotary over R rows of `heads` heads
 * (x: R x heads x D, out may not alias x), and the gated activation over R rows of gu
 * (R x 2 inter: gate, then up) into a (R x inter). */
void lk_rotary(const float *x, int64_t R, int64_t heads, int64_t D, const float *cos, const float *sin, float *out);
void lk_silu_mul(const float *gu, int64_t R, int64_t inter, float *a);

#endif
