/* The inner routines of the decode attention (attention.c), one set per instruction set.
 *
 * A tile is up to TQ queries (rows x heads of one kv head) over the same keys. Every (query, key)
 * dot product and every output element is computed by one routine per instruction set, in one
 * order, whatever the tile's other members or the key's place: padding keys (and the keys-in-lanes
 * blocks' padding queries) are computed and dropped, a short tile's missing queries not computed at
 * all. Each set computes the same sums on every call, so a row's bits depend only on its
 * query, its unmasked keys in order, and the set. */
#ifndef LK_ATTENTION_ISA_H
#define LK_ATTENTION_ISA_H

#include <stdint.h>

#define TQ 4 /* queries per tile */
#define TK 4 /* keys per score tile (the AVX-512 sums take TQ x TK = 16) */

typedef struct {
    /* out[i * TK + c] = q[i] . k[c] over D elements (float32 keys), for the tile's nq <= TQ real queries
     * (the rest of out is left as it was) */
    void (*dots)(const float *const q[TQ], int nq, const void *const k[TK], int D, float out[TQ * TK]);
    /* o[i] += sum over keys j < n of p[i][j] * vals[j * stride ..] (keys of weight 0 skipped), and
     * l[i] += p[i][j] key by key in order: the softmax's denominators, summed as the outputs are
     * (float32 values; stride in elements), for i < nq */
    void (*pv)(const float *const p[TQ], int nq, const void *vals, int64_t n, int64_t stride, int D,
               float *const o[TQ], float l[TQ]);
    /* s = s * scale + bias (bias may be NULL); returns the maximum */
    float (*scale_max)(float *s, const float *bias, int64_t n, float scale);
    /* s = exp(s - m), exactly 0 below -87.3 */
    void (*exp_all)(float *s, int64_t n, float m);
    /* Optional (NULL where a set has none): out[i][c] = q[i] . (key c) for nq queries and the
     * nk <= KB_MAX keys at keys, keys + stride, ..: the same sums as dots, bit for bit, with the keys
     * in the vector lanes (transposed once into kt, KB_MAX x D floats, for all nq queries). */
    void (*dots_block)(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                       float *const *out, float *kt);
    /* dots, pv and dots_block (NULL where dots_block is) over a float16 cache's keys and values: each
     * element turned into its float32 value as it is loaded (exact; half.h), then the very
     * operations of the float32 routine */
    void (*dots_half)(const float *const q[TQ], int nq, const void *const k[TK], int D, float out[TQ * TK]);
    void (*pv_half)(const float *const p[TQ], int nq, const void *vals, int64_t n, int64_t stride, int D,
                    float *const o[TQ], float l[TQ]);
    void (*dots_block_half)(const float *const *q, int nq, const void *keys, int64_t stride, int64_t nk, int D,
                            float *const *out, float *kt);
    /* dst[i] = src[i] rounded to float16 as half.h's lk_half_from_float rounds it, i < n (a new row of
     * keys or values written to a float16 cache); returns how many had |src[i]| >= 65520, which
     * float16 cannot hold (they become infinite) */
    int (*to_half)(const float *src, int64_t n, uint16_t *dst);
} lk_attn_routines;

#define KB_MAX 64 /* keys per dots_block call */

/* The routines for head size D under the instruction set the quantized products use
 * (lk_qmatmul_isa, which tests can force): AVX-512 where D is a multiple of 16, AVX2 (with F16C,
 * which every AVX2 CPU has) where it is a multiple of 8, plain C otherwise. */
const lk_attn_routines *lk_attn_pick(int D);

#endif
