/* SA-IS body, instantiated by sais.c once per (text type, position type).
 *
 * Before including, define:
 *   TX          text symbol type (int32_t or int64_t)
 *   SX          position type (int32_t or int64_t); every text symbol fits in SX
 *   FN(name)    mangles a function name for this instantiation
 *   RECURSE     the (SX, SX) instantiation of FN(main), used for the reduced text
 *
 * Conventions (after Nong, Zhang & Chan 2009 and Mori's sais-lite):
 *   - symbols lie in [cmin, k); cmin is -1 when the text holds LK_SEP, and the
 *     bucket arrays are passed shifted so that B[c] is valid for c in [cmin, k);
 *   - the text ends in a virtual sentinel, smaller than every symbol, which is
 *     never stored: suffix n-1 is therefore always L-type;
 *   - no type array: during induction an entry is stored negated (~j) when its
 *     predecessor must NOT be induced by the current pass, which is decided
 *     from T[j-1] against T[j] when j is written (both are in cache then).
 */

/* The (SX, SX) instantiation sorts reduced texts (defined in this one or an earlier one). */
static int RECURSE(const SX *T, SX *SA, SX fs, SX n, SX cmin, SX k, int flags);

#include "sais_induce.h"  /* bounds, induce, induce_marked */

/* The LMS position after LMS position p, or n when there is none (so that
 * end - p + 1, the length of p's LMS substring, counts the sentinel for the
 * last one). Read forward from p: past the rising part (up to the first
 * strict descent), then through the falling part to its first strict
 * ascent; the next LMS position is the start of the run of equal symbols
 * that ascends (its predecessor is greater, hence L-type). */
static inline SX FN(lms_end)(const TX *T, SX n, SX p) {
    SX x = p, r;
    while (x + 1 < n && T[x] <= T[x + 1]) ++x;
    if (x + 1 >= n) return n;
    for (r = ++x; x + 1 < n; ++x) {
        if (T[x] < T[x + 1]) return r;
        if (T[x] > T[x + 1]) r = x + 1;
    }
    return n;
}

/* Finds the group starts of the sorted LMS substrings SA[0..m) by comparing
 * each with its predecessor (lengths from lms_end): starts[i] = 1
 * when LMS substring SA[i] differs from SA[i-1] (always for i = 0). */
static void FN(compare_starts)(const TX *T, const SX *SA, SX n, SX m, uint8_t *starts) {
    SX i, p, q = -1, plen, qlen = 0, d;
    for (i = 0; i < m; ++i) {
        if (i + LK_PF < m) __builtin_prefetch(T + SA[i + LK_PF]);
        p = SA[i];
        plen = FN(lms_end)(T, n, p) - p + 1;
        int diff = 1;
        if (plen == qlen && p + plen <= n && q + qlen <= n) {
            for (d = 0; d < plen && T[p + d] == T[q + d]; ++d) {}
            diff = d < plen;
        }
        starts[i] = (uint8_t)diff;
        q = p;
        qlen = plen;
    }
}

/* Names the sorted LMS substrings SA[0..m) from their group starts
 * (starts[i], i < m): names are 1-based in sorted order; the slot
 * SA[m + p/2] of LMS position p gets its name, negated when the name is
 * unique (its group has one member: its start bit is followed by another
 * start or the end), and the list entries of shared names are negated (~p),
 * the groups the recursion has to order. Slots SA[m..) must be zero.
 * Returns the number of names. */
static SX FN(write_names)(SX *SA, SX m, const uint8_t *starts) {
    SX i, p, name = 0;
    for (i = 0; i < m; ++i) {
        if (i + LK_PF < m) __builtin_prefetch(SA + m + (SA[i + LK_PF] >> 1), 1);
        p = SA[i];
        name += starts[i];
        int unique = starts[i] && (i + 1 == m || starts[i + 1]);
        SA[m + (p >> 1)] = unique ? -name : name;
        if (!unique) SA[i] = ~p;
    }
    return name;
}

