# The context source's proposal in one call, included by _native.pyx: the live index's draft (and its
# fallback to shorter matches when the longest finds nothing) scored by the calibration (calib.pxi's
# loop), as PLDDrafter.propose -> lookup_tree -> LiveIndex.draft -> NodeScorer.score did it in five
# layers of Python, each 5-25 us right after a forward. That route is the reference in the tests.


def context_propose(LiveCore core, tuple full, tuple fallback, int64_t max_occurrences, list levels, str src,
                    bint grow, int source_id):
    """A lookup proposal scored with ``lookup_prior``.

    Args:
        core: the live index.
        full, fallback: ``(lo, hi, depth, width)`` of the longest match's draft and of the draft
            tried when it finds nothing (``fallback`` None: none).
        max_occurrences: occurrences merged, most recent first.
        levels, src, grow: as ``calib_score`` (the match length is the draft's, one for every node).
        source_id: stamped on every node.

    Returns None when nothing matched, else ``(full, tokens int64, parents int32, scores float64,
    sources int16, depth, keys, token list, parent list)``: ``full`` whether the longest match's
    draft was taken, ``depth`` and ``keys`` lists per node (``NodeScorer.score``'s outcomes).
    """
    cdef int64_t lo, hi, depth, width
    cdef Py_ssize_t n, i
    lo, hi, depth, width = full
    length, _, tokens, parents, _, _, cond = core.draft(lo, hi, max_occurrences, depth, width)
    took_full = bool(length) and len(tokens) > 0
    if not took_full and fallback is not None:
        lo, hi, depth, width = fallback
        length, _, tokens, parents, _, _, cond = core.draft(lo, hi, max_occurrences, depth, width)
    if not length or not len(tokens):
        return None
    n = len(tokens)
    cdef const int32_t[::1] pv = parents
    cdef const double[::1] rv = cond
    scores = np.empty(n, np.float64)
    cdef double[::1] sv = scores
    keys = [None] * n
    cdef long *dp = <long *>malloc(max(n, 1) * sizeof(long))
    if dp is NULL:
        raise MemoryError()
    try:
        _score_loop(levels, src, n, &pv[0], &rv[0], NULL, <long>length, grow, &sv[0], dp, keys)
        depth_list = [dp[i] for i in range(n)]
    finally:
        free(dp)
    sources = np.full(n, source_id, np.int16)
    return took_full, tokens, parents, scores, sources, depth_list, keys, tokens.tolist(), parents.tolist()
