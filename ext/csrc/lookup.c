/* Lookup entry points and the ContinuationTrie (see lookup.h). */
#include <stdlib.h>
#include <string.h>

#include "lookup.h"

static inline uint64_t hash_key(int32_t parent, int32_t tok) {
    uint64_t h = ((uint64_t)(uint32_t)(parent + 1) << 32) | (uint32_t)tok;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

int lk_trie_init(lk_trie *t, int64_t capacity) {
    memset(t, 0, sizeof(*t));
    if (capacity < 1 || capacity > ((int64_t)1 << 30)) return LK_ENOMEM;
    int64_t tsize = 1;
    while (tsize < 2 * capacity) tsize <<= 1;
    t->capacity = capacity;
    t->mask = tsize - 1;
    t->tok = malloc((size_t)capacity * sizeof(int32_t));
    t->parent = malloc((size_t)capacity * sizeof(int32_t));
    t->depth = malloc((size_t)capacity * sizeof(int32_t));
    t->count = malloc((size_t)capacity * sizeof(int64_t));
    t->out_index = malloc((size_t)capacity * sizeof(int32_t));
    t->slot_of = malloc((size_t)capacity * sizeof(int32_t));
    t->table = malloc((size_t)tsize * sizeof(int32_t));
    t->scratch = malloc((size_t)(2 * capacity + 2) * sizeof(int64_t));
    if (!t->tok || !t->parent || !t->depth || !t->count || !t->out_index || !t->slot_of || !t->table ||
        !t->scratch) {
        lk_trie_free(t);
        return LK_ENOMEM;
    }
    memset(t->table, 0xff, (size_t)tsize * sizeof(int32_t));
    t->sorted = 1;
    return LK_OK;
}

void lk_trie_free(lk_trie *t) {
    free(t->tok); free(t->parent); free(t->depth); free(t->count);
    free(t->out_index); free(t->slot_of); free(t->table); free(t->scratch);
    memset(t, 0, sizeof(*t));
}

void lk_trie_reset(lk_trie *t) {
    /* clear only the hash slots in use: O(nodes), not O(table) */
    for (int64_t i = 0; i < t->hashed; ++i) t->table[t->slot_of[i]] = -1;
    t->size = 0;
    t->hashed = 0;
    t->sorted = 1;
}

static void hash_insert(lk_trie *t, int32_t node) {
    uint64_t s = hash_key(t->parent[node], t->tok[node]) & (uint64_t)t->mask;
    while (t->table[s] != -1) s = (s + 1) & (uint64_t)t->mask;
    t->table[s] = node;
    t->slot_of[node] = (int32_t)s;
}

/* Puts nodes [hashed, size) into the hash table (before an add that must
 * find children created by earlier adds). */
static void lk_trie_index_(lk_trie *t) {
    for (int64_t i = t->hashed; i < t->size; ++i) hash_insert(t, (int32_t)i);
    t->hashed = t->size;
}

static inline int32_t lk_trie_new_(lk_trie *t, int32_t parent, int32_t tok, int32_t depth) {
    int32_t node = (int32_t)t->size++;
    t->tok[node] = tok;
    t->parent[node] = parent;
    t->depth[node] = depth;
    t->count[node] = 0;
    return node;
}

static int32_t lk_trie_find_or_new_(lk_trie *t, int32_t parent, int32_t tok, int32_t depth) {
    uint64_t s = hash_key(parent, tok) & (uint64_t)t->mask;
    int32_t node;
    while ((node = t->table[s]) != -1) {
        if (t->parent[node] == parent && t->tok[node] == tok) return node;
        s = (s + 1) & (uint64_t)t->mask;
    }
    node = lk_trie_new_(t, parent, tok, depth);
    t->table[s] = node;
    t->slot_of[node] = (int32_t)s;
    t->hashed = t->size;
    t->sorted = 0;
    return node;
}

#define SX int32_t
#define FN(name) lk_i32_##name
#include "lookup_impl.h"
#undef SX
#undef FN

#define SX int64_t
#define FN(name) lk_i64_##name
#include "lookup_impl.h"
#undef SX
#undef FN

#include "multisearch.h"

int64_t lk_match_i32(const int32_t *tokens, int64_t n, const int32_t *sa, const int32_t *ctx,
                     int64_t clen, int64_t max_n, int64_t min_n, int64_t *lo, int64_t *hi) {
    return lk_i32_match(tokens, n, sa, ctx, clen, max_n, min_n, lo, hi);
}
int64_t lk_match_i64(const int32_t *tokens, int64_t n, const int64_t *sa, const int32_t *ctx,
                     int64_t clen, int64_t max_n, int64_t min_n, int64_t *lo, int64_t *hi) {
    return lk_i64_match(tokens, n, sa, ctx, clen, max_n, min_n, lo, hi);
}
int64_t lk_trie_add_i32(lk_trie *t, const int32_t *tokens, int64_t n, const int32_t *sa,
                        int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth) {
    return lk_i32_add(t, tokens, n, sa, lo, hi, match_len, max_occ, depth);
}
int64_t lk_trie_add_i64(lk_trie *t, const int32_t *tokens, int64_t n, const int64_t *sa,
                        int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth) {
    return lk_i64_add(t, tokens, n, sa, lo, hi, match_len, max_occ, depth);
}

/* ---- ranking ---------------------------------------------------------- */

/* Token-path order of two distinct nodes of equal depth: walk both up to the
 * children of their deepest common ancestor, whose tokens differ (a node's
 * children have distinct tokens). O(depth), and only for ties of count and
 * depth, instead of ranking every node's path before each top(). */
static inline int path_less(const lk_trie *t, int64_t a, int64_t b) {
    int32_t x = (int32_t)a, y = (int32_t)b;
    while (t->parent[x] != t->parent[y]) {
        x = t->parent[x];
        y = t->parent[y];
    }
    return t->tok[x] < t->tok[y];
}

/* Strict rank order: count desc, depth asc, token path asc. */
static inline int better(const lk_trie *t, int64_t a, int64_t b) {
    if (t->count[a] != t->count[b]) return t->count[a] > t->count[b];
    if (t->depth[a] != t->depth[b]) return t->depth[a] < t->depth[b];
    if (t->sorted) return a < b;
    return path_less(t, a, b);
}

/* heap[0] is the worst kept node */
static void sift_down(const lk_trie *t, int64_t *heap, int64_t m, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && better(t, heap[w], heap[l])) w = l;
        if (r < m && better(t, heap[w], heap[r])) w = r;
        if (w == i) return;
        int64_t tmp = heap[i]; heap[i] = heap[w]; heap[w] = tmp;
        i = w;
    }
}

