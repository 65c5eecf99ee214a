/* The live index (see live.h). */
#include "live.h"

#include <stdlib.h>
#include <string.h>

#include "lk_common.h"

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* Hash of the min_n tokens before position p (p >= min_n). */
static inline uint64_t gram_hash(const int32_t *tok, int64_t p, int32_t min_n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int64_t i = p - min_n; i < p; i++) h = (h ^ (uint32_t)tok[i]) * 0x100000001B3ULL;
    return mix(h);
}

static void link_position(lk_live *ix, int64_t p) {
    for (int l = 0; l < ix->levels; l++) {
        int32_t g = ix->gram[l];
        if (p < g) {
            ix->prev[l][p] = -1;
            continue;
        }
        uint64_t b = gram_hash(ix->tok, p, g) & (uint64_t)(ix->nbuckets - 1);
        ix->prev[l][p] = ix->head[l][b];
        ix->head[l][b] = (int32_t)p;
    }
}

static int resize_buckets(lk_live *ix, int64_t nbuckets) {
    int32_t *heads[2] = {NULL, NULL};
    for (int l = 0; l < ix->levels; l++) {
        heads[l] = (int32_t *)malloc((size_t)nbuckets * sizeof(int32_t));
        if (!heads[l]) {
            free(heads[0]);
            return LK_ENOMEM;
        }
        memset(heads[l], 0xff, (size_t)nbuckets * sizeof(int32_t));
    }
    for (int l = 0; l < ix->levels; l++) {
        free(ix->head[l]);
        ix->head[l] = heads[l];
    }
    ix->nbuckets = nbuckets;
    for (int64_t p = 0; p < ix->n; p++) link_position(ix, p);
    return LK_OK;
}

int lk_live_init(lk_live *ix, int32_t min_n, int32_t max_n, int64_t capacity) {
    memset(ix, 0, sizeof(*ix));
    ix->gram[0] = min_n < 1 ? 1 : min_n;
    ix->gram[1] = ix->gram[0] + 1;
    ix->levels = max_n > ix->gram[0] ? 2 : 1;
    if (capacity < 16) capacity = 16;
    ix->tok = (int32_t *)malloc((size_t)capacity * sizeof(int32_t));
    int ok = ix->tok != NULL;
    for (int l = 0; l < ix->levels; l++) {
        ix->prev[l] = (int32_t *)malloc((size_t)capacity * sizeof(int32_t));
        ok = ok && ix->prev[l] != NULL;
    }
    if (!ok) {
        lk_live_free(ix);
        return LK_ENOMEM;
    }
    ix->cap = capacity;
    if (resize_buckets(ix, 16) != LK_OK) {
        lk_live_free(ix);
        return LK_ENOMEM;
    }
    return LK_OK;
}

void lk_live_free(lk_live *ix) {
    free(ix->tok);
    for (int l = 0; l < 2; l++) {
        free(ix->prev[l]);
        free(ix->head[l]);
    }
    memset(ix, 0, sizeof(*ix));
}

void lk_live_clear(lk_live *ix) {
    ix->n = 0;
    for (int l = 0; l < ix->levels; l++) memset(ix->head[l], 0xff, (size_t)ix->nbuckets * sizeof(int32_t));
}

int64_t lk_live_bytes(const lk_live *ix) {
    return ((1 + ix->levels) * ix->cap + ix->levels * ix->nbuckets) * (int64_t)sizeof(int32_t);
}

int lk_live_extend(lk_live *ix, const int32_t *tokens, int64_t n) {
    int64_t need = ix->n + n;
    if (need > INT32_MAX) return LK_ECAPACITY;
    if (need > ix->cap) {
        int64_t cap = ix->cap + ix->cap / 2;  /* 1.5x keeps the slack (and the bytes per token) low */
        if (cap < need) cap = need;
        if (cap > INT32_MAX) cap = INT32_MAX;
        /* A failed realloc keeps the old buffer; a larger one is harmless if a later one fails. */
        int32_t *tok = (int32_t *)realloc(ix->tok, (size_t)cap * sizeof(int32_t));
        if (!tok) return LK_ENOMEM;
        ix->tok = tok;
        for (int l = 0; l < ix->levels; l++) {
            int32_t *prev = (int32_t *)realloc(ix->prev[l], (size_t)cap * sizeof(int32_t));
            if (!prev) return LK_ENOMEM;
            ix->prev[l] = prev;
        }
        ix->cap = cap;
    }
    int64_t nb = ix->nbuckets;
    while (need > 4 * nb) nb *= 2;
    memcpy(ix->tok + ix->n, tokens, (size_t)n * sizeof(int32_t));
    if (nb != ix->nbuckets) {
        int64_t old_n = ix->n;
        ix->n = need;  /* resize_buckets links every position, the new ones included */
        if (resize_buckets(ix, nb) != LK_OK) {
            ix->n = old_n;
            return LK_ENOMEM;
        }
        return LK_OK;
    }
    for (int64_t p = ix->n; p < need; p++) link_position(ix, p);
    ix->n = need;
    return LK_OK;
}

/* Walks the level-l chain of the suffix's gram-length n-gram: candidates matching at
 * least lo (and, extended backwards, up to hi) tokens. */
