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
    int32_t *lex;        /* lex[i]: rank of node i's token path among nodes of its depth */
    int sorted;          /* 1 while node index order equals lexicographic preorder
                            (all nodes came from one add into an empty trie), so
                            lex[] is not needed */
    int64_t hashed;      /* nodes [0, hashed) are in the child hash table */
    int32_t *slot_of;    /* slot_of[i]: hash slot holding node i (to clear on reset) */
    int32_t *table;      /* open-addressing (parent, tok) -> node, -1 = empty */
    int64_t mask;        /* table size - 1 (power of two >= 2 * capacity) */
    int64_t *scratch;    /* 2 * capacity int64 of scratch for ranking */
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

#endif
