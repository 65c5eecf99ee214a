/* Suffix-array lookup: longest matching context suffix, and a trie of the
 * continuations that follow its occurrences. */
#ifndef LK_LOOKUP_H
#define LK_LOOKUP_H

#include <stdint.h>
#include "lk_common.h"

/* Longest suffix of ctx[0..clen) with length in [min_n, max_n] that occurs in
 * tokens[0..n) (never across LK_SEP: the suffix is limited to the part of ctx
 * after its last LK_SEP). Writes its SA range [*lo, *hi) and returns its
 * length, or 0 (with *lo = *hi = 0) when none. Binary search over lengths
 * (occurrence is monotone in length), each probe a binary search over sa. */
int64_t lk_match_i32(const int32_t *tokens, int64_t n, const int32_t *sa,
                     const int32_t *ctx, int64_t clen, int64_t max_n, int64_t min_n,
                     int64_t *lo, int64_t *hi);
int64_t lk_match_i64(const int32_t *tokens, int64_t n, const int64_t *sa,
                     const int32_t *ctx, int64_t clen, int64_t max_n, int64_t min_n,
                     int64_t *lo, int64_t *hi);

/* A count trie of continuations, allocated once and reused across lookups. */
typedef struct {
    int64_t capacity;    /* maximum number of nodes */
    int64_t size;        /* nodes in use */
    int32_t *tok;        /* tok[i]: token of node i */
    int32_t *parent;     /* parent[i]: parent node, -1 for children of the root */
    int32_t *depth;      /* depth[i]: 1 for children of the root */
    int64_t *count;      /* count[i]: occurrences whose continuation passes node i */
    int32_t *out_index;  /* out_index[i]: node i's index in the output of the last top() */
    int sorted;          /* 1 while node index order equals lexicographic preorder
                            (all nodes came from one add into an empty trie), so
                            ties of count and depth rank by node index */
    int64_t hashed;      /* nodes [0, hashed) are in the child hash table */
    int32_t *slot_of;    /* slot_of[i]: hash slot holding node i (to clear on reset) */
    int32_t *table;      /* open-addressing (parent, tok) -> node, -1 = empty */
    int64_t mask;        /* table size - 1 (power of two >= 2 * capacity) */
    int64_t *scratch;    /* 2 * capacity int64 of scratch: the path of an add, the heap of top() */
} lk_trie;

/* Returns LK_OK or LK_ENOMEM. capacity must be in [1, 2^30]. */
int lk_trie_init(lk_trie *t, int64_t capacity);
void lk_trie_free(lk_trie *t);
void lk_trie_reset(lk_trie *t);

/* Samples K = min(hi - lo, max_occ) entries lo + (i * (hi - lo)) / K of sa,
 * and inserts the up-to-depth tokens after position sa[j] + match_len (stopping
 * at LK_SEP or the end) into the trie. Returns K (>= 0) or LK_ECAPACITY when
 * size + K * depth could exceed capacity (then nothing is inserted). */
int64_t lk_trie_add_i32(lk_trie *t, const int32_t *tokens, int64_t n, const int32_t *sa,
                        int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth);
int64_t lk_trie_add_i64(lk_trie *t, const int32_t *tokens, int64_t n, const int64_t *sa,
                        int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth);

/* Number of nodes top() emits for this budget: min(budget, size). */
int64_t lk_trie_top_size(const lk_trie *t, int64_t budget);

/* Writes the m = lk_trie_top_size(budget) best nodes, ranked by count desc,
 * depth asc, then token path lexicographically, in rank order; parents are
 * indices into the output (a parent always ranks before its child).
 * Returns m or LK_ENOMEM. */
int64_t lk_trie_top(lk_trie *t, int64_t budget, int64_t *out_tok, int32_t *out_parent,
                    int64_t *out_count);

/* ---- a whole lookup over the shards of an index, in one call -------------- */

/* Tokens of a suffix kept in a top-of-tree node. */
#define LK_TOP_TOKENS 4

/* One node of the top levels of a shard's suffix-array bisection over [0, n):
 * the entry every lookup's first probes read, kept in a small dense array so
 * those probes cost no cache or TLB miss in a multi-GB memory map. */
typedef struct {
    int64_t s;                     /* sa[mid] at this node */
    int32_t tok[LK_TOP_TOKENS];    /* tokens[s .. s + cnt) */
    int32_t cnt;                   /* min(LK_TOP_TOKENS, n - s); -1 when s is outside [0, n) */
} lk_top_node;

/* One shard as the lookup reads it: documents separated by LK_SEP, and their
 * suffix array. The lookup never reads outside tokens[0..n) or sa[0..n),
 * whatever the arrays hold. */
typedef struct {
    const int32_t *tokens;  /* tokens[0..n) (NULL when n == 0) */
    const void *sa;         /* the suffix array of tokens: n int32_t or int64_t entries */
    int64_t n;              /* tokens, and suffix-array entries */
    int wide;               /* 1: sa holds int64_t entries, 0: int32_t */
    lk_top_node *top;       /* NULL, or the nodes of the first top_levels levels of the
                               bisection over [0, n) in heap order (root 0, children
                               2i + 1 below mid and 2i + 2 above); see lk_shard_top_init */
    int top_levels;         /* levels in top (0: none) */
} lk_shard;

