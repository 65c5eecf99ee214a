/* SA-IS's bucket bounds and induced sorting, instantiated with sais_impl.h (which includes this
 * file once per (text type, position type), with TX, SX and FN defined as it says). */

/* Bucket bounds: start (end == 0) or one past the end (end == 1) of every
 * symbol's bucket. With C == NULL the counts are recomputed into B. */
static void FN(bounds)(const TX *T, SX n, const SX *C, SX *B, SX cmin, SX k, int end) {
    SX c, sum = 0;
    if (C == NULL) {
        for (c = cmin; c < k; ++c) B[c] = 0;
        for (SX i = 0; i < n; ++i) ++B[T[i]];
        C = B;
    }
    if (end) {
        for (c = cmin; c < k; ++c) { sum += C[c]; B[c] = sum; }
    } else {
        for (c = cmin; c < k; ++c) { SX t = C[c]; B[c] = sum; sum += t; }
    }
}

/* Prefetch distance (entries) for the random text reads of induction: far
 * enough to hide a memory miss, near enough that the target is still cached. */
#ifndef LK_PF
#define LK_PF 48
#endif

/* Prefetch for an induction pass: the text before the entry LK_PF slots ahead
 * (far) and, half-way (near: that text is cached by now), the bucket pointer it
 * will update (only when the bucket array is too big to stay cached). */
static inline void FN(ahead)(const TX *T, const SX *SA, const SX *B, SX far, SX near, int big) {
    SX jp = SA[far];
    if (jp > 0) __builtin_prefetch(T + jp - 1);
    jp = SA[near];
    if (big && jp > 0) __builtin_prefetch(B + T[jp - 1], 1);
}

/* Induces L-type suffixes (left-to-right) then S-type suffixes (right-to-left)
 * from the seeds in SA (positive values at bucket ends, empty slots 0).
 * lms_only (stage 1): entries no longer needed are cleared to 0, and each LMS
 * suffix is left negated (~p) at its place, all other slots end up 0, so the
 * sorted LMS positions can be gathered by one sequential pass. Otherwise
 * (stage 3) SA ends up holding the suffix array. */
static void FN(induce)(const TX *T, SX *SA, SX n, const SX *C, SX *B, SX cmin, SX k, int lms_only) {
    SX i, j, c0, c1, *b;
    const int big = k - cmin > 65536;  /* bucket array beyond cache: prefetch it too */
    FN(bounds)(T, n, C, B, cmin, k, 0);
    j = n - 1;
    c1 = (SX)T[j];
    b = SA + B[c1];
    *b++ = (j > 0 && (SX)T[j - 1] < c1) ? ~j : j;
    for (i = 0; i < n; ++i) {
        if (i + LK_PF < n) FN(ahead)(T, SA, B, i + LK_PF, i + LK_PF / 2, big);
        j = SA[i];
        if (j > 0) {
            SA[i] = lms_only ? 0 : ~j;
            --j;
            c0 = (SX)T[j];
            if (c0 != c1) { B[c1] = (SX)(b - SA); c1 = c0; b = SA + B[c1]; }
            *b++ = (j > 0 && (SX)T[j - 1] < c1) ? ~j : j;
        } else {
            SA[i] = (lms_only && j == 0) ? 0 : ~j;
        }
    }
    FN(bounds)(T, n, C, B, cmin, k, 1);
    c1 = cmin;
    b = SA + B[c1];
    for (i = n - 1; i >= 0; --i) {
        if (i - LK_PF >= 0) FN(ahead)(T, SA, B, i - LK_PF, i - LK_PF / 2, big);
        j = SA[i];
        if (j > 0) {
            --j;
            c0 = (SX)T[j];
            if (c0 != c1) { B[c1] = (SX)(b - SA); c1 = c0; b = SA + B[c1]; }
            if (lms_only) {
                SA[i] = 0;
                /* j is LMS iff its predecessor is L-type: keep it negated */
                *--b = (j > 0 && (SX)T[j - 1] > c1) ? ~j : j;
            } else {
                *--b = (j == 0 || (SX)T[j - 1] > c1) ? ~j : j;
            }
        } else if (!lms_only) {
            SA[i] = ~j;
        }
    }
}