int64_t lk_trie_top_size(const lk_trie *t, int64_t budget) {
    if (budget <= 0) return 0;
    return budget < t->size ? budget : t->size;
}

int64_t lk_trie_top(lk_trie *t, int64_t budget, int64_t *out_tok, int32_t *out_parent,
                    int64_t *out_count) {
    int64_t m = lk_trie_top_size(t, budget), i;
    if (m == 0) return 0;
    int64_t *heap = t->scratch;
    int64_t hs = 0;
    for (i = 0; i < t->size; ++i) {
        if (hs < m) {
            /* sift up */
            int64_t c = hs++;
            heap[c] = i;
            while (c > 0) {
                int64_t p = (c - 1) >> 1;
                if (!better(t, heap[p], heap[c])) break;
                int64_t tmp = heap[p]; heap[p] = heap[c]; heap[c] = tmp;
                c = p;
            }
        } else if (better(t, i, heap[0])) {
            heap[0] = i;
            sift_down(t, heap, hs, 0);
        }
    }
    /* pop the worst to the back: heap[] becomes rank order */
    for (int64_t end = hs - 1; end > 0; --end) {
        int64_t tmp = heap[0]; heap[0] = heap[end]; heap[end] = tmp;
        sift_down(t, heap, end, 0);
    }
    /* a parent ranks strictly before its child (count >=, depth <), and the
     * kept set is a prefix of the ranking, so every kept parent has an index */
    for (i = 0; i < m; ++i) {
        int64_t node = heap[i];
        t->out_index[node] = (int32_t)i;
    }
    for (i = 0; i < m; ++i) {
        int64_t node = heap[i];
        out_tok[i] = t->tok[node];
        out_count[i] = t->count[node];
        out_parent[i] = t->parent[node] < 0 ? -1 : t->out_index[t->parent[node]];
    }
    return m;
}

/* ---- a whole lookup over the shards of an index ------------------------- */

