/* Suffix-array construction (SA-IS) over an integer alphabet.
 *
 * Input: n int32 tokens, ids 0..2^31-1 plus LK_SEP (-1), which sorts below
 * every id. Suffixes compare as sequences: a proper prefix sorts first (the
 * text ends in a virtual sentinel smaller than every symbol).
 * Output: SA[0..n), the start positions of the suffixes in sorted order.
 *
 * Time O(n); extra memory: two bucket arrays of the alphabet size at the top
 * level (the alphabet is rank-compacted first when max id is large compared
 * to n, which costs one int32 per token; or, for alphabets of at most 65,536
 * symbols and at least 2^20 tokens, the text is copied to 16 bits, which
 * costs 2 bytes per token), during stage 1 one mark byte per token and one
 * group id per symbol (naming during induction, for alphabets of at most
 * 65,536 symbols or n/16; larger ones compare the LMS substrings instead, with
 * one byte per LMS suffix), and at most one bucket array per
 * recursion level, placed in unused SA space whenever it fits, plus, when a
 * level recurses only on its non-unique LMS suffixes, a bitmap of one bit per
 * reduced name and one count per 64 names (~1/16 byte per LMS suffix). */
#ifndef LK_SAIS_H
#define LK_SAIS_H

#include <stdint.h>
#include "lk_common.h"

/* Both return LK_OK, LK_ENOMEM, or LK_EBADTOKEN (with *bad_index set to the
 * first token < -1). The _i32 variant requires n < 2^31. */
int lk_suffix_array_i32(const int32_t *tokens, int64_t n, int32_t *sa, int64_t *bad_index);
int lk_suffix_array_i64(const int32_t *tokens, int64_t n, int64_t *sa, int64_t *bad_index);
/* Flags of the _opts variants: name the LMS substrings by comparing them
 * (the path taken for large alphabets) instead of during induction. */
#define LK_SAIS_COMPARE_NAMES 1

/* The same, with the 16-bit-copy threshold and flags given (for tests and
 * tuning): texts of >= narrow_min_n tokens over <= 65,536 symbols take the
 * 16-bit path; narrow_min_n < 0 never takes it. */
int lk_suffix_array_i32_opts(const int32_t *tokens, int64_t n, int32_t *sa, int64_t *bad_index,
                             int64_t narrow_min_n, int flags);
int lk_suffix_array_i64_opts(const int32_t *tokens, int64_t n, int64_t *sa, int64_t *bad_index,
                             int64_t narrow_min_n, int flags);

/* Checks that sa is a permutation of 0..n-1 and that adjacent suffixes are in
 * strictly increasing order. Returns 0 when valid; otherwise 1 (not a
 * permutation: *where = first offending index of sa) or 2 (not sorted:
 * *where = i such that suffix sa[i-1] >= suffix sa[i]), or LK_ENOMEM.
 * Linear time; scratch: one rank array of n + 1 positions. */
int lk_check_sa_i32(const int32_t *tokens, int64_t n, const int32_t *sa, int64_t *where);
int lk_check_sa_i64(const int32_t *tokens, int64_t n, const int64_t *sa, int64_t *where);

#endif