/* Stage-1 induction that also finds where the LMS-substring groups start
 * (after libsais' naming during induction): the same passes as induce with
 * lms_only, plus one byte `mk` per SA position (zeroed, with the first
 * seed of every bucket marked) in which mk[x] = 1 says that the entry at x
 * has a different LMS prefix (the text from it to the next LMS position,
 * inclusive) from the entry at x-1. A scan counts the marks it passes (d, a
 * group id); two suffixes induced one after the other into one bucket have
 * equal LMS prefixes iff their inducers do, i.e. iff d did not change
 * between the two inductions, which D[c] (the d of the last induction into
 * bucket c) tells. The L pass inserts left to right, so it marks the new
 * entry; the S pass inserts right to left, so it sets the mark of the entry
 * the new one lands next to; the leftmost S entry of each bucket, which
 * differs in type from its left neighbour, is marked before the S pass
 * (every other S slot is rewritten, so the seeds' marks do not last). Marks of cleared entries stay, so
 * the scans still see every boundary. The last pass leaves each LMS suffix
 * negated (~p), everything else 0, as induce does. */
static void FN(induce_marked)(const TX *T, SX *SA, SX n, const SX *C, SX *B, SX *D,
                              uint8_t *mk, SX cmin, SX k) {
    SX i, j, c0, c1, *b, d = 0, x;
    const int big = k - cmin > 65536;
    FN(bounds)(T, n, C, B, cmin, k, 0);
    for (c0 = cmin; c0 < k; ++c0) D[c0] = -1;
    j = n - 1;
    c1 = (SX)T[j];
    b = SA + B[c1];
    /* suffix n-1, induced by the virtual sentinel (group id 0) */
    mk[b - SA] = 1;
    D[c1] = 0;
    *b++ = (j > 0 && (SX)T[j - 1] < c1) ? ~j : j;
    for (i = 0; i < n; ++i) {
        if (i + LK_PF < n) FN(ahead)(T, SA, B, i + LK_PF, i + LK_PF / 2, big);
        d += mk[i];
        j = SA[i];
        if (j > 0) {
            SA[i] = 0;
            --j;
            c0 = (SX)T[j];
            if (c0 != c1) { B[c1] = (SX)(b - SA); c1 = c0; b = SA + B[c1]; }
            mk[b - SA] = D[c1] != d;  /* a fresh slot: plain store */
            D[c1] = d;
            *b++ = (j > 0 && (SX)T[j - 1] < c1) ? ~j : j;
        } else {
            SA[i] = j == 0 ? 0 : ~j;
        }
    }
    /* the leftmost S entry of a bucket (where the L pass stopped) differs
     * in type from its left neighbour: mark it before the S pass */
    B[c1] = (SX)(b - SA);
    for (c0 = cmin; c0 < k; ++c0) D[c0] = B[c0];
    FN(bounds)(T, n, C, B, cmin, k, 1);
    for (c0 = cmin; c0 < k; ++c0) {
        if (D[c0] < B[c0]) mk[D[c0]] = 1;
        D[c0] = -1;
    }
    c1 = cmin;
    b = SA + B[c1];
    for (i = n - 1; i >= 0; --i) {
        if (i - LK_PF >= 0) FN(ahead)(T, SA, B, i - LK_PF, i - LK_PF / 2, big);
        j = SA[i];
        if (j > 0) {
            --j;
            c0 = (SX)T[j];
            if (c0 != c1) { B[c1] = (SX)(b - SA); c1 = c0; b = SA + B[c1]; }
            SA[i] = 0;
            x = (SX)(b - SA);  /* the previous entry inserted into c1, if any */
            if (D[c1] >= 0) mk[x] = D[c1] != d;
            D[c1] = d;
            /* j is LMS iff its predecessor is L-type: keep it negated */
            *--b = (j > 0 && (SX)T[j - 1] > c1) ? ~j : j;
        }
        d += mk[i];
    }
}
