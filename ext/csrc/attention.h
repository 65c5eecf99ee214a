/* Decode-time attention of the fast forward: the new rows of several sequences over
 * their own KV caches, one layer, in one call.
 *
 * A verify or decode step adds a few rows per sequence. torch's attention costs ~58
 * microseconds a call here, per sequence and layer, whatever the work (9 heads x 1 row
 * x 300 keys is ~170k multiply-adds); a batch of 4 sequences paid 7 ms of a 20 ms step
 * in those calls. This routine does every sequence of a layer in one call.
 *
 * Each (row, head) is computed alone, in a fixed order: scores key by key (a dot product
 * in one order), their maximum, exp(score - max) by one polynomial (the same operations
 * in every vector lane and in the scalar tail), the denominator summed key by key, and
 * the output accumulated key by key. A masked key (bias of -inf or float32's lowest)
 * adds exactly zero. So a row's output depends only on its query, its unmasked keys in
 * order, and the instruction set: not on the other rows of its step, on other sequences,
 * on the masked keys between, or on the thread count. */
#ifndef LK_ATTENTION_H
#define LK_ATTENTION_H

#include <stdint.h>

/* One sequence of the call (meta row, int64): first row in qk/out, rows w, cached rows past,
 * address of its bias (float32, w x (past + w), row-major; 0 = every row sees every key). */
#define LK_ATTN_META 4
/* Its cache (kv row, int64): address of the whole cache (layers, 2, Hk, cap, D), cap, and its
 * element format (LK_KV_*): head-major, so each kv head's keys and values are read from
 * contiguous rows. */
#define LK_ATTN_KV 3
/* float32 elements; or float16 (IEEE binary16), half the bytes to read: new keys and values are
 * rounded to it (to nearest, ties to even: half.h) as they are written, and every cached element
 * is turned back into its exact float32 value, a block of keys at a time, before the same float32
 * routines run. So a float16 cache gives the bits a float32 cache holding the rounded values
 * gives. */
#define LK_KV_F32 0
#define LK_KV_F16 1

/* For each sequence s: write the keys (qk rows, heads H..H+Hk-1) and values (v rows, stride
 * v_stride floats) of its w rows into cache rows past..past+w-1 of layer `layer`, in the cache's
 * format, then set out rows (R x H*D) to softmax(q k^T * scale + bias) v over cache rows
 * 0..past+w-1, head h using kv head h / (H / Hk). qk: R x (H + Hk) x D, contiguous (rotary
 * already applied). Returns LK_OK, LK_ENOMEM (nothing written to out then), LK_EBADARG (a
 * format that is not LK_KV_*: nothing written at all) or LK_ERANGE (a new key or value of a
 * float16 cache at or beyond 65520 in magnitude, which float16 cannot hold: the rows were written,
 * out was not; the caller must not count them). */
int lk_attend(int n_seq, const int64_t *meta, const int64_t *kv, int layer, const float *qk, const float *v,
              int64_t v_stride, int H, int Hk, int D, float scale, float *out, int threads);

/* Tests and benchmarks: tasks of at least ``tiles`` tiles of queries score their keys with the keys in
 * the vector lanes where the instruction set can (AVX-512; 0 = never, 5 by default); tiles >= 0 sets
 * it. Same bits either way. Returns the value before. */
int lk_attend_block_tiles(int tiles);

#endif