static void walk(const lk_live *ix, int l, int64_t lo, int64_t hi, int64_t *starts, int64_t max_starts,
                 int count_all, lk_live_match *m) {
    const int64_t L = ix->n, g = ix->gram[l];
    const int32_t *tok = ix->tok;
    uint64_t b = gram_hash(tok, L, (int32_t)g) & (uint64_t)(ix->nbuckets - 1);
    for (int64_t s = ix->head[l][b]; s >= 0; s = ix->prev[l][s]) {
        int64_t k = 0;
        while (k < g && tok[s - 1 - k] == tok[L - 1 - k]) k++;
        if (k < g) continue;  /* a hash collision, not the same n-gram */
        while (k < hi && s - 1 - k >= 0 && tok[s - 1 - k] == tok[L - 1 - k]) k++;
        if (k < lo) continue;
        if (k > m->length) {
            m->length = k;
            m->total = 0;
            m->nstarts = 0;
        }
        if (k == m->length) {
            m->total++;
            if (m->nstarts < max_starts) starts[m->nstarts++] = s;
            if (!count_all && k == hi && m->nstarts == max_starts) break;  /* nothing longer or more recent */
        }
    }
}

lk_live_match lk_live_match_suffix(const lk_live *ix, int64_t lo, int64_t hi, int64_t *starts,
                                   int64_t max_starts, int count_all) {
    lk_live_match m = {0, 0, 0};
    const int64_t L = ix->n;
    if (hi > L - 1) hi = L - 1;  /* a match needs a continuation token before the suffix's own start */
    if (lo < ix->gram[0]) lo = ix->gram[0];
    if (hi < lo) return m;
    /* Every match of gram[1]+ tokens is in the level-1 chain of the suffix's gram[1]-gram. */
    if (ix->levels == 2 && hi >= ix->gram[1]) {
        walk(ix, 1, lo > ix->gram[1] ? lo : ix->gram[1], hi, starts, max_starts, count_all, &m);
        if (m.length || lo > ix->gram[0]) {
            if (!count_all) m.total = -1;
            return m;
        }
    }
    /* No longer match: the level-0 candidates all match exactly gram[0] tokens. */
    walk(ix, 0, lo, ix->gram[0], starts, max_starts, count_all, &m);
    if (!count_all) m.total = -1;
    return m;
}

int64_t lk_live_continuation(const lk_live *ix, int64_t start, int64_t depth, int periodic, int32_t *out) {
    const int64_t L = ix->n;
    if (start <= 0 || start >= L || depth <= 0) return 0;
    int64_t j = 0;
    for (; j < depth && start + j < L; j++) out[j] = ix->tok[start + j];
    if (!periodic) return j;
    const int64_t period = L - start;
    for (; j < depth; j++) out[j] = out[j - period];  /* position start + j repeats start + j - period */
    return j;
}

/* Trie scratch layout inside work (each k * depth int32): token, parent, count,
 * first child, next sibling, rank order. */
int64_t lk_live_trie(const lk_live *ix, const int64_t *starts, int64_t k, int64_t depth, int64_t width,
                     int32_t *work, int32_t *out_tok, int32_t *out_parent, int32_t *out_count) {
    if (k <= 0 || depth <= 0 || width <= 0) return 0;
    const int64_t cap = k * depth;
    int32_t *tk = work, *par = work + cap, *cnt = work + 2 * cap, *child = work + 3 * cap;
    int32_t *sib = work + 4 * cap, *order = work + 5 * cap, *cont = work + 6 * cap;
    int32_t root_child = -1;
    int64_t size = 0;
    for (int64_t o = 0; o < k; o++) {
        int64_t len = lk_live_continuation(ix, starts[o], depth, 1, cont);
        int32_t node = -1;
        for (int64_t j = 0; j < len; j++) {
            int32_t c = node < 0 ? root_child : child[node];
            int32_t last = -1;
            while (c >= 0 && tk[c] != cont[j]) {
                last = c;
                c = sib[c];
            }
            if (c < 0) {
                c = (int32_t)size++;
                tk[c] = cont[j];
                par[c] = node;
                cnt[c] = 0;
                child[c] = -1;
                sib[c] = -1;
                if (last >= 0) sib[last] = c;
                else if (node < 0) root_child = c;
                else child[node] = c;
            }
            cnt[c]++;
            node = c;
        }
    }
    /* Rank: count desc, depth asc, insertion order asc. A child never outranks its
     * parent (its count is at most the parent's and it is deeper), so any prefix of
     * the ranking is a tree. Depths reuse the sibling slots (no longer needed). */
    int32_t *dep = sib;
    for (int64_t i = 0; i < size; i++) dep[i] = par[i] < 0 ? 1 : dep[par[i]] + 1;
    for (int64_t i = 0; i < size; i++) order[i] = (int32_t)i;
    for (int64_t i = 1; i < size; i++) {  /* insertion sort: at most a few hundred nodes */
        int32_t x = order[i];
        int64_t j = i - 1;
        while (j >= 0) {
            int32_t y = order[j];
            int worse = cnt[y] < cnt[x] || (cnt[y] == cnt[x] && (dep[y] > dep[x] || (dep[y] == dep[x] && y > x)));
            if (!worse) break;
            order[j + 1] = y;
            j--;
        }
        order[j + 1] = x;
    }
    int64_t m = width < size ? width : size;
    /* Keep the m best, emitted in insertion order: mark them, then renumber. */
    int32_t *newid = child;
    for (int64_t i = 0; i < size; i++) newid[i] = -1;
    for (int64_t r = 0; r < m; r++) newid[order[r]] = 0;
    int64_t w = 0;
    for (int64_t i = 0; i < size; i++) {
        if (newid[i] < 0) continue;
        newid[i] = (int32_t)w;
        out_tok[w] = tk[i];
        out_parent[w] = par[i] < 0 ? -1 : newid[par[i]];
        out_count[w] = cnt[i];
        w++;
    }
    return w;
}
