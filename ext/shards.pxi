# A whole index lookup in one native call (ext/csrc/lookup.h), included by _native.pyx.

from libc.stdlib cimport malloc, free
from libc.string cimport memcpy


cdef extern from "lookup.h" nogil:
    ctypedef struct lk_top_node:
        pass
    ctypedef struct lk_shard:
        const int32_t *tokens
        const void *sa
        int64_t n
        int wide
        lk_top_node *top
        int top_levels
    int lk_shard_top_init(lk_shard *sh, int levels)
    void lk_shard_top_free(lk_shard *sh)
    ctypedef struct lk_lookup_scratch:
        lk_trie trie
        int64_t out_cap
        int64_t *out_tok
        int32_t *out_parent
        int64_t *out_count
    ctypedef struct lk_lookup_result:
        int64_t match_len
        int64_t occurrences
        int64_t sampled
        int64_t nodes
    int lk_lookup_scratch_init(lk_lookup_scratch *s, int64_t n_shards, int64_t trie_capacity, int64_t out_cap)
    void lk_lookup_scratch_free(lk_lookup_scratch *s)
    void lk_split_occurrences(const int64_t *counts, int64_t k, int64_t max_occ, int64_t *quota, int64_t *rem)
    int lk_lookup(lk_lookup_scratch *s, const lk_shard *shards, int64_t n_shards, const int32_t *ctx,
                  int64_t clen, int64_t max_n, int64_t min_n, int64_t max_occ, int64_t depth,
                  int64_t budget, int64_t token_limit, lk_lookup_result *res)


# Levels of each shard's bisection tree kept in memory by default (2^12 - 1
# nodes of 32 bytes = 128 KB per shard of 4095 or more entries): a lookup's
# first probes per match length then read this dense copy instead of a
# likely cache and TLB miss each in the memory-mapped arrays.
TOP_LEVELS = 12

# The most trie nodes a lookup may need (max_occurrences * depth), as ContinuationTrie.
MAX_TRIE_NODES = 2**30
cdef int64_t _MAX_NODES = 1 << 30
cdef int64_t _MIN_TRIE = 1024  # a scratch trie is never smaller: small lookups share one size
cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF
_EMPTY_LOOKUP = (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.float64))


def _split_occurrences(counts, int64_t max_occurrences):
    """The native share of max_occurrences among shards with these counts (for tests).

    Args:
        counts: 1-D C-contiguous int64 array of counts >= 0 summing below 2^63.
        max_occurrences: samples to share (>= 0).

    Returns:
        int64 array of quotas (the rule of ``split_occurrences`` in tests/oracles/index.py).

    Example:
        >>> _split_occurrences(np.array([6, 3, 1], dtype=np.int64), 5).tolist()
        [3, 2, 0]
    """
    _itemsize(counts, "counts", (8,))
    if max_occurrences < 0:
        raise ValueError(f"max_occurrences must be >= 0, got {max_occurrences}")
    cdef const int64_t[::1] c = counts
    cdef int64_t k = c.shape[0], i, total = 0
    for i in range(k):
        if c[i] < 0 or c[i] > _I64_MAX - total:
            raise ValueError("counts must be >= 0 and sum below 2^63")
        total += c[i]
    quota = np.zeros(k, dtype=np.int64)
    if k == 0:
        return quota
    rem = np.empty(2 * k, dtype=np.int64)
    cdef int64_t[::1] q = quota
    cdef int64_t[::1] r = rem
    lk_split_occurrences(&c[0], k, max_occurrences, &q[0], &r[0])
    return quota


cdef class _LookupScratch:
    """The buffers of one lookup in progress (never used by two lookups at once)."""
    cdef lk_lookup_scratch s

    def __cinit__(self, int64_t n_shards, int64_t trie_capacity, int64_t out_cap):
        if lk_lookup_scratch_init(&self.s, n_shards, trie_capacity, out_cap) != LK_OK:
            raise MemoryError(f"cannot allocate lookup buffers for {trie_capacity} trie nodes")

    def __dealloc__(self):
        lk_lookup_scratch_free(&self.s)