/* Copies the first `levels` levels (1..20) of the bisection tree of sh into
 * sh->top (2^levels - 1 nodes, malloc'd; reads sa and tokens at each node's
 * mid). Lookups then take those probes from it: the same comparisons, so the
 * same results. The arrays must not change afterwards. Returns LK_OK or
 * LK_ENOMEM (then sh->top is NULL). A copy made before is freed first; sh->top
 * must be NULL or such a copy. */
int lk_shard_top_init(lk_shard *sh, int levels);
void lk_shard_top_free(lk_shard *sh);

/* The scratch of one lookup: reused across lookups, never shared by two at once. */
typedef struct {
    lk_trie trie;         /* the continuation trie (its capacity bounds max_occ * depth) */
    int64_t n_shards;     /* entries of each per-shard array below */
    int64_t *take;        /* take[k]: the k-th shard holding the longest match, in shard order */
    int64_t *lo;          /* lo[k], hi[k]: the SA range of that match in shard take[k] */
    int64_t *hi;
    int64_t *quota;       /* quota[k]: occurrences sampled from shard take[k] */
    int64_t *rem;         /* 2 * n_shards int64 for the largest-remainder ranking */
    int64_t out_cap;      /* entries of each out_* array: the most nodes a lookup may return */
    int64_t *out_tok;     /* the returned tree: tokens, in rank order */
    int32_t *out_parent;  /* parent index of each node, -1 for children of the root */
    int64_t *out_count;   /* sampled occurrences passing through each node */
    int32_t *remap;       /* remap[i]: the output index of ranked node i, -1 when dropped */
    void *msearch;        /* n_shards search states of the interleaved match (lk_msearch, lookup.c) */
    int64_t *act;         /* act[0..): the shards whose search is still running */
    int64_t *mlen;        /* mlen[i], mlo[i], mhi[i]: shard i's longest match and its SA range */
    int64_t *mlo;
    int64_t *mhi;
} lk_lookup_scratch;

/* What a lookup found besides its tree. */
typedef struct {
    int64_t match_len;    /* longest context suffix found in any shard (0: none) */
    int64_t occurrences;  /* its occurrences summed over the shards holding it */
    int64_t sampled;      /* occurrences whose continuations were counted */
    int64_t nodes;        /* nodes written to out_tok / out_parent / out_count */
} lk_lookup_result;

/* Returns LK_OK or LK_ENOMEM (then the scratch holds nothing and can only be
 * freed). trie_capacity must be in [1, 2^30]; out_cap in [0, trie_capacity]. */
int lk_lookup_scratch_init(lk_lookup_scratch *s, int64_t n_shards, int64_t trie_capacity, int64_t out_cap);
void lk_lookup_scratch_free(lk_lookup_scratch *s);

/* Splits max_occ samples among k shards holding counts[0..k) occurrences,
 * the rule of split_occurrences in tests/oracles/index.py: every shard gets its
 * count when they sum to at most max_occ; otherwise shard s gets
 * floor(max_occ * counts[s] / C) (C = the sum), and the max_occ - sum(floors)
 * left over go one each to the shards with the largest remainders
 * (max_occ * counts[s]) mod C, ties to the lower index. counts[s] >= 0 and
 * their sum below 2^63; quota may be counts (split in place); rem holds
 * 2 * k int64 of scratch. */
void lk_split_occurrences(const int64_t *counts, int64_t k, int64_t max_occ, int64_t *quota,
                          int64_t *rem);

/* One lookup over shards[0..n_shards):
 *  1. the longest suffix of ctx[0..clen) with length in [min_n, max_n] found
 *     in any shard: each shard's lk_match, the shards' searches interleaved
 *     probe by probe when there are several (their memory reads overlap);
 *     the shards whose own longest match has that length hold it;
 *  2. max_occ samples split among the shards holding that length, in shard
 *     order (lk_split_occurrences), each shard's share counted into one trie
 *     (lk_trie_add, depth tokens per occurrence);
 *  3. the budget best nodes (lk_trie_top), less those whose path holds a
 *     token >= token_limit, written to s->out_* with parents renumbered.
 * n_shards must equal s->n_shards, max_occ * depth must fit the trie, and
 * min(budget, trie capacity) must be at most s->out_cap. Returns LK_OK,
 * LK_EBADTOKEN (ctx holds a value < LK_SEP; its index in res->match_len),
 * LK_ECAPACITY (the scratch is too small) or LK_ENOMEM. */
int lk_lookup(lk_lookup_scratch *s, const lk_shard *shards, int64_t n_shards, const int32_t *ctx,
              int64_t clen, int64_t max_n, int64_t min_n, int64_t max_occ, int64_t depth,
              int64_t budget, int64_t token_limit, lk_lookup_result *res);

#endif
