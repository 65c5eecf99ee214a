/* match() and ContinuationTrie.add() over one suffix-array position type,
 * instantiated by lookup.c. Define SX (int32_t or int64_t) and FN(name). */

/* Extends the common prefix of suffix s and pattern P[0..L) from d. Sets
 * *sign to 0 when all L tokens match, -1 when the suffix sorts before P (a
 * smaller token, or the text ends), +1 otherwise. Returns the prefix length.
 * A suffix-array value outside [0, n) (a damaged file) reads as an empty
 * suffix: the search stays inside T and its answer is merely wrong. */
static inline int64_t FN(extend)(const int32_t *T, int64_t n, int64_t s, const int32_t *P,
                                 int64_t L, int64_t d, int *sign) {
    if (s < 0 || s >= n) {
        *sign = -1;
        return 0;
    }
    while (d < L && s + d < n && T[s + d] == P[d]) ++d;
    if (d == L) *sign = 0;
    else if (s + d >= n || T[s + d] < P[d]) *sign = -1;  /* >=: a damaged lcp skip may pass the end */
    else *sign = 1;
    return d;
}

/* Prefetches sa[] at the two probes a binary search over [lo, hi) may make
 * after probing mid: the middle of [lo, mid) and of [mid + 1, hi). Both
 * indexes lie inside [lo, hi), so inside sa[0..n). */
static inline void FN(prefetch_next)(const SX *sa, int64_t lo, int64_t mid, int64_t hi) {
    if (mid > lo) __builtin_prefetch(sa + lo + ((mid - lo) >> 1));
    if (hi > mid + 1) __builtin_prefetch(sa + mid + 1 + ((hi - mid - 1) >> 1));
}

/* SA range [*rlo, *rhi) of the suffixes starting with P[0..L); returns 0 when
 * empty. Binary search with the Manber-Myers min(lcp_left, lcp_right) skip. */
static int FN(range)(const int32_t *T, int64_t n, const SX *sa, const int32_t *P, int64_t L,
                     int64_t *rlo, int64_t *rhi) {
    int64_t lo = 0, hi = n, llcp = 0, rlcp = 0, d, mid;
    int sign;
    while (lo < hi) {
        mid = lo + ((hi - lo) >> 1);
        /* Both possible next probes' suffix-array entries are fetched while
         * this probe's text is read: the two misses overlap instead of
         * following each other. Prefetches change no result. */
        FN(prefetch_next)(sa, lo, mid, hi);
        d = FN(extend)(T, n, (int64_t)sa[mid], P, L, llcp < rlcp ? llcp : rlcp, &sign);
        if (sign < 0) { lo = mid + 1; llcp = d; }
        else if (sign > 0) { hi = mid; rlcp = d; }
        else {
            /* lower bound in [lo, mid]: entries there are < P or == P */
            int64_t a = lo, b = mid, al = llcp;
            while (a < b) {
                int64_t md = a + ((b - a) >> 1);
                FN(prefetch_next)(sa, a, md, b);
                int64_t dd = FN(extend)(T, n, (int64_t)sa[md], P, L, al, &sign);
                if (sign < 0) { a = md + 1; al = dd; } else { b = md; }
            }
            /* upper bound in [mid + 1, hi): entries there are == P or > P */
            int64_t c = mid + 1, e = hi, el = rlcp;
            while (c < e) {
                int64_t md = c + ((e - c) >> 1);
                FN(prefetch_next)(sa, c, md, e);
                int64_t dd = FN(extend)(T, n, (int64_t)sa[md], P, L, el, &sign);
                if (sign == 0) { c = md + 1; } else { e = md; el = dd; }
            }
            *rlo = a;
            *rhi = c;
            return 1;
        }
    }
    return 0;
}

static int64_t FN(match)(const int32_t *T, int64_t n, const SX *sa, const int32_t *ctx,
                         int64_t clen, int64_t max_n, int64_t min_n, int64_t *lo, int64_t *hi) {
    int64_t start = 0, i, a, b, blo = 0, bhi = 0;
    *lo = *hi = 0;
    for (i = clen - 1; i >= 0; --i) {
        if (ctx[i] < LK_SEP) { *lo = i; return LK_EBADTOKEN; }
        if (ctx[i] == LK_SEP && start == 0) start = i + 1;
    }
    int64_t usable = clen - start;
    int64_t maxl = max_n < usable ? max_n : usable;
    if (min_n < 1) min_n = 1;
    if (n <= 0 || maxl < min_n) return 0;
    /* invariant: length a occurs (or a == min_n - 1), length b does not (or b == maxl + 1) */
    a = min_n - 1;
    b = maxl + 1;
    while (b - a > 1) {
        int64_t mid = a + ((b - a) >> 1), rl, rh;
        if (FN(range)(T, n, sa, ctx + clen - mid, mid, &rl, &rh)) { a = mid; blo = rl; bhi = rh; }
        else b = mid;
    }
    if (a < min_n) return 0;
    *lo = blo;
    *hi = bhi;
    return a;
}

static int64_t FN(add)(lk_trie *t, const int32_t *T, int64_t n, const SX *sa, int64_t lo,
                       int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth) {
    int64_t cnt = hi - lo, K, i;
    if (cnt <= 0 || max_occ <= 0) return 0;
    K = cnt < max_occ ? cnt : max_occ;
    if (depth <= 0) return K;
    if (depth > t->capacity || K > (t->capacity - t->size) / depth) return LK_ECAPACITY;
    int fresh = t->size == 0;
    if (!fresh) lk_trie_index_(t);
    /* path of the previous continuation: sampled entries are in SA order, so
     * continuations arrive sorted and share a prefix with their predecessor */
    int32_t *path_node = (int32_t *)t->scratch;
    int32_t *path_tok = path_node + depth;
    int64_t plen = 0;
    const int64_t ahead = 8;
    for (i = 0; i < K; ++i) {
        if (i + ahead < K) {
            int64_t jn = lo + (int64_t)(((unsigned __int128)(i + ahead) * (uint64_t)cnt) / (uint64_t)K);
            int64_t sn = (int64_t)sa[jn];
            if (sn >= 0 && sn < n) __builtin_prefetch(T + sn);
        }
        int64_t j = lo + (int64_t)(((unsigned __int128)i * (uint64_t)cnt) / (uint64_t)K);
        int64_t sj = (int64_t)sa[j], d = 0;
        /* A suffix-array value outside [0, n) (a damaged file) contributes nothing. */
        int64_t s = sj >= 0 && sj < n ? sj + match_len : n;
        int64_t lim = s >= n ? 0 : (n - s < depth ? n - s : depth);
        for (; d < lim; ++d) {
            int32_t c = T[s + d];
            if (c < 0) break;  /* the separator, or a damaged (negative) token, ends a read */
            int32_t node;
            if (d < plen && path_tok[d] == c) {
                node = path_node[d];
            } else {
                int32_t par = d == 0 ? -1 : path_node[d - 1];
                node = fresh ? lk_trie_new_(t, par, c, (int32_t)(d + 1)) : lk_trie_find_or_new_(t, par, c, (int32_t)(d + 1));
                path_node[d] = node;
                path_tok[d] = c;
                plen = d + 1;
            }
            t->count[node] += 1;
        }
        plen = d;
    }
    return K;
}