cdef class Shards:
    """The shards of an index, looked up in one call with the GIL released.

    Built once per index from each shard's token array and suffix array (the
    arrays are kept referenced, so memory maps stay open). A lookup finds the
    longest context suffix over all shards, splits ``max_occurrences`` among
    the shards holding it (largest remainders, ties to the lower shard),
    counts the ``depth`` tokens after each sampled occurrence into one trie
    and returns its ``budget`` best nodes. Lookups may run from several
    threads at once: each takes its own scratch buffers from a pool.

    Args:
        shards: a sequence of (tokens, sa) pairs: 1-D C-contiguous int32 tokens
            (-1 separates documents) and their int32 or int64 suffix array.
        token_limit: token ids at or above it are dropped from results, with
            the nodes below them (a damaged file may hold ids outside the
            vocabulary); default 2^31: none.
        top_levels: levels of each shard's suffix-array bisection copied into
            memory at the first lookup (0..20; 0: none), at most
            log2(entries + 1); results do not depend on it.

    Raises:
        TypeError / ValueError: a buffer of the wrong type, shape or length.

    Example:
        >>> t = np.array([1, 2, 3, -1, 1, 2, 4, -1], dtype=np.int32)
        >>> s = Shards([(t, suffix_array(t))])
        >>> n, occ, sampled, tok, par, cnt, score = s.lookup(np.array([1, 2], dtype=np.int32), 4, 1, 10, 2, 8)
        >>> n, occ, tok.tolist(), par.tolist(), cnt.tolist()
        (2, 2, [3, 4], [-1, -1], [1, 1])
    """
    cdef lk_shard *shards
    cdef int64_t n
    cdef int64_t limit
    cdef list _views  # a buffer export of every array: keeps them mapped and unresizable
    cdef list _idle   # _LookupScratch objects not in use
    cdef int _levels  # top_levels asked for
    cdef bint _topped  # the top-of-tree copies are built (at the first lookup, holding the GIL)

    def __cinit__(self, shards, int64_t token_limit=2**31, int top_levels=TOP_LEVELS):
        pairs = list(shards)
        if token_limit < 0:
            raise ValueError(f"token_limit must be >= 0, got {token_limit}")
        if not 0 <= top_levels <= 20:
            raise ValueError(f"top_levels must be in [0, 20], got {top_levels}")
        self._levels = top_levels
        self._topped = False
        self._views = []
        self._idle = []
        self.limit = token_limit
        self.shards = <lk_shard *>malloc(max(len(pairs), 1) * sizeof(lk_shard))
        if self.shards == NULL:
            raise MemoryError("cannot allocate the shard table")
        self.n = 0
        cdef const int32_t[::1] t
        cdef const int32_t[::1] s32
        cdef const int64_t[::1] s64
        cdef int sz
        cdef lk_shard *sh
        for pair in pairs:
            tokens, sa = pair
            sz = _check_pair(tokens, sa)
            sh = &self.shards[self.n]
            sh.n = len(tokens)
            sh.wide = sz == 8
            sh.tokens = NULL
            sh.sa = NULL
            sh.top = NULL
            sh.top_levels = 0
            if sh.n > 0:
                t = tokens
                sh.tokens = &t[0]
                if sz == 4:
                    s32 = sa
                    sh.sa = &s32[0]
                else:
                    s64 = sa
                    sh.sa = &s64[0]
            self._views.append(memoryview(tokens))
            self._views.append(memoryview(sa))
            self.n += 1

    def __dealloc__(self):
        cdef int64_t i
        if self.shards != NULL:
            for i in range(self.n):
                lk_shard_top_free(&self.shards[i])
        free(self.shards)

    cdef _build_tops(self):
        """Copies each shard's top bisection levels (never more levels than
        the shard has: 2^levels - 1 <= entries)."""
        cdef int64_t i
        cdef int lv
        for i in range(self.n):
            lv = self._levels
            while lv > 0 and ((<int64_t>1 << lv) - 1) > self.shards[i].n:
                lv -= 1
            if lk_shard_top_init(&self.shards[i], lv) != LK_OK:
                raise MemoryError("cannot allocate the top-of-tree copies of the shards")
        self._topped = True

    @property
    def n_shards(self):
        return self.n

    @property
    def token_limit(self):
        return self.limit

    cdef _LookupScratch _take(self, int64_t nodes, int64_t out):
        cdef _LookupScratch sc = self._idle.pop() if self._idle else None
        if sc is not None and sc.s.trie.capacity >= nodes and sc.s.out_cap >= out:
            return sc
        if sc is not None:  # too small: replace it by one that fits both
            nodes = max(nodes, sc.s.trie.capacity)
            out = max(out, sc.s.out_cap)
        return _LookupScratch(self.n, nodes, out)

    def lookup(self, context, int64_t max_n, int64_t min_n, int64_t max_occurrences, int64_t depth,
               int64_t budget):
        """Continuations of the longest suffix of context found in any shard.

        Args:
            context: 1-D C-contiguous int32 array, most recent token last; a -1
                bounds the suffix as in match().
            max_n, min_n: longest and shortest suffix tried (1 <= min_n <= max_n).
            max_occurrences: occurrences sampled in all (>= 1), shared among the
                shards holding the match in proportion to their counts.
            depth: tokens read after each occurrence (>= 1; a separator stops earlier).
            budget: most nodes returned (>= 0).

        Returns:
            (match_len, occurrences, sampled, tokens int64, parents int32,
            counts int64, scores float64 = counts / max(sampled, 1)): the tree
            in rank order (count desc, depth asc, token path asc), parents[i] < i.
            match_len 0 and empty arrays when nothing matches.

        Raises:
            TypeError / ValueError: a bad context buffer or argument, or a
                context value < -1.
            MemoryError: scratch buffers could not be allocated.
        """
        if min_n < 1:
            raise ValueError(f"min_n must be >= 1, got {min_n}")
        if max_n < min_n:
            raise ValueError(f"max_n must be >= min_n, got max_n={max_n} < min_n={min_n}")
        if max_occurrences < 1 or depth < 1 or budget < 0:
            raise ValueError(f"need max_occurrences >= 1, depth >= 1 and budget >= 0, got "
                             f"{max_occurrences}, {depth}, {budget}")
        if max_occurrences > _MAX_NODES // depth:
            raise ValueError(f"max_occurrences * depth = {max_occurrences * depth} exceeds {_MAX_NODES} "
                             "trie nodes; lower max_occurrences or depth")
        cdef const int32_t[::1] c
        try:
            c = context
        except (TypeError, ValueError, BufferError):
            _itemsize(context, "context", (4,))  # the clear message, when it has one
            raise
        cdef int64_t clen = c.shape[0]
        cdef const int32_t *cp = &c[0] if clen > 0 else NULL
        cdef int64_t nodes = max_occurrences * depth
        if nodes < _MIN_TRIE:
            nodes = _MIN_TRIE
        if not self._topped:
            self._build_tops()  # under the GIL: no lookup runs while they are written
        cdef _LookupScratch sc = self._take(nodes, budget if budget < nodes else nodes)
        cdef lk_lookup_result res
        cdef int rc
        cdef int64_t m, i
        cdef double per
        cdef int64_t[::1] tv
        cdef int32_t[::1] pv
        cdef int64_t[::1] cv
        cdef double[::1] sv
        try:
            with nogil:
                rc = lk_lookup(&sc.s, self.shards, self.n, cp, clen, max_n, min_n, max_occurrences, depth,
                               budget, self.limit, &res)
            if rc == LK_EBADTOKEN:
                _raise_bad_token(context, res.match_len, "context")
            if rc != LK_OK:
                _raise_status(rc)
            m = res.nodes
            if m == 0:
                tok, par, cnt, score = _EMPTY_LOOKUP
            else:
                tok = np.empty(m, dtype=np.int64)
                par = np.empty(m, dtype=np.int32)
                cnt = np.empty(m, dtype=np.int64)
                score = np.empty(m, dtype=np.float64)
                tv = tok
                pv = par
                cv = cnt
                sv = score
                memcpy(&tv[0], sc.s.out_tok, m * sizeof(int64_t))
                memcpy(&pv[0], sc.s.out_parent, m * sizeof(int32_t))
                memcpy(&cv[0], sc.s.out_count, m * sizeof(int64_t))
                per = <double>(res.sampled if res.sampled > 1 else 1)
                for i in range(m):
                    sv[i] = <double>cv[i] / per
        finally:
            self._idle.append(sc)
        return res.match_len, res.occurrences, res.sampled, tok, par, cnt, score
