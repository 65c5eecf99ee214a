/* See attention.h. The tiling, the tasks and the threads; the inner routines, one set per
 * instruction set, are in attention_isa.c (the AVX-512 keys-in-lanes scoring in attention_lanes.c). */
#include "attention.h"

#include <stdlib.h>
#include <string.h>

#include "attention_isa.h"
#include "lk_common.h"
#include "qpool.h"

typedef struct {
    int n_seq, layer, H, Hk, D;
    const int64_t *meta, *kv;
    const float *qk;
    float scale;
    float *out;
    int64_t rows, max_keys;
    const lk_attn_routines *fn; /* the instruction set's routines */
    int failed;
} job;

#define TG 8      /* tiles per task */
#define KB KB_MAX /* keys per block */

/* Tasks of at least this many tiles score their keys with the routines' dots_block (keys in the
 * lanes, transposed once a block for all the task's queries) where the set has one (AVX-512);
 * 0 = never. Same bits either way (attention_isa.h). */
static int block_tiles = 5;

int lk_attend_block_tiles(int tiles) {
    int before = block_tiles;
    if (tiles >= 0) block_tiles = tiles;
    return before;
}

/* A task: up to TG tiles of one sequence and kv head. Keys and values are read in blocks of KB
 * rows, each block once for all the task's tiles (it stays in L1), in two passes: the scores of
 * every query, then (after each query's softmax) the outputs, accumulated key by key in memory
 * between blocks, which changes no bits. */

typedef struct {
    const float *q[TQ], *bias[TQ];
    float *o[TQ];
    const float *p[TQ];
    int nq;
} tile;

#define PF 32 /* keys read ahead */

/* Keys TK rows from ``from`` are fetched ahead into L1, and their values into L2 for the second
 * pass; no computed value changes. Measured on a 2-core AMD EPYC (AVX-512), 30 layers of 1,500
 * cached rows, one new row: 3.3 -> 2.8 ms with the head-major cache (about the memory's bandwidth);
 * 9.3 -> 5.9 ms when the cache held rows of all kv heads (one head's 256 bytes in every 768).
 * Rows are ``row_bytes`` long (D elements of the cache's format). */
static inline void prefetch_rows(const char *keys, const char *vals, int64_t from, int64_t n, int64_t row_bytes) {
    for (int64_t r = from; r < from + TK && r < n; r++)
        for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch(keys + r * row_bytes + b, 0, 3);
            __builtin_prefetch(vals + r * row_bytes + b, 0, 2);
        }
}

/* keys_at / vals_at: the kv head's n cached keys and values, D elements a row, float32 or (half)
 * float16, read through the routines for their format: every score and output is the same float32
 * operations on the same values either way. */
