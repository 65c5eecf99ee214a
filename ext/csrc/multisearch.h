/* The longest-match search of every shard at once, interleaved (included by
 * lookup.c after lookup_impl.h).
 *
 * Each shard runs exactly the probes of lk_match (lookup_impl.h): a binary
 * search over lengths whose every step is FN(range) — the main bisection,
 * then the lower- and upper-bound bisections once a suffix equals the
 * pattern. Here that sequence is a small state machine per shard, and the
 * shards take turns one probe each: a round first prefetches every shard's
 * suffix-array entry, then every shard's text at that entry, then compares.
 * The memory reads of different shards (each a likely cache and TLB miss in a
 * multi-GB index) are then in flight together instead of one after another.
 * Same probes, same comparisons: the per-shard result is lk_match's, on
 * damaged arrays too. The first probes of each length's main bisection are
 * the same for every lookup; a shard with a top-of-tree cache (lk_shard.top)
 * takes them from it without touching the memory maps. */

enum { MS_DONE = 0, MS_MAIN = 1, MS_LOWER = 2, MS_UPPER = 3 };

/* One shard's search in progress. */
typedef struct {
    int phase;                 /* MS_*: which bisection the next probe belongs to */
    int64_t a, b;              /* length bisection: length a occurs (or min_n - 1), b does not (or maxl + 1) */
    int64_t m;                 /* the length being searched: pattern ctx[clen - m .. clen) */
    int64_t blo, bhi;          /* SA range of length a */
    int64_t lo, hi, llcp, rlcp, mid;  /* the main bisection of FN(range) */
    int64_t la, lb, al;        /* its lower-bound bisection */
    int64_t uc, ue, el;        /* its upper-bound bisection */
    int64_t probe;             /* SA index the next comparison reads */
    int64_t dstart;            /* tokens known equal before that comparison (the lcp skip) */
    int64_t s;                 /* sa[probe], once read */
    int64_t node;              /* heap index of the main bisection's probe in the shard's
                                  top-of-tree cache; -1 once past it (or none) */
    int has_top;               /* 1 when the shard has a top-of-tree cache */
} lk_msearch;

/* FN(extend) for the suffix at a top-of-tree node: the same d and sign,
 * reading the cached tokens first and the text only beyond them. */
static inline int64_t ms_extend_top(const lk_top_node *t, const int32_t *T, int64_t n, const int32_t *P,
                                    int64_t L, int64_t d, int *sign) {
    if (t->cnt < 0) {
        *sign = -1;
        return 0;
    }
    int64_t s = t->s;
#define MS_TOK(i) ((i) < t->cnt ? t->tok[(i)] : T[s + (i)])
    while (d < L && s + d < n && MS_TOK(d) == P[d]) ++d;
    if (d == L) *sign = 0;
    else if (s + d >= n || MS_TOK(d) < P[d]) *sign = -1;
    else *sign = 1;
#undef MS_TOK
    return d;
}

static inline int64_t ms_sa(const lk_shard *sh, int64_t i) {
    return sh->wide ? ((const int64_t *)sh->sa)[i] : (int64_t)((const int32_t *)sh->sa)[i];
}

static inline const void *ms_sa_addr(const lk_shard *sh, int64_t i) {
    return sh->wide ? (const void *)((const int64_t *)sh->sa + i) : (const void *)((const int32_t *)sh->sa + i);
}

/* Starts the next length of the bisection (lk_match's loop), or ends it. */
static inline void ms_begin_length(lk_msearch *st, int64_t n) {
    if (st->b - st->a > 1) {
        st->m = st->a + ((st->b - st->a) >> 1);
        st->phase = MS_MAIN;
        st->lo = 0;
        st->hi = n;
        st->llcp = st->rlcp = 0;
        st->node = st->has_top ? 0 : -1;
    } else {
        st->phase = MS_DONE;
    }
}

/* Advances st through the steps that read nothing until it needs a probe
 * (st->probe, st->dstart set) or is done. n: the shard's length. */
static void ms_next(lk_msearch *st, int64_t n) {
    for (;;) {
        switch (st->phase) {
        case MS_MAIN:
            if (st->lo < st->hi) {
                st->mid = st->lo + ((st->hi - st->lo) >> 1);
                st->probe = st->mid;
                st->dstart = st->llcp < st->rlcp ? st->llcp : st->rlcp;
                return;
            }
            st->b = st->m;  /* FN(range) found nothing: length m does not occur */
            ms_begin_length(st, n);
            break;
        case MS_LOWER:
            if (st->la < st->lb) {
                st->probe = st->la + ((st->lb - st->la) >> 1);
                st->dstart = st->al;
                return;
            }
            st->phase = MS_UPPER;  /* upper bound in [mid + 1, hi) */
            st->uc = st->mid + 1;
            st->ue = st->hi;
            st->el = st->rlcp;
            break;
        case MS_UPPER:
            if (st->uc < st->ue) {
                st->probe = st->uc + ((st->ue - st->uc) >> 1);
                st->dstart = st->el;
                return;
            }
            st->a = st->m;  /* length m occurs at [la, uc) */
            st->blo = st->la;
            st->bhi = st->uc;
            ms_begin_length(st, n);
            break;
        default:
            return;
        }
    }
}

