/* SA-IS instantiations and the public entry points (see sais.h). */
#include <stdlib.h>
#include <string.h>

#include "sais.h"

#ifdef LK_SAIS_TIMING  /* phase CPU timings on stderr, for tuning only */
#include <stdio.h>
#include <time.h>
static double lk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
#define LK_TIC() double lk_t0 = lk_now()
#define LK_TOC(what) do { double lk_t1 = lk_now(); fprintf(stderr, "n=%lld m=%lld %s %.3f\n", \
    (long long)n, (long long)m, what, lk_t1 - lk_t0); lk_t0 = lk_t1; } while (0)
#else
#define LK_TIC() do {} while (0)
#define LK_TOC(what) do {} while (0)
#endif

/* Internal status: a step declined to run (and changed nothing). */
#define LK_SAIS_DECLINED 1

/* Reduced texts: symbols and positions of the same width. */
#define TX int32_t
#define SX int32_t
#define FN(name) sais_i32_i32_##name
#define RECURSE sais_i32_i32_main
#include "sais_impl.h"
#undef TX
#undef SX
#undef FN
#undef RECURSE

#define TX int64_t
#define SX int64_t
#define FN(name) sais_i64_i64_##name
#define RECURSE sais_i64_i64_main
#include "sais_impl.h"
#undef TX
#undef SX
#undef FN
#undef RECURSE

/* int32 tokens, int64 positions: recursion happens on int64 reduced texts. */
#define TX int32_t
#define SX int64_t
#define FN(name) sais_i32_i64_##name
#define RECURSE sais_i64_i64_main
#include "sais_impl.h"
#undef TX
#undef SX
#undef FN
#undef RECURSE

/* 16-bit copies of the text (alphabets of at most 65,536 symbols): the same
 * algorithm over half the bytes, so the random text reads of induction hit
 * the caches more often; the reduced texts are int32/int64 as above. */
#define TX uint16_t
#define SX int32_t
#define FN(name) sais_u16_i32_##name
#define RECURSE sais_i32_i32_main
#include "sais_impl.h"
#undef TX
#undef SX
#undef FN
#undef RECURSE

#define TX uint16_t
#define SX int64_t
#define FN(name) sais_u16_i64_##name
#define RECURSE sais_i64_i64_main
#include "sais_impl.h"
#undef TX
#undef SX
#undef FN
#undef RECURSE

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Scans for invalid tokens and the symbol range. Returns LK_OK or LK_EBADTOKEN. */
static int scan_tokens(const int32_t *T, int64_t n, int32_t *lo, int32_t *hi, int64_t *bad_index) {
    int32_t mn = INT32_MAX, mx = INT32_MIN;
    for (int64_t i = 0; i < n; ++i) {
        int32_t t = T[i];
        mn = t < mn ? t : mn;
        mx = t > mx ? t : mx;
    }
    if (mn < LK_SEP) {
        for (int64_t i = 0; i < n; ++i) {
            if (T[i] < LK_SEP) { *bad_index = i; return LK_EBADTOKEN; }
        }
    }
    *lo = mn;
    *hi = mx;
    return LK_OK;
}

/* Whether to rank-compact the alphabet: bucket arrays cost O(max id), the
 * compacted copy costs 4 bytes per token. Compact only when the alphabet is
 * large against the text (never for vocabularies of ~50k-260k on big corpora). */
static int should_compact(int64_t ksize, int64_t n) {
    int64_t limit = n / 4 > 65536 ? n / 4 : 65536;
    return ksize > limit;
}

/* Writes into R the rank of each token among the distinct values of T (so
 * LK_SEP, the smallest, gets rank 0 when present). Returns the number of
 * distinct values, or -1 when out of memory. O(n log n); only for huge ids. */
static int64_t compact_alphabet(const int32_t *T, int64_t n, int32_t *R) {
    int32_t *u = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    if (u == NULL) return -1;
    memcpy(u, T, (size_t)n * sizeof(int32_t));
    qsort(u, (size_t)n, sizeof(int32_t), cmp_i32);
    int64_t d = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (d == 0 || u[i] != u[d - 1]) u[d++] = u[i];
    }
    for (int64_t i = 0; i < n; ++i) {
        int64_t lo = 0, hi = d;  /* first index with u[idx] >= T[i] */
        while (lo < hi) {
            int64_t mid = (lo + hi) >> 1;
            if (u[mid] < T[i]) lo = mid + 1; else hi = mid;
        }
        R[i] = (int32_t)lo;
    }
    free(u);
    return d;
}