static void attend_task(const job *j, tile *t, int nt, const void *keys_at, const void *vals_at, int half,
                        int64_t n, float *s) {
    int D = j->D;
    int64_t stride = D, esize = half ? 2 : 4, row_bytes = (int64_t)D * esize;
    const char *keys = (const char *)keys_at, *vals = (const char *)vals_at;
    const lk_attn_routines *fn = j->fn;
    void (*dots)(const float *const *, int, const void *const *, int, float *) = half ? fn->dots_half : fn->dots;
    void (*pv)(const float *const *, int, const void *, int64_t, int64_t, int, float *const *, float *) =
        half ? fn->pv_half : fn->pv;
    void (*dots_block)(const float *const *, int, const void *, int64_t, int64_t, int, float *const *, float *) =
        half ? fn->dots_block_half : fn->dots_block;
    float dots_out[TQ * TK]; /* query i, key c at i * TK + c */
    float *kt = s + (int64_t)nt * TQ * n; /* KB x D: a block's keys, transposed, for dots_block */
    int block = dots_block && block_tiles > 0 && nt >= block_tiles;
    const float *qs[TG * TQ];
    float *rows[TG * TQ];
    int nq = 0;
    for (int ti = 0; block && ti < nt; ti++)
        for (int i = 0; i < t[ti].nq; i++, nq++) {
            qs[nq] = t[ti].q[i];
            rows[nq] = s + ((int64_t)ti * TQ + i) * n;
        }
    for (int64_t jb = 0; jb < n; jb += KB) {
        int64_t je = jb + KB < n ? jb + KB : n;
        if (block) {
            dots_block(qs, nq, keys + jb * row_bytes, stride, je - jb, D, rows, kt);
            for (int i = 0; i < nq; i++) rows[i] += je - jb;
            continue;
        }
        for (int ti = 0; ti < nt; ti++) {
            float *st = s + (int64_t)ti * TQ * n;
            for (int64_t j0 = jb; j0 < je; j0 += TK) {
                if (ti == 0) prefetch_rows(keys, vals, j0 + PF, n, row_bytes);
                const void *k[TK];
                for (int c = 0; c < TK; c++) k[c] = keys + (j0 + c < n ? j0 + c : n - 1) * row_bytes; /* pad: dropped */
                dots(t[ti].q, t[ti].nq, k, D, dots_out);
                int64_t nk = n - j0 < TK ? n - j0 : TK;
                for (int i = 0; i < t[ti].nq; i++)
                    memcpy(st + i * n + j0, dots_out + i * TK, sizeof(float) * (size_t)nk);
            }
        }
    }
    float l[TG][TQ];
    for (int ti = 0; ti < nt; ti++) {
        float *st = s + (int64_t)ti * TQ * n;
        for (int i = 0; i < t[ti].nq; i++) {
            float *si = st + i * n;
            fn->exp_all(si, n, fn->scale_max(si, t[ti].bias[i], n, j->scale));
        }
        for (int i = 0; i < t[ti].nq; i++) { /* the routines read and write real queries only */
            l[ti][i] = 0.0f;
            t[ti].p[i] = st + i * n;
            memset(t[ti].o[i], 0, sizeof(float) * (size_t)D);
        }
    }
    for (int64_t jb = 0; jb < n; jb += KB) {
        int64_t nb = n - jb < KB ? n - jb : KB;
        for (int ti = 0; ti < nt; ti++) {
            const float *p[TQ];
            for (int i = 0; i < TQ; i++) p[i] = t[ti].p[i] + jb;
            pv(p, t[ti].nq, vals + jb * row_bytes, nb, stride, D, t[ti].o, l[ti]); /* denominators too, in order */
        }
    }
    for (int ti = 0; ti < nt; ti++)
        for (int i = 0; i < t[ti].nq; i++)
            for (int d = 0; d < D; d++) t[ti].o[i][d] /= l[ti][i];
}

/* A sequence's queries, for each kv head: rows x the heads of that kv head, row-major, in tiles
 * of TQ, in tasks of up to TG tiles. */
static int64_t tiles_of(const job *j, int64_t w) { return ((int64_t)(j->H / j->Hk) * w + TQ - 1) / TQ; }
static int64_t tasks_of(const job *j, int64_t w) { return (tiles_of(j, w) + TG - 1) / TG; }