/* Sorts the LMS suffixes whose LMS substring is not unique, without
 * recursing on the whole reduced text (after libsais' idea of sorting only
 * the non-unique LMS suffixes). In the reduced text R, two suffixes that start
 * with the same name are decided at the latest at the first unique name after
 * them (a unique name occurs once, so it differs from whatever stands at the
 * same offset of the other suffix). So R can be cut to the maximal runs of
 * non-unique names, each followed by its terminating unique name (when the
 * run does not reach the end): a text R' of n' <= m symbols whose suffixes
 * starting at non-unique names sort exactly as in R. R' is renamed densely
 * (order-preserving), sorted recursively, and its sorted non-unique suffixes
 * replace, in order, the negated (non-unique) entries of the sorted list.
 *
 * In: SA[0..m) the LMS positions sorted by LMS substring, non-unique ones
 * negated; slots SA[m + p/2] hold the signed name of LMS position p
 * (negative = unique), 0 elsewhere. Out: SA[0..m) the sorted LMS suffixes.
 * Returns LK_OK, LK_ENOMEM, or LK_SAIS_DECLINED (nothing changed) when it
 * would not pay or the layout [list m][SA' n' | free][R' n'][map n'] would
 * overlap the slots while R' is written. */
static int FN(sort_nonunique)(const TX *T, SX *SA, SX n, SX m, SX usable, SX names, int flags) {
    SX *slot = SA + m;
    const SX nslots = ((n - 1) >> 1) + 1;
    SX i, t, kept = 0;
    LK_TIC();

    /* Kept names (text order): shared ones, and unique ones right after a
     * shared one; marked in a bitmap over the names 1..names, for a dense
     * order-preserving renaming (set bits counted before each word). */
    SX words = (names >> 6) + 1;
    uint64_t *bits = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
    SX *before = (SX *)malloc((size_t)words * sizeof(SX));
    if (bits == NULL || before == NULL) { free(bits); free(before); return LK_ENOMEM; }
    {
        int prev_shared = 0;
        for (i = 0; i < nslots; ++i) {
            SX v = slot[i];
            if (v != 0) {
                if (v > 0 || prev_shared) {
                    SX a = v < 0 ? -v : v;
                    bits[a >> 6] |= (uint64_t)1 << (a & 63);
                    ++kept;
                }
                prev_shared = v > 0;
            }
        }
    }
    if (kept > m - m / 8 || 2 * kept > usable - m - nslots) {
        free(bits); free(before);
        return LK_SAIS_DECLINED;
    }
    SX k2 = 0;
    for (i = 0; i < words; ++i) { before[i] = k2; k2 += (SX)__builtin_popcountll(bits[i]); }

    /* Right to left over the slots: map[w] = LMS position of kept symbol w,
     * negated (~p) when shared; R'[w] = its dense name. A symbol is decided
     * once its left neighbour is seen. Slot s holds position 2s or 2s+1, and
     * it is 2s+1 exactly when T[2s] > T[2s+1] (an LMS position is S-type
     * and follows an L-type one, so only one of the two can be LMS). */
    SX *map = SA + usable - kept, *R2 = map - kept;
    {
        SX w = kept, pv = 0, pp = 0;
#define LK_EMIT(v, p) do {                                                         \
            SX a_ = (v) < 0 ? -(v) : (v);                                          \
            --w;                                                                   \
            R2[w] = before[a_ >> 6] +                                              \
                (SX)__builtin_popcountll(bits[a_ >> 6] & (((uint64_t)1 << (a_ & 63)) - 1)); \
            map[w] = (v) > 0 ? ~(p) : (p);                                         \
        } while (0)
        for (i = nslots - 1; i >= 0; --i) {
            SX v = slot[i];
            if (v == 0) continue;
            SX p0 = 2 * i;
            SX p = (p0 + 1 < n && (SX)T[p0] > (SX)T[p0 + 1]) ? p0 + 1 : p0;
            if (pv != 0 && (pv > 0 || v > 0)) LK_EMIT(pv, pp);
            pv = v;
            pp = p;
        }
        if (pv > 0) LK_EMIT(pv, pp);
#undef LK_EMIT
    }
    free(bits);
    free(before);
    LK_TOC("cut");
    SX *SA2 = SA + m;
    int rc = RECURSE(R2, SA2, usable - m - 3 * kept, kept, 0, k2, flags);
    if (rc != LK_OK) return rc;
    LK_TOC("cut-recurse");

    /* Sorted non-unique LMS suffixes, in order, compacted to SA2[0..nu). */
    SX nu = 0;
    for (i = 0; i < kept; ++i) {
        if (i + LK_PF < kept) __builtin_prefetch(map + SA2[i + LK_PF]);
        SX v = map[SA2[i]];
        if (v < 0) SA2[nu++] = ~v;
    }
    /* They fill the non-unique entries of the sorted list, in order: a
     * group's entries are contiguous there and in SA2, groups in name order. */
    for (i = 0, t = 0; i < m; ++i) {
        if (SA[i] < 0) SA[i] = SA2[t++];
    }
    return LK_OK;
}

