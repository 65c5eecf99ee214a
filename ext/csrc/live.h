/* The live index: the prompt plus the generated tokens, indexed as they arrive.
 *
 * It answers, once per decoding step: which is the longest suffix of the
 * sequence (between min_n and max_n tokens) that also occurred earlier, and
 * where did those earlier occurrences continue?
 *
 * Structure (at most 16 bytes per token at exact capacity):
 *   tok[p]      the token at position p;
 *   prev[l][p]  chain links of level l: for a registered position p (a
 *               "continuation start": the g_l tokens before it form a complete
 *               g_l-gram, g_0 = min_n, g_1 = min_n + 1), the previous registered
 *               position in the same hash bucket, or -1;
 *   head[l][b]  the most recent registered position of bucket b, or -1.
 * Position p is registered when the token at p is appended, so every
 * registered position has a known continuation and the current suffix itself
 * is never in a chain. Keys are not stored (they are re-read from tok): a
 * hash collision only costs a comparison. The bucket tables double when the
 * positions outnumber four times the buckets (load factor <= 4), rebuilt in O(n).
 * Level 1 exists only when max_n > min_n.
 *
 * A query for the longest match first walks the level-1 chain of the
 * suffix's (min_n+1)-gram (every match of min_n + 1 tokens or more is there),
 * extending each candidate backwards up to max_n; only if it finds none does it
 * walk the level-0 chain, whose candidates then all match exactly min_n tokens.
 * So a query costs O(occurrences of the suffix's (min_n+1)-gram), or of its
 * min_n-gram when the longer one never occurred. */
#ifndef LK_LIVE_H
#define LK_LIVE_H

#include <stdint.h>

typedef struct {
    int32_t *tok;      /* tokens, positions 0..n-1 */
    int32_t *prev[2];  /* chain links per position and level (see above); -1 ends a chain */
    int32_t *head[2];  /* most recent registered position per bucket and level; -1 for none */
    int64_t n;         /* tokens held */
    int64_t cap;       /* capacity of tok and prev */
    int64_t nbuckets;  /* size of each head table, a power of two */
    int32_t gram[2];   /* n-gram length keying each level: min_n, min_n + 1 */
    int32_t levels;    /* 1, or 2 when max_n > min_n */
} lk_live;

/* The result of a query: the longest match and its most recent occurrences. */
typedef struct {
    int64_t length;    /* tokens matched; 0 when nothing matched */
    int64_t total;     /* occurrences of that length (-1 when not counted) */
    int64_t nstarts;   /* starts written (<= the caller's max) */
} lk_live_match;

int lk_live_init(lk_live *ix, int32_t min_n, int32_t max_n, int64_t capacity);
void lk_live_free(lk_live *ix);
void lk_live_clear(lk_live *ix);
/* Appends n tokens (each >= 0); LK_ENOMEM leaves the index as it was. */
int lk_live_extend(lk_live *ix, const int32_t *tokens, int64_t n);
/* Bytes held by the index's buffers. */
int64_t lk_live_bytes(const lk_live *ix);
/* Longest suffix match of length in [lo, hi] (min_n <= lo); writes the starts of up
 * to max_starts of its most recent occurrences, most recent first. With count_all,
 * total counts every occurrence; without, the walk stops once max_starts
 * occurrences of the longest possible length are found (total = -1). */
lk_live_match lk_live_match_suffix(const lk_live *ix, int64_t lo, int64_t hi, int64_t *starts,
                                   int64_t max_starts, int count_all);
/* Up to depth tokens that followed an occurrence starting at start (0 < start < n);
 * past the end of the sequence the continuation repeats with period n - start when
 * periodic, else stops. Returns the number written. */
int64_t lk_live_continuation(const lk_live *ix, int64_t start, int64_t depth, int periodic, int32_t *out);
/* The continuations (depth tokens each, periodic) of starts[0..k) counted into a trie,
 * inserted in the given order; the width best nodes (by count desc, then depth asc,
 * then insertion order) written in insertion order, parents remapped (-1: a child of
 * the root). work must hold 6 * k * depth + depth int32 of scratch; out_* must hold
 * min(width, k * depth) entries. Returns the nodes written. */
int64_t lk_live_trie(const lk_live *ix, const int64_t *starts, int64_t k, int64_t depth, int64_t width,
                     int32_t *work, int32_t *out_tok, int32_t *out_parent, int32_t *out_count);

#endif