static void run_part(void *ctx, int part, int parts) {
    job *j = (job *)ctx;
    int64_t tasks = 0;
    for (int s = 0; s < j->n_seq; s++) tasks += j->Hk * tasks_of(j, j->meta[s * LK_ATTN_META + 1]);
    int64_t t0 = tasks * part / parts, t1 = tasks * (part + 1) / parts;
    if (t0 >= t1) return;
    /* scores of TG x TQ queries, then a block's keys transposed */
    size_t keys_max = (size_t)(j->max_keys > 0 ? j->max_keys : 1);
    float *scores = (float *)malloc(sizeof(float) * ((size_t)TG * TQ * keys_max + (size_t)KB * (size_t)j->D));
    if (!scores) {
        j->failed = 1;
        return;
    }
    int H = j->H, Hk = j->Hk, D = j->D, group = H / Hk;
    int64_t qk_stride = (int64_t)(H + Hk) * D, first = 0;
    tile tl[TG];
    for (int s = 0; s < j->n_seq && first < t1; s++) {
        const int64_t *m = j->meta + s * LK_ATTN_META;
        int64_t w = m[1], past = m[2], n = past + w, per_head = tasks_of(j, w), queries = group * w;
        int64_t cap = j->kv[s * LK_ATTN_KV + 1];
        int half = j->kv[s * LK_ATTN_KV + 2] == LK_KV_F16;
        const char *base = (const char *)(intptr_t)j->kv[s * LK_ATTN_KV];
        size_t esize = half ? sizeof(uint16_t) : sizeof(float);
        for (int64_t t = 0; t < Hk * per_head; t++, first++) {
            if (first < t0 || first >= t1) continue;
            int g = (int)(t / per_head);
            int64_t first_tile = (t % per_head) * TG, last_tile = tiles_of(j, w);
            int nt = (int)(last_tile - first_tile < TG ? last_tile - first_tile : TG);
            const char *keys = base + (size_t)(((int64_t)j->layer * 2 * Hk + g) * cap * D) * esize;
            for (int ti = 0; ti < nt; ti++) {
                int64_t q0 = (first_tile + ti) * TQ;
                tl[ti].nq = (int)(queries - q0 < TQ ? queries - q0 : TQ);
                for (int i = 0; i < tl[ti].nq; i++) {
                    int64_t qi = q0 + i;
                    int64_t r = m[0] + qi / group;
                    int h = g * group + (int)(qi % group);
                    tl[ti].q[i] = j->qk + r * qk_stride + (int64_t)h * D;
                    tl[ti].bias[i] = m[3] ? (const float *)(intptr_t)m[3] + (r - m[0]) * n : NULL;
                    tl[ti].o[i] = j->out + r * (int64_t)H * D + (int64_t)h * D;
                }
            }
            attend_task(j, tl, nt, keys, keys + (size_t)((int64_t)Hk * cap * D) * esize, half, n, scores);
        }
    }
    free(scores);
}

int lk_attend(int n_seq, const int64_t *meta, const int64_t *kv, int layer, const float *qk, const float *v,
              int64_t v_stride, int H, int Hk, int D, float scale, float *out, int threads) {
    int64_t qk_stride = (int64_t)(H + Hk) * D, rows = 0, max_keys = 0;
    const lk_attn_routines *fn = lk_attn_pick(D);
    int over = 0; /* elements float16 cannot hold */
    for (int s = 0; s < n_seq; s++)
        if (kv[s * LK_ATTN_KV + 2] != LK_KV_F32 && kv[s * LK_ATTN_KV + 2] != LK_KV_F16) return LK_EBADARG;
    for (int s = 0; s < n_seq; s++) {
        const int64_t *m = meta + s * LK_ATTN_META;
        int64_t w = m[1], past = m[2], cap = kv[s * LK_ATTN_KV + 1];
        int64_t at = (int64_t)layer * 2 * Hk * cap * D, v_at = at + (int64_t)Hk * cap * D; /* elements */
        for (int g = 0; g < Hk; g++)
            for (int64_t i = 0; i < w; i++) {
                const float *k_new = qk + (m[0] + i) * qk_stride + (int64_t)(H + g) * D;
                const float *v_new = v + (m[0] + i) * v_stride + (int64_t)g * D;
                int64_t row = ((int64_t)g * cap + past + i) * D;
                if (kv[s * LK_ATTN_KV + 2] == LK_KV_F16) {
                    uint16_t *c = (uint16_t *)(intptr_t)kv[s * LK_ATTN_KV];
                    over += fn->to_half(k_new, D, c + at + row);
                    over += fn->to_half(v_new, D, c + v_at + row);
                } else {
                    float *c = (float *)(intptr_t)kv[s * LK_ATTN_KV];
                    memcpy(c + at + row, k_new, sizeof(float) * (size_t)D);
                    memcpy(c + v_at + row, v_new, sizeof(float) * (size_t)D);
                }
            }
        rows = m[0] + w > rows ? m[0] + w : rows;
        max_keys = past + w > max_keys ? past + w : max_keys;
    }
    if (over) return LK_ERANGE;
    job j = {n_seq, layer, H, Hk, D, meta, kv, qk, scale, out, rows, max_keys, fn, 0};
    int64_t tasks = 0;
    for (int s = 0; s < n_seq; s++) tasks += Hk * tasks_of(&j, meta[s * LK_ATTN_META + 1]);
    int parts = threads < 1 ? 1 : threads;
    if (tasks < parts) parts = (int)(tasks > 0 ? tasks : 1);
    lk_pool_run(run_part, &j, parts);
    return j.failed ? LK_ENOMEM : LK_OK;
}