/* Suffix array of T[0..n) into SA[0..n). SA is followed by fs free slots
 * (SA[n..n+fs)) that may be used as scratch. */
static int FN(main)(const TX *T, SX *SA, SX fs, SX n, SX cmin, SX k, int flags) {
    SX i, j, m, p, c0, c1, name;
    int t0, t1;
    SX *Cmem = NULL, *Bmem = NULL, *C, *B, *D = NULL;
    uint8_t *mk = NULL, *starts;
    SX ksize = k - cmin, bsz = 0;  /* ksize: bucket count; bsz: slots of fs used for buckets */

    if (n <= 0) return LK_OK;
    if (n == 1) { SA[0] = 0; return LK_OK; }
    LK_TIC();

    /* Bucket arrays: in the free tail of SA when they fit, else malloc'd.
     * C (counts) is optional: without it the counts are recomputed per use. */
    if (fs >= 2 * ksize) {
        bsz = 2 * ksize;
        C = SA + n + fs - bsz - cmin;
        B = C + ksize;
    } else if (fs >= ksize) {
        bsz = ksize;
        B = SA + n + fs - bsz - cmin;
        C = NULL;
    } else {
        Bmem = (SX *)malloc((size_t)ksize * sizeof(SX));
        if (Bmem == NULL) return LK_ENOMEM;
        B = Bmem - cmin;
        /* counts are worth their memory only when the alphabet is small */
        if (ksize <= n / 4 || ksize <= 65536) Cmem = (SX *)malloc((size_t)ksize * sizeof(SX));
        C = Cmem ? Cmem - cmin : NULL;
    }
    if (C != NULL) {
        for (c0 = cmin; c0 < k; ++c0) C[c0] = 0;
        for (i = 0; i < n; ++i) ++C[T[i]];
    }

    /* Naming during induction (induce_marked) needs a mark bitmap over SA
     * (n bits) and one group id per bucket; small alphabets only, so that
     * the ids cost little. Otherwise (or without memory) the sorted LMS
     * substrings are compared instead. */
    if (!(flags & LK_SAIS_COMPARE_NAMES) && (ksize <= 65536 || ksize <= n / 16)) {
        mk = (uint8_t *)calloc((size_t)n, 1);
        D = (SX *)malloc((size_t)ksize * sizeof(SX));
        if (mk == NULL || D == NULL) { free(mk); free(D); mk = NULL; D = NULL; }
        else D -= cmin;
    }

    /* Stage 1: seed LMS positions at bucket ends (in text order), induce. */
    FN(bounds)(T, n, C, B, cmin, k, 1);
    if (D != NULL) for (c0 = cmin; c0 < k; ++c0) D[c0] = B[c0];
    for (i = 0; i < n; ++i) SA[i] = 0;
    m = 0;
    c1 = (SX)T[n - 1];
    t1 = 0; /* type of i+1: 1 = S, 0 = L; suffix n-1 is L (virtual sentinel) */
    for (i = n - 2; i >= 0; --i) {
        if (ksize > 65536 && i >= LK_PF) __builtin_prefetch(B + T[i - LK_PF], 1);  /* B beyond cache */
        c0 = (SX)T[i];
        t0 = (c0 < c1) || (c0 == c1 && t1);
        if (!t0 && t1) { SA[--B[c1]] = i + 1; ++m; }
        c1 = c0;
        t1 = t0;
    }
    if (D != NULL) {
        /* the seeds of a bucket share their LMS prefix (one S-type symbol):
         * mark the first of each bucket's seeds */
        for (c0 = cmin; c0 < k; ++c0) {
            if (B[c0] != D[c0]) mk[B[c0]] = 1;
        }
    }
    LK_TOC("seed");
    if (m > 0) {
        if (D != NULL) {
            FN(induce_marked)(T, SA, n, C, B, D, mk, cmin, k);
            free(D + cmin);
            D = NULL;
        } else {
            FN(induce)(T, SA, n, C, B, cmin, k, 1);
        }
        LK_TOC("induce1");

        /* Sorted LMS positions (left negated by induce) -> SA[0..m). With
         * marks, mk[j] := whether the j-th LMS substring starts a new group
         * (a mark after the previous LMS entry, up to its own); mk[j],
         * j <= i, is written only after mk[i] was read. */
        if (mk != NULL) {
            int pending = 1;
            for (i = 0, j = 0; i < n; ++i) {
                pending |= mk[i];
                p = SA[i];
                if (i >= m) SA[i] = 0;  /* the name slots, zeroed on the way */
                if (p < 0) {
                    mk[j] = (uint8_t)pending;
                    pending = 0;
                    SA[j++] = ~p;
                }
            }
            starts = mk;
        } else {
            for (i = 0, j = 0; i < n; ++i) {
                p = SA[i];
                if (p < 0) SA[j++] = ~p;
            }
            starts = (uint8_t *)malloc((size_t)m);
            if (starts == NULL) { free(Bmem); free(Cmem); return LK_ENOMEM; }
            FN(compare_starts)(T, SA, n, m, starts);
        }
        LK_TOC("gather");
        if (starts != mk) {
            for (i = m; i < n; ++i) SA[i] = 0;  /* the name slots SA[m + p/2] */
        }
        name = FN(write_names)(SA, m, starts);
        free(starts);
        mk = NULL;
        LK_TOC("name");
        if (name < m) {
            SX usable = n + fs - bsz;          /* SA[0..usable) is ours */
            SX *RA = SA + usable - m;
            int rc = FN(sort_nonunique)(T, SA, n, m, usable, name, flags);
            if (rc == LK_SAIS_DECLINED) {
                /* Recurse on the whole reduced text RA (names - 1, text
                 * order, at the end of the usable space), with SA[0..m) as
                 * its suffix array. */
                j = m - 1;
                for (i = m + ((n - 1) >> 1); i >= m; --i) {
                    if (SA[i] != 0) RA[j--] = (SA[i] < 0 ? -SA[i] : SA[i]) - 1;
                }
                rc = RECURSE(RA, SA, usable - 2 * m, m, 0, name, flags);
                if (rc != LK_OK) { free(Bmem); free(Cmem); return rc; }
                LK_TOC("recurse");
                /* RA := LMS positions in text order; SA[0..m) := sorted LMS positions. */
                j = m - 1;
                c1 = (SX)T[n - 1];
                t1 = 0;
                for (i = n - 2; i >= 0; --i) {
                    c0 = (SX)T[i];
                    t0 = (c0 < c1) || (c0 == c1 && t1);
                    if (!t0 && t1) RA[j--] = i + 1;
                    c1 = c0;
                    t1 = t0;
                }
                for (i = 0; i < m; ++i) SA[i] = RA[SA[i]];
            } else if (rc != LK_OK) {
                free(Bmem); free(Cmem); return rc;
            }
            LK_TOC("reduced");
        }
        /* else: every LMS substring is unique, SA[0..m) is already sorted. */

        /* Stage 3: sorted LMS suffixes at bucket ends (keeping their order). */
        FN(bounds)(T, n, C, B, cmin, k, 1);
        for (i = m; i < n; ++i) SA[i] = 0;
        for (i = m - 1; i >= 0; --i) {
            if (i >= LK_PF) __builtin_prefetch(T + SA[i - LK_PF]);  /* random text reads */
            j = SA[i];
            SA[i] = 0;
            SA[--B[(SX)T[j]]] = j;
        }
    }
    free(mk);
    if (D != NULL) free(D + cmin);
    LK_TOC("place");
    FN(induce)(T, SA, n, C, B, cmin, k, 0);
    LK_TOC("induce3");
    free(Bmem);
    free(Cmem);
    return LK_OK;
}
