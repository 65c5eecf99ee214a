# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native core of lookupdec: suffix arrays over token ids and lookups on them.

Token arrays are 1-D C-contiguous int32; -1 is the document separator (SEP),
which sorts below every token and is never matched across; other negative
values are invalid. Suffix arrays are int32 below 2^31 tokens, int64 above.

The algorithms live in ext/csrc/ (plain C over buffers); this module checks
buffers, releases the GIL around the C calls and maps C status codes to
Python exceptions. Slow, obvious references for every function here live in
``tests/oracles/``.
"""
import numpy as np

from libc.stdint cimport int32_t, int64_t


cdef extern from "lk_common.h" nogil:
    int LK_OK
    int LK_ENOMEM
    int LK_EBADARG
    int LK_ERANGE
    int LK_EBADTOKEN
    int LK_ECAPACITY


cdef extern from "sais.h" nogil:
    int lk_suffix_array_i32(const int32_t *tokens, int64_t n, int32_t *sa, int64_t *bad_index)
    int lk_suffix_array_i64(const int32_t *tokens, int64_t n, int64_t *sa, int64_t *bad_index)
    int lk_suffix_array_i32_opts(const int32_t *tokens, int64_t n, int32_t *sa, int64_t *bad_index,
                                 int64_t narrow_min_n, int flags)
    int lk_suffix_array_i64_opts(const int32_t *tokens, int64_t n, int64_t *sa, int64_t *bad_index,
                                 int64_t narrow_min_n, int flags)
    int LK_SAIS_COMPARE_NAMES
    int lk_check_sa_i32(const int32_t *tokens, int64_t n, const int32_t *sa, int64_t *where)
    int lk_check_sa_i64(const int32_t *tokens, int64_t n, const int64_t *sa, int64_t *where)


cdef extern from "lookup.h" nogil:
    ctypedef struct lk_trie:
        int64_t capacity
        int64_t size
    int64_t lk_match_i32(const int32_t *tokens, int64_t n, const int32_t *sa, const int32_t *ctx,
                         int64_t clen, int64_t max_n, int64_t min_n, int64_t *lo, int64_t *hi)
    int64_t lk_match_i64(const int32_t *tokens, int64_t n, const int64_t *sa, const int32_t *ctx,
                         int64_t clen, int64_t max_n, int64_t min_n, int64_t *lo, int64_t *hi)
    int lk_trie_init(lk_trie *t, int64_t capacity)
    void lk_trie_free(lk_trie *t)
    void lk_trie_reset(lk_trie *t)
    int64_t lk_trie_add_i32(lk_trie *t, const int32_t *tokens, int64_t n, const int32_t *sa,
                            int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth)
    int64_t lk_trie_add_i64(lk_trie *t, const int32_t *tokens, int64_t n, const int64_t *sa,
                            int64_t lo, int64_t hi, int64_t match_len, int64_t max_occ, int64_t depth)
    int64_t lk_trie_top_size(const lk_trie *t, int64_t budget)
    int64_t lk_trie_top(lk_trie *t, int64_t budget, int64_t *out_tok, int32_t *out_parent,
                        int64_t *out_count)


# Positions fit int32 while every index 0..n (n included, as an end bound) does.
INT32_POSITIONS_LIMIT = 2**31 - 1
_EMPTY32 = np.zeros(1, dtype=np.int32)


def _itemsize(obj, str name, tuple sizes):
    """Checks that obj is a 1-D C-contiguous signed-integer buffer of one of
    the given item sizes; returns its item size."""
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name} must be a 1-D int32 numpy array, got {type(obj).__name__}") from None
    kinds = {4: "int32", 8: "int64"}
    want = " or ".join(kinds[s] for s in sizes)
    fmt = mv.format.lstrip("<=@!")
    if fmt not in ("i", "l", "q") or mv.itemsize not in sizes:
        dtype = getattr(obj, "dtype", mv.format)
        raise TypeError(f"{name} must hold {want}, got dtype {dtype}; convert with .astype(np.{kinds[sizes[0]]})")
    if mv.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {mv.shape}")
    if not mv.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass np.ascontiguousarray({name})")
    return mv.itemsize


def _raise_bad_token(tokens, int64_t index, str name="tokens"):
    raise ValueError(
        f"{name}[{index}] = {int(tokens[index])} is not a valid token: ids must be >= 0 "
        f"and -1 is the only allowed negative value (the document separator)")


def _raise_status(int rc):
    if rc == LK_ENOMEM:
        raise MemoryError("the native core ran out of memory")
    raise RuntimeError(f"native core failed with status {rc}")


# Default for the 16-bit-copy threshold of the C core (LK_NARROW_MIN_N in sais.c).
_NARROW_DEFAULT = 1 << 20


def _build(tokens, bint force64, int64_t narrow_min_n=_NARROW_DEFAULT, bint compare_names=False):
    _itemsize(tokens, "tokens", (4,))
    cdef const int32_t[::1] t = tokens
    cdef int64_t n = t.shape[0], bad = -1
    cdef int rc
    cdef int flags = LK_SAIS_COMPARE_NAMES if compare_names else 0
    cdef int32_t[::1] sa32
    cdef int64_t[::1] sa64
    cdef const int32_t *tp
    if n < INT32_POSITIONS_LIMIT and not force64:
        out = np.empty(n, dtype=np.int32)
        if n == 0:
            return out
        sa32 = out
        tp = &t[0]
        with nogil:
            rc = lk_suffix_array_i32_opts(tp, n, &sa32[0], &bad, narrow_min_n, flags)
    else:
        out = np.empty(n, dtype=np.int64)
        if n == 0:
            return out
        sa64 = out
        tp = &t[0]
        with nogil:
            rc = lk_suffix_array_i64_opts(tp, n, &sa64[0], &bad, narrow_min_n, flags)
    if rc == LK_EBADTOKEN:
        _raise_bad_token(tokens, bad)
    if rc != LK_OK:
        _raise_status(rc)
    return out


def suffix_array(tokens):
    """Suffix array of a token array, by SA-IS in linear time (GIL released).

    Args:
        tokens: 1-D C-contiguous int32 array; ids >= 0, -1 = separator (SEP),
            which sorts below every id. Suffixes compare as token sequences; a
            proper prefix sorts first.

    Returns:
        np.ndarray of the suffix start positions in sorted order: int32 when
        len(tokens) < 2^31 - 1, else int64.

    Raises:
        TypeError: tokens is not an int32 buffer.
        ValueError: tokens is not 1-D or not C-contiguous, or holds a value < -1.
        MemoryError: the scratch space could not be allocated.

    Example:
        >>> suffix_array(np.array([1, 0, 1, 0], dtype=np.int32)).tolist()
        [3, 1, 2, 0]
    """
    return _build(tokens, False)


def _suffix_array64(tokens):
    """suffix_array() forced onto the int64-position code path (for tests)."""
    return _build(tokens, True)


def _suffix_array_opts(tokens, bint force64=False, int64_t narrow_min_n=_NARROW_DEFAULT,
                       bint compare_names=False):
    """suffix_array() with the internal paths chosen (for tests and tuning).

    force64 takes the int64-position path; texts of at least narrow_min_n
    tokens whose alphabet (SEP included) has at most 65,536 symbols are sorted
    through a 16-bit copy, and narrow_min_n < 0 never takes that path;
    compare_names names the LMS substrings by comparing them (the path of
    large alphabets) instead of while inducing.
    """
    return _build(tokens, force64, narrow_min_n, compare_names)


def check_suffix_array(tokens, sa):
    """Returns "" when sa is the suffix array of tokens, else what is wrong.

    Checks that sa is a permutation of 0..n-1 and that each adjacent pair of
    suffixes is strictly increasing, in O(n) time with one rank array
    (n + 1 positions) of scratch (Burkhardt-Kaerkkaeinen check: compare the
    first tokens, then the ranks of the suffixes one position later).

    Args:
        tokens: 1-D C-contiguous int32 array.
        sa: 1-D C-contiguous int32 or int64 array.

    Returns:
        "" or a message naming the first fault and its index.

    Raises:
        TypeError / ValueError: a buffer of the wrong type or shape.
        MemoryError: the rank array could not be allocated.

    Example:
        >>> check_suffix_array(np.array([1, 0], dtype=np.int32), np.array([0, 1], dtype=np.int32))
        'not sorted at 1: suffix 0 is not below suffix 1'
    """
    _itemsize(tokens, "tokens", (4,))
    cdef int sz = _itemsize(sa, "sa", (4, 8))
    cdef const int32_t[::1] t = tokens
    cdef const int32_t[::1] s32
    cdef const int64_t[::1] s64
    cdef int64_t n = t.shape[0], where = -1
    cdef int rc
    cdef const int32_t *tp = &t[0] if n > 0 else NULL
    if len(sa) != n:
        return f"length mismatch: {len(sa)} suffix array entries for {n} tokens"
    if n == 0:
        return ""
    if sz == 4:
        s32 = sa
        with nogil:
            rc = lk_check_sa_i32(tp, n, &s32[0], &where)
    else:
        s64 = sa
        with nogil:
            rc = lk_check_sa_i64(tp, n, &s64[0], &where)
    if rc == 0:
        return ""
    if rc == 1:
        return f"not a permutation at {where}: sa[{where}] = {int(sa[where])} is out of range or repeated"
    if rc == 2:
        return (f"not sorted at {where}: suffix {int(sa[where - 1])} is not below "
                f"suffix {int(sa[where])}")
    _raise_status(rc)


def _check_pair(tokens, sa):
    """Validates a (tokens, sa) pair; returns the item size of sa."""
    _itemsize(tokens, "tokens", (4,))
    cdef int sz = _itemsize(sa, "sa", (4, 8))
    if len(sa) != len(tokens):
        raise ValueError(f"sa has {len(sa)} entries but tokens has {len(tokens)}; "
                         f"pass the suffix array built from these tokens")
    return sz


def match(tokens, sa, context, int64_t max_n, int64_t min_n):
    """Longest suffix of context, of length in [min_n, max_n], that occurs in tokens.

    A match never spans a separator: only the part of context after its last
    -1 is considered. Binary search over lengths (occurrence is monotone in
    length), each probe an O(L log n) search over sa. GIL released.

    Args:
        tokens: 1-D C-contiguous int32 token array.
        sa: its suffix array (int32 or int64).
        context: 1-D C-contiguous int32 array, most recent token last.
        max_n: longest suffix tried (>= min_n).
        min_n: shortest suffix accepted (>= 1).

    Returns:
        (match_len, lo, hi): [lo, hi) is the SA range of the occurrences;
        (0, 0, 0) when nothing matches or len(context) < min_n.

    Raises:
        TypeError / ValueError: bad buffers, min_n < 1, max_n < min_n, or a
            context value < -1.

    Example:
        >>> t = np.array([5, 6, 7, 5, 6, 8], dtype=np.int32)
        >>> match(t, suffix_array(t), np.array([1, 5, 6], dtype=np.int32), 4, 1)
        (2, 0, 2)
    """
    cdef int sz = _check_pair(tokens, sa)
    _itemsize(context, "context", (4,))
    if min_n < 1:
        raise ValueError(f"min_n must be >= 1, got {min_n}")
    if max_n < min_n:
        raise ValueError(f"max_n must be >= min_n, got max_n={max_n} < min_n={min_n}")
    cdef const int32_t[::1] t = tokens
    cdef const int32_t[::1] c = context
    cdef const int32_t[::1] s32
    cdef const int64_t[::1] s64
    cdef int64_t n = t.shape[0], clen = c.shape[0], lo = 0, hi = 0, res
    if n == 0 or clen < min_n:
        return (0, 0, 0)
    cdef const int32_t *tp = &t[0]
    cdef const int32_t *cp = &c[0]
    if sz == 4:
        s32 = sa
        with nogil:
            res = lk_match_i32(tp, n, &s32[0], cp, clen, max_n, min_n, &lo, &hi)
    else:
        s64 = sa
        with nogil:
            res = lk_match_i64(tp, n, &s64[0], cp, clen, max_n, min_n, &lo, &hi)
    if res == LK_EBADTOKEN:
        _raise_bad_token(context, lo, "context")
    return (res, lo, hi)


cdef class ContinuationTrie:
    """A count trie of the continuations of matched occurrences, reused across lookups.

    All buffers are allocated once by the constructor; ``add`` and ``top``
    allocate nothing in C (``top`` only creates its three result arrays).

    Args:
        capacity: the most nodes it can hold; an ``add`` of K occurrences at
            depth D needs K * D free nodes (e.g. max_occurrences * depth).

    Raises:
        ValueError: capacity outside [1, 2^30].
        MemoryError: the buffers could not be allocated.

    Example:
        >>> t = np.array([1, 2, 3, 1, 2, 4], dtype=np.int32); sa = suffix_array(t)
        >>> n, lo, hi = match(t, sa, np.array([1, 2], dtype=np.int32), 2, 1)
        >>> trie = ContinuationTrie(64); trie.add(t, sa, lo, hi, n, 10, 2)
        2
        >>> [a.tolist() for a in trie.top(4)]
        [[3, 4, 1], [-1, -1, 0], [1, 1, 1]]
    """
    cdef lk_trie t

    def __cinit__(self, int64_t capacity):
        if capacity < 1 or capacity > 2**30:
            raise ValueError(f"capacity must be in [1, 2^30], got {capacity}")
        if lk_trie_init(&self.t, capacity) != LK_OK:
            raise MemoryError(f"cannot allocate a ContinuationTrie of capacity {capacity}")

    def __dealloc__(self):
        lk_trie_free(&self.t)

    @property
    def capacity(self):
        """The most nodes the trie can hold."""
        return self.t.capacity

    @property
    def size(self):
        """Nodes in use."""
        return self.t.size

    def reset(self):
        """Empties the trie (O(nodes in use)), keeping its buffers."""
        lk_trie_reset(&self.t)

    def add(self, tokens, sa, int64_t lo, int64_t hi, int64_t match_len,
            int64_t max_occurrences, int64_t depth):
        """Counts the continuations of up to max_occurrences occurrences of [lo, hi).

        Takes K = min(hi - lo, max_occurrences) SA entries evenly spread over
        the range (entry lo + (i * (hi - lo)) // K for i in 0..K-1), so that
        continuations keep their frequencies; for each, reads up to depth
        tokens from sa[j] + match_len, stopping at a separator or the end of
        tokens, and adds 1 to every node on that path. Successive adds (one
        per shard) accumulate. GIL released.

        Args:
            tokens, sa: a token array and its suffix array.
            lo, hi, match_len: a range and length as returned by match().
            max_occurrences: most occurrences sampled (>= 0).
            depth: most tokens read per occurrence (>= 0).

        Returns:
            K, the number of occurrences sampled.

        Raises:
            ValueError: a bad range or argument, or K * depth more nodes than
                the capacity has left (nothing is added then).
        """
        cdef int sz = _check_pair(tokens, sa)
        cdef int64_t n = len(tokens), res
        if not (0 <= lo <= hi <= n):
            raise ValueError(f"need 0 <= lo <= hi <= len(tokens)={n}, got lo={lo}, hi={hi}")
        if match_len < 0 or max_occurrences < 0 or depth < 0:
            raise ValueError(f"match_len, max_occurrences and depth must be >= 0, got "
                             f"{match_len}, {max_occurrences}, {depth}")
        if lo == hi or max_occurrences == 0:
            return 0
        cdef const int32_t[::1] t = tokens
        cdef const int32_t[::1] s32
        cdef const int64_t[::1] s64
        cdef const int32_t *tp = &t[0]
        if sz == 4:
            s32 = sa
            with nogil:
                res = lk_trie_add_i32(&self.t, tp, n, &s32[0], lo, hi, match_len, max_occurrences, depth)
        else:
            s64 = sa
            with nogil:
                res = lk_trie_add_i64(&self.t, tp, n, &s64[0], lo, hi, match_len, max_occurrences, depth)
        if res == LK_ECAPACITY:
            k = min(hi - lo, max_occurrences)
            raise ValueError(
                f"ContinuationTrie(capacity={self.t.capacity}) holds {self.t.size} nodes and cannot "
                f"take {k} occurrences x depth {depth}; use capacity >= "
                f"{self.t.size + k * depth} (e.g. max_occurrences * depth)")
        if res < 0:
            _raise_status(<int>res)
        return res

    def top(self, int64_t budget):
        """The budget best nodes as flat tree arrays, in rank order.

        Ranked by count (desc), then depth (asc), then token path
        (lexicographic). A parent always ranks before its child, so
        parents[i] < i.

        Args:
            budget: most nodes returned (>= 0).

        Returns:
            (tokens int64, parents int32 with -1 for children of the root,
            counts int64), each of length min(budget, size).
        """
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        cdef int64_t m = lk_trie_top_size(&self.t, budget), res
        tok = np.empty(m, dtype=np.int64)
        par = np.empty(m, dtype=np.int32)
        cnt = np.empty(m, dtype=np.int64)
        if m == 0:
            return tok, par, cnt
        cdef int64_t[::1] tv = tok
        cdef int32_t[::1] pv = par
        cdef int64_t[::1] cv = cnt
        with nogil:
            res = lk_trie_top(&self.t, budget, &tv[0], &pv[0], &cv[0])
        if res < 0:
            _raise_status(<int>res)
        return tok, par, cnt
include "shards.pxi"
include "live.pxi"
include "qmatmul.pxi"
include "select.pxi"
include "calib.pxi"
include "merge.pxi"
include "choose.pxi"
include "context.pxi"
include "step.pxi"