int lk_lookup_scratch_init(lk_lookup_scratch *s, int64_t n_shards, int64_t trie_capacity, int64_t out_cap) {
    memset(s, 0, sizeof(*s));
    if (n_shards < 0 || out_cap < 0 || out_cap > trie_capacity) return LK_ENOMEM;
    int rc = lk_trie_init(&s->trie, trie_capacity);
    if (rc != LK_OK) return rc;
    size_t k = (size_t)(n_shards > 0 ? n_shards : 1), m = (size_t)(out_cap > 0 ? out_cap : 1);
    s->n_shards = n_shards;
    s->out_cap = out_cap;
    s->lo = malloc(k * sizeof(int64_t));
    s->hi = malloc(k * sizeof(int64_t));
    s->take = malloc(k * sizeof(int64_t));
    s->quota = malloc(k * sizeof(int64_t));
    s->rem = malloc(2 * k * sizeof(int64_t));
    s->out_tok = malloc(m * sizeof(int64_t));
    s->out_parent = malloc(m * sizeof(int32_t));
    s->out_count = malloc(m * sizeof(int64_t));
    s->remap = malloc(m * sizeof(int32_t));
    s->msearch = malloc(k * sizeof(lk_msearch));
    s->act = malloc(k * sizeof(int64_t));
    s->mlen = malloc(k * sizeof(int64_t));
    s->mlo = malloc(k * sizeof(int64_t));
    s->mhi = malloc(k * sizeof(int64_t));
    if (!s->lo || !s->hi || !s->take || !s->quota || !s->rem || !s->out_tok || !s->out_parent ||
        !s->out_count || !s->remap || !s->msearch || !s->act || !s->mlen || !s->mlo || !s->mhi) {
        lk_lookup_scratch_free(s);
        return LK_ENOMEM;
    }
    return LK_OK;
}

void lk_lookup_scratch_free(lk_lookup_scratch *s) {
    lk_trie_free(&s->trie);
    free(s->lo); free(s->hi); free(s->take); free(s->quota); free(s->rem);
    free(s->out_tok); free(s->out_parent); free(s->out_count); free(s->remap);
    free(s->msearch); free(s->act); free(s->mlen); free(s->mlo); free(s->mhi);
    memset(s, 0, sizeof(*s));
}