/* Texts of at least this many tokens over at most 65,536 symbols are sorted
 * through a 16-bit copy (2 bytes per token of scratch): below it the text
 * fits the caches anyway and the copy would not pay. */
#define LK_NARROW_MIN_N ((int64_t)1 << 20)

#define LK_SA_ENTRY(NAME, SXT, MAIN_TOP, MAIN_U16)                               \
    int NAME##_opts(const int32_t *T, int64_t n, SXT *SA, int64_t *bad_index,    \
                    int64_t narrow_min_n, int flags) {                            \
        int32_t lo, hi;                                                           \
        int rc;                                                                   \
        if (n <= 0) return LK_OK;                                                 \
        rc = scan_tokens(T, n, &lo, &hi, bad_index);                              \
        if (rc != LK_OK) return rc;                                               \
        int64_t cmin = lo < 0 ? -1 : 0, k = (int64_t)hi + 1;                      \
        if (narrow_min_n >= 0 && n >= narrow_min_n && k - cmin <= 65536) {        \
            /* symbols shifted by -cmin (SEP -> 0); without memory for the    \
             * copy, the int32 text is sorted directly (same result) */        \
            uint16_t *U = (uint16_t *)malloc((size_t)n * sizeof(uint16_t));      \
            if (U != NULL) {                                                      \
                for (int64_t i = 0; i < n; ++i) U[i] = (uint16_t)(T[i] - cmin);   \
                rc = MAIN_U16(U, SA, 0, (SXT)n, 0, (SXT)(k - cmin), flags);              \
                free(U);                                                          \
                return rc;                                                        \
            }                                                                     \
        }                                                                         \
        if (!should_compact(k - cmin, n)) {                                       \
            return MAIN_TOP(T, SA, 0, (SXT)n, (SXT)cmin, (SXT)k, flags);                 \
        }                                                                         \
        int32_t *R = (int32_t *)malloc((size_t)n * sizeof(int32_t));             \
        if (R == NULL) return LK_ENOMEM;                                          \
        int64_t d = compact_alphabet(T, n, R);                                    \
        if (d < 0) { free(R); return LK_ENOMEM; }                                 \
        rc = MAIN_TOP(R, SA, 0, (SXT)n, 0, (SXT)d, flags);                               \
        free(R);                                                                  \
        return rc;                                                                \
    }                                                                             \
    int NAME(const int32_t *T, int64_t n, SXT *SA, int64_t *bad_index) {         \
        return NAME##_opts(T, n, SA, bad_index, LK_NARROW_MIN_N, 0);                \
    }

LK_SA_ENTRY(lk_suffix_array_i32, int32_t, sais_i32_i32_main, sais_u16_i32_main)
LK_SA_ENTRY(lk_suffix_array_i64, int64_t, sais_i32_i64_main, sais_u16_i64_main)

/* Linear-time check (Burkhardt & Kaerkkaeinen): a permutation SA is sorted
 * iff for every adjacent pair (a, b): T[a] < T[b], or T[a] == T[b] and
 * rank(a+1) < rank(b+1), where the empty suffix (position n) ranks lowest. */
#define LK_CHECK_ENTRY(NAME, SXT)                                                 \
    int NAME(const int32_t *T, int64_t n, const SXT *SA, int64_t *where) {        \
        if (n <= 0) return 0;                                                     \
        SXT *rank = (SXT *)malloc((size_t)(n + 1) * sizeof(SXT));                 \
        if (rank == NULL) return LK_ENOMEM;                                       \
        for (int64_t i = 0; i <= n; ++i) rank[i] = -1;                            \
        for (int64_t i = 0; i < n; ++i) {                                         \
            SXT p = SA[i];                                                        \
            if (p < 0 || p >= n || rank[p] != -1) { free(rank); *where = i; return 1; } \
            rank[p] = (SXT)i;                                                     \
        }                                                                         \
        for (int64_t i = 1; i < n; ++i) {                                         \
            SXT a = SA[i - 1], b = SA[i];                                         \
            int ok = T[a] < T[b] || (T[a] == T[b] && rank[a + 1] < rank[b + 1]);  \
            if (!ok) { free(rank); *where = i; return 2; }                        \
        }                                                                         \
        free(rank);                                                               \
        return 0;                                                                 \
    }

LK_CHECK_ENTRY(lk_check_sa_i32, int32_t)
LK_CHECK_ENTRY(lk_check_sa_i64, int64_t)
