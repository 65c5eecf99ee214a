# The live index (ext/csrc/live.h), included by _native.pyx.

cdef extern from "live.h" nogil:
    ctypedef struct lk_live:
        int32_t *tok
        int64_t n
        int32_t min_n
    ctypedef struct lk_live_match:
        int64_t length
        int64_t total
        int64_t nstarts
    int lk_live_init(lk_live *ix, int32_t min_n, int32_t max_n, int64_t capacity)
    void lk_live_free(lk_live *ix)
    void lk_live_clear(lk_live *ix)
    int lk_live_extend(lk_live *ix, const int32_t *tokens, int64_t n)
    int64_t lk_live_bytes(const lk_live *ix)
    lk_live_match lk_live_match_suffix(const lk_live *ix, int64_t lo, int64_t hi, int64_t *starts,
                                       int64_t max_starts, int count_all)
    int64_t lk_live_continuation(const lk_live *ix, int64_t start, int64_t depth, int periodic, int32_t *out)
    int64_t lk_live_trie(const lk_live *ix, const int64_t *starts, int64_t k, int64_t depth, int64_t width,
                         int32_t *work, int32_t *out_tok, int32_t *out_parent, int32_t *out_count)


cdef class LiveCore:
    """The native live index over one growing int32 token sequence (see ext/csrc/live.h).

    ``lookupdec.index.live.LiveIndex`` wraps it with argument checks; this class
    trusts its inputs' ranges but never reads outside its own buffers.

    Args:
        min_n, max_n: the shortest and longest suffix a query may match (1 <= min_n <= max_n).
        capacity: tokens to reserve room for.

    Example:
        >>> c = LiveCore(1, 4, 16); c.extend(np.array([7, 8, 9, 7], dtype=np.int32))
        >>> c.match(1, 4, 8)
        (1, 1, [1])
    """
    cdef lk_live ix
    cdef object _work, _starts, _tok, _par, _cnt  # draft() scratch, grown on demand

    def __cinit__(self, int32_t min_n, int32_t max_n, int64_t capacity=1024):
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        if lk_live_init(&self.ix, min_n, max_n, max(capacity, 16)) != LK_OK:
            raise MemoryError(f"cannot allocate a live index for {capacity} tokens")
        self._work = self._starts = self._tok = self._par = self._cnt = None

    def __dealloc__(self):
        lk_live_free(&self.ix)

    def __len__(self):
        return self.ix.n

    @property
    def nbytes(self):
        """Bytes held by the index's buffers."""
        return lk_live_bytes(&self.ix)

    def clear(self):
        lk_live_clear(&self.ix)

    def tokens(self):
        """A copy of the sequence (int32)."""
        out = np.empty(self.ix.n, dtype=np.int32)
        cdef int32_t[::1] ov = out
        cdef int64_t i
        for i in range(self.ix.n):
            ov[i] = self.ix.tok[i]
        return out

    def extend(self, tokens):
        """Appends int32 tokens (each >= 0: checked by the caller). GIL released."""
        cdef const int32_t[::1] t = tokens
        cdef int64_t n = t.shape[0]
        cdef int rc
        if n == 0:
            return
        with nogil:
            rc = lk_live_extend(&self.ix, &t[0], n)
        if rc == LK_ECAPACITY:
            raise ValueError("a live index holds at most 2^31 - 1 tokens")
        if rc != LK_OK:
            _raise_status(rc)

    def extend_ints(self, tokens):
        """Appends a list or tuple of Python ints without going through numpy (a step's few new
        tokens: the numpy route cost ~70 us right after a forward had cooled the caches).

        Returns False, appending nothing, when an item is not an ``int`` or lies outside
        ``[0, 2^31 - 1]``: the caller then takes the checked numpy route for its error.
        """
        cdef int32_t buf[64]
        cdef Py_ssize_t n = len(tokens), i, lo
        cdef object x
        cdef long long v
        cdef int rc
        for x in tokens:
            if type(x) is not int:
                return False
            v = x if -(1LL << 62) < x < (1LL << 62) else -1
            if v < 0 or v > 0x7FFFFFFF:
                return False
        lo = 0
        while lo < n:
            i = 0
            while i < 64 and lo + i < n:
                buf[i] = <int32_t><long long>tokens[lo + i]
                i += 1
            rc = lk_live_extend(&self.ix, buf, i)
            if rc == LK_ECAPACITY:
                raise ValueError("a live index holds at most 2^31 - 1 tokens")
            if rc != LK_OK:
                _raise_status(rc)
            lo += i
        return True

    def match(self, int64_t lo, int64_t hi, int64_t max_starts):
        """(length, total, starts most recent first) of the longest suffix match in [lo, hi]."""
        cdef int64_t k = max(max_starts, 0)
        starts = np.empty(max(k, 1), dtype=np.int64)
        cdef int64_t[::1] sv = starts
        cdef lk_live_match m
        with nogil:
            m = lk_live_match_suffix(&self.ix, lo, hi, &sv[0], k, 1)
        return m.length, m.total, starts[:m.nstarts].tolist()

    def draft(self, int64_t lo, int64_t hi, int64_t max_starts, int64_t depth, int64_t width):
        """The longest match's up to max_starts most recent occurrences, their continuations
        counted into a trie: (length, occurrences, tokens int64, parents int32, counts int64,
        shares float64, conditionals float64); ``shares[i] = counts[i] / occurrences``,
        ``conditionals[i] = shares[i] / shares[parent]`` (a root child's: its share; the same
        doubles as ``calibrate.conditional``). The arrays
        are filled here in one loop: numpy's conversions cost ~5 us each right after a forward."""
        cdef int64_t k = max(max_starts, 0), m_nodes, i
        cdef int32_t p
        cdef lk_live_match m
        if k == 0 or depth <= 0 or width <= 0:
            return 0, 0, None, None, None, None, None
        cdef int64_t need = 6 * k * depth + depth, cap = min(width, k * depth)
        if self._work is None or self._work.shape[0] < need:
            self._work = np.empty(need, dtype=np.int32)
        if self._starts is None or self._starts.shape[0] < k:
            self._starts = np.empty(k, dtype=np.int64)
        if self._tok is None or self._tok.shape[0] < cap:
            self._tok = np.empty(cap, dtype=np.int32)
            self._par = np.empty(cap, dtype=np.int32)
            self._cnt = np.empty(cap, dtype=np.int32)
        cdef int64_t[::1] sv = self._starts
        cdef int32_t[::1] wv = self._work
        cdef int32_t[::1] tv = self._tok
        cdef int32_t[::1] pv = self._par
        cdef int32_t[::1] cv = self._cnt
        with nogil:
            m = lk_live_match_suffix(&self.ix, lo, hi, &sv[0], k, 0)
            m_nodes = 0
            if m.length:
                m_nodes = lk_live_trie(&self.ix, &sv[0], m.nstarts, depth, width, &wv[0], &tv[0], &pv[0], &cv[0])
        if not m.length:
            return 0, 0, None, None, None, None, None
        tokens = np.empty(m_nodes, dtype=np.int64)
        parents = np.empty(m_nodes, dtype=np.int32)
        counts = np.empty(m_nodes, dtype=np.int64)
        shares = np.empty(m_nodes, dtype=np.float64)
        cond = np.empty(m_nodes, dtype=np.float64)
        cdef int64_t[::1] ot = tokens, oc = counts
        cdef int32_t[::1] op = parents
        cdef double[::1] osh = shares, ocd = cond
        cdef double occ = <double>m.nstarts
        for i in range(m_nodes):
            p = pv[i]
            ot[i] = tv[i]
            op[i] = p
            oc[i] = cv[i]
            osh[i] = cv[i] / occ
            ocd[i] = (osh[i] / osh[p] if osh[p] > 0 else 0.0) if p >= 0 else osh[i]  # as calibrate.conditional
        return m.length, m.nstarts, tokens, parents, counts, shares, cond

    def continuation(self, int64_t start, int64_t depth, bint periodic):
        """The tokens after an occurrence starting at start (see LiveIndex.continuation)."""
        out = np.empty(max(depth, 1), dtype=np.int32)
        cdef int32_t[::1] ov = out
        cdef int64_t m
        with nogil:
            m = lk_live_continuation(&self.ix, start, depth, periodic, &ov[0])
        return out[:m].tolist()