/* Largest remainder first, then the lower index (rem[2i] = remainder, rem[2i+1] = index). */
static int cmp_remainder(const void *a, const void *b) {
    const int64_t *x = (const int64_t *)a, *y = (const int64_t *)b;
    if (x[0] != y[0]) return x[0] < y[0] ? 1 : -1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

void lk_split_occurrences(const int64_t *counts, int64_t k, int64_t max_occ, int64_t *quota,
                          int64_t *rem) {
    int64_t total = 0, given = 0, i;
    for (i = 0; i < k; ++i) total += counts[i];
    if (total <= max_occ) {
        for (i = 0; i < k; ++i) quota[i] = counts[i];
        return;
    }
    /* total > max_occ >= 0 here; max_occ * counts[i] may pass 2^63: 128-bit products */
    for (i = 0; i < k; ++i) {
        __int128 p = (__int128)max_occ * counts[i];
        quota[i] = (int64_t)(p / total);
        rem[2 * i] = (int64_t)(p % total);
        rem[2 * i + 1] = i;
        given += quota[i];
    }
    int64_t left = max_occ - given;  /* < k: each floor lost less than 1 */
    if (left <= 0) return;
    qsort(rem, (size_t)k, 2 * sizeof(int64_t), cmp_remainder);
    for (i = 0; i < left && i < k; ++i) quota[rem[2 * i + 1]] += 1;
}

/* Fills heap node i, the probe of the bisection over [lo, hi) at level lvl. */
static void top_fill(lk_shard *sh, int64_t i, int64_t lo, int64_t hi, int lvl) {
    if (lvl >= sh->top_levels) return;
    lk_top_node *t = &sh->top[i];
    if (lo >= hi) {  /* the bisection never probes here */
        t->s = 0;
        t->cnt = -1;
        return;
    }
    int64_t mid = lo + ((hi - lo) >> 1);
    int64_t s = sh->wide ? ((const int64_t *)sh->sa)[mid] : (int64_t)((const int32_t *)sh->sa)[mid];
    t->s = s;
    if (s < 0 || s >= sh->n) {
        t->cnt = -1;
    } else {
        int64_t c = sh->n - s < LK_TOP_TOKENS ? sh->n - s : LK_TOP_TOKENS;
        for (int64_t j = 0; j < c; ++j) t->tok[j] = sh->tokens[s + j];
        t->cnt = (int32_t)c;
    }
    top_fill(sh, 2 * i + 1, lo, mid, lvl + 1);
    top_fill(sh, 2 * i + 2, mid + 1, hi, lvl + 1);
}

void lk_shard_top_free(lk_shard *sh) {
    free(sh->top);
    sh->top = NULL;
    sh->top_levels = 0;
}

int lk_shard_top_init(lk_shard *sh, int levels) {
    lk_shard_top_free(sh);  /* a copy made before is replaced */
    if (levels < 1 || levels > 20 || sh->n <= 0) return LK_OK;
    int64_t nodes = ((int64_t)1 << levels) - 1;
    sh->top = malloc((size_t)nodes * sizeof(lk_top_node));
    if (!sh->top) return LK_ENOMEM;
    sh->top_levels = levels;
    top_fill(sh, 0, 0, sh->n, 0);
    return LK_OK;
}


static int64_t shard_match(const lk_shard *sh, const int32_t *ctx, int64_t clen, int64_t max_n,
                           int64_t min_n, int64_t *lo, int64_t *hi) {
    *lo = *hi = 0;
    if (sh->n <= 0) return 0;
    return sh->wide ? lk_i64_match(sh->tokens, sh->n, (const int64_t *)sh->sa, ctx, clen, max_n, min_n, lo, hi)
                    : lk_i32_match(sh->tokens, sh->n, (const int32_t *)sh->sa, ctx, clen, max_n, min_n, lo, hi);
}

int lk_lookup(lk_lookup_scratch *s, const lk_shard *shards, int64_t n_shards, const int32_t *ctx,
              int64_t clen, int64_t max_n, int64_t min_n, int64_t max_occ, int64_t depth,
              int64_t budget, int64_t token_limit, lk_lookup_result *res) {
    int64_t best = 0, live = 0, occ = 0, sampled = 0, i, k;
    memset(res, 0, sizeof(*res));
    if (n_shards != s->n_shards) return LK_ECAPACITY;
    if (min_n < 1) min_n = 1;
    for (i = 0; i < clen; ++i) {
        if (ctx[i] < LK_SEP) {
            res->match_len = i;  /* the offending context index */
            return LK_EBADTOKEN;
        }
    }
    /* 1. the longest match over all shards, and the shards holding it: those
     * whose own longest match is that long (a shard holding the best length
     * has no longer match, or it would be the best) */
    if (n_shards == 1 && !shards[0].top) {
        int64_t lo, hi;
        int64_t len = shard_match(&shards[0], ctx, clen, max_n, min_n, &lo, &hi);
        if (len == LK_EBADTOKEN) {  /* unreachable: ctx was checked above */
            res->match_len = lo;
            return LK_EBADTOKEN;
        }
        s->mlen[0] = len;
        s->mlo[0] = lo;
        s->mhi[0] = hi;
    } else {
        lk_match_all(shards, n_shards, ctx, clen, max_n, min_n, (lk_msearch *)s->msearch, s->act, s->mlen,
                     s->mlo, s->mhi);
    }
    for (i = 0; i < n_shards; ++i) {
        if (s->mlen[i] > best) best = s->mlen[i];
    }
    for (i = 0; best > 0 && i < n_shards; ++i) {
        if (s->mlen[i] == best) {
            s->take[live] = i;
            s->lo[live] = s->mlo[i];
            s->hi[live] = s->mhi[i];
            ++live;
        }
    }
    lk_trie_reset(&s->trie);
    if (best == 0) return LK_OK;
    /* 2. share the samples among those shards and count continuations into one trie */
    for (k = 0; k < live; ++k) {
        s->quota[k] = s->hi[k] - s->lo[k];  /* the count, split in place below */
        occ += s->quota[k];
    }
    lk_split_occurrences(s->quota, live, max_occ, s->quota, s->rem);
    for (k = 0; k < live; ++k) {
        int64_t q = s->quota[k], added;
        if (q <= 0) continue;
        const lk_shard *sh = &shards[s->take[k]];
        added = sh->wide ? lk_i64_add(&s->trie, sh->tokens, sh->n, (const int64_t *)sh->sa, s->lo[k], s->hi[k],
                                      best, q, depth)
                         : lk_i32_add(&s->trie, sh->tokens, sh->n, (const int32_t *)sh->sa, s->lo[k], s->hi[k],
                                      best, q, depth);
        if (added < 0) return (int)added;
        sampled += added;
    }
    res->match_len = best;
    res->occurrences = occ;
    res->sampled = sampled;
    /* 3. the best nodes, less those whose path leaves the vocabulary */
    int64_t m = lk_trie_top_size(&s->trie, budget);
    if (m > s->out_cap) return LK_ECAPACITY;
    if (m == 0) return LK_OK;
    int64_t got = lk_trie_top(&s->trie, budget, s->out_tok, s->out_parent, s->out_count);
    if (got < 0) return (int)got;
    int64_t kept = 0;
    for (i = 0; i < got; ++i) {
        int32_t p = s->out_parent[i];  /* p < i: remap[p] is already set */
        if (s->out_tok[i] < token_limit && (p < 0 || s->remap[p] >= 0)) {
            s->remap[i] = (int32_t)kept;
            s->out_tok[kept] = s->out_tok[i];
            s->out_count[kept] = s->out_count[i];
            s->out_parent[kept] = p < 0 ? -1 : s->remap[p];
            ++kept;
        } else {
            s->remap[i] = -1;
        }
    }
    res->nodes = kept;
    return LK_OK;
}