/* The outcome of comparing suffix st->s with the pattern: d tokens equal, sign. */
static inline void ms_step(lk_msearch *st, int64_t d, int sign, int64_t top_nodes) {
    switch (st->phase) {
    case MS_MAIN:
        if (sign < 0) { st->lo = st->mid + 1; st->llcp = d; }
        else if (sign > 0) { st->hi = st->mid; st->rlcp = d; }
        if (st->node >= 0) {  /* the child the bisection went to, while inside the cache */
            st->node = sign < 0 ? 2 * st->node + 2 : 2 * st->node + 1;
            if (st->node >= top_nodes) st->node = -1;
        }
        if (sign == 0) {  /* lower bound in [lo, mid]: probes no longer on the cached path */
            st->node = -1;
            st->phase = MS_LOWER;
            st->la = st->lo;
            st->lb = st->mid;
            st->al = st->llcp;
        }
        break;
    case MS_LOWER:
        if (sign < 0) { st->la = st->probe + 1; st->al = d; } else { st->lb = st->probe; }
        break;
    case MS_UPPER:
        if (sign == 0) { st->uc = st->probe + 1; } else { st->ue = st->probe; st->el = d; }
        break;
    default:
        break;
    }
}

/* Every shard's lk_match(ctx, clen, max_n, min_n), interleaved: len[i] (0 when
 * none), lo[i], hi[i] for shard i. ctx holds no value below LK_SEP (checked by
 * the caller). st and act hold n_shards entries of scratch. */
static void lk_match_all(const lk_shard *shards, int64_t n_shards, const int32_t *ctx, int64_t clen,
                         int64_t max_n, int64_t min_n, lk_msearch *st, int64_t *act, int64_t *len,
                         int64_t *lo, int64_t *hi) {
    int64_t start = 0, i, k, nact = 0;
    for (i = clen - 1; i >= 0; --i) {
        if (ctx[i] == LK_SEP) { start = i + 1; break; }
    }
    int64_t usable = clen - start;
    int64_t maxl = max_n < usable ? max_n : usable;
    if (min_n < 1) min_n = 1;
    for (i = 0; i < n_shards; ++i) {
        len[i] = lo[i] = hi[i] = 0;
        if (shards[i].n <= 0 || maxl < min_n) continue;
        lk_msearch *s = &st[i];
        s->a = min_n - 1;
        s->b = maxl + 1;
        s->blo = s->bhi = 0;
        s->has_top = shards[i].top != NULL;
        ms_begin_length(s, shards[i].n);
        ms_next(s, shards[i].n);
        if (s->phase != MS_DONE) act[nact++] = i;
    }
    while (nact > 0) {
        for (k = 0; k < nact; ++k) {
            if (st[act[k]].node < 0) __builtin_prefetch(ms_sa_addr(&shards[act[k]], st[act[k]].probe));
        }
        for (k = 0; k < nact; ++k) {
            const lk_shard *sh = &shards[act[k]];
            lk_msearch *s = &st[act[k]];
            if (s->node >= 0) continue;  /* this probe is in the top-of-tree cache */
            s->s = ms_sa(sh, s->probe);
            if (s->s >= 0 && s->s < sh->n) {
                int64_t at = s->s + s->dstart;
                __builtin_prefetch(sh->tokens + (at < sh->n ? at : s->s));
            }
        }
        for (k = 0; k < nact;) {
            const lk_shard *sh = &shards[act[k]];
            lk_msearch *s = &st[act[k]];
            int sign;
            int64_t d;
            if (s->node >= 0) {
                d = ms_extend_top(&sh->top[s->node], sh->tokens, sh->n, ctx + clen - s->m, s->m, s->dstart, &sign);
                s->s = sh->top[s->node].s;
            } else {
                d = lk_i32_extend(sh->tokens, sh->n, s->s, ctx + clen - s->m, s->m, s->dstart, &sign);
            }
            ms_step(s, d, sign, sh->top ? ((int64_t)1 << sh->top_levels) - 1 : 0);
            ms_next(s, sh->n);
            if (s->phase == MS_DONE) act[k] = act[--nact];  /* order of the rest is irrelevant */
            else ++k;
        }
    }
    for (i = 0; i < n_shards; ++i) {
        if (shards[i].n <= 0 || maxl < min_n) continue;
        if (st[i].a >= min_n) {
            len[i] = st[i].a;
            lo[i] = st[i].blo;
            hi[i] = st[i].bhi;
        }
    }
}
