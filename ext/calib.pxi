# Calibration's per-step loops in one call each (a lookup source's scoring, auto's merged rates, the
# outcomes that decide waiting nodes), included by _native.pyx. They read and write the Calibration's
# own dicts (key tuple -> [hits, trials]), so the rates are the same doubles as Calibration.rate's;
# the Python loops of lookupdec/drafters/calibrate.py are the slow references in the tests.

from libc.math cimport pow, fmin
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

cdef double _raw_edges[16]
cdef double _match_edges[16]
cdef double _depth_edges[16]
cdef int _n_raw = -1, _n_match = -1, _n_depth = -1


def calib_edges(raw, match, depth):
    """Set the bucket edges (``calibrate.RAW_EDGES``, ``MATCH_EDGES``, ``DEPTH_EDGES``; at most 16 each)."""
    global _n_raw, _n_match, _n_depth
    cdef int i
    for edges, n in ((raw, 0), (match, 1), (depth, 2)):
        if len(edges) > 16:
            raise ValueError("calib_edges: at most 16 edges a kind")
    for i in range(len(raw)):
        _raw_edges[i] = raw[i]
    for i in range(len(match)):
        _match_edges[i] = match[i]
    for i in range(len(depth)):
        _depth_edges[i] = depth[i]
    _n_raw, _n_match, _n_depth = len(raw), len(match), len(depth)


cdef inline long _bucket(const double *edges, int n, double v) noexcept nogil:
    """``bisect_right(edges, v)``: how many edges are at most ``v``."""
    cdef int i = 0
    while i < n and not (v < edges[i]):  # bisect's own test (a NaN goes past every edge, as there)
        i += 1
    return i


cdef double _rate(list levels, tuple key, tuple coarse, double prior) except? -1.0:
    """``Calibration.rate(key, prior)`` over ``levels``: ``(fine, coarse, discount, weight)`` per
    Calibration, the greedy root first and the band asked for last."""
    cdef double r = prior, w, hc, tc, hf, tf, c
    cdef PyObject *s
    cdef Py_ssize_t j
    for j in range(len(levels)):
        fine_d, coarse_d, disc, weight = <tuple>levels[j]
        if j:
            r = r * <double>disc
        w = weight
        s = PyDict_GetItem(coarse_d, coarse)
        if s is NULL:
            hc, tc = 0.0, 0.0
        else:
            hc, tc = (<list?><object>s)[0], (<list?><object>s)[1]  # (checked: [hits, trials] lists)
        c = (hc + w * r) / (tc + w)
        s = PyDict_GetItem(fine_d, key)
        if s is NULL:
            hf, tf = 0.0, 0.0
        else:
            hf, tf = (<list?><object>s)[0], (<list?><object>s)[1]
        r = (hf + w * c) / (tf + w)
    return r


cdef inline void _observe(dict fine, dict coarse_d, tuple key, double h):
    s = fine.get(key)
    if s is None:
        fine[key] = [h, 1.0]
    else:
        (<list?>s)[0] = <double>(<list?>s)[0] + h
        (<list?>s)[1] = <double>(<list?>s)[1] + 1.0
    coarse = key[:len(key) - 1]  # (no negative index: the module compiles with wraparound off)
    s = coarse_d.get(coarse)
    if s is None:
        coarse_d[coarse] = [h, 1.0]
    else:
        (<list?>s)[0] = <double>(<list?>s)[0] + h
        (<list?>s)[1] = <double>(<list?>s)[1] + 1.0


cdef int _score_loop(list levels, str src, Py_ssize_t n, const int32_t *parents, const double *raws,
                     const long *lens, long one_len, bint grow, double *sc, long *dp, list keys) except -1:
    """calib_score's loop: ``sc[i]`` node i's path score, ``dp[i]`` its depth, ``keys[i]`` its key
    (``lens`` NULL: ``one_len`` is every node's match length)."""
    cdef Py_ssize_t i
    cdef long p, d, m
    cdef double r, c, prior
    if _n_raw < 0:
        raise RuntimeError("calib_score: calib_edges was never called")
    for i in range(n):
        p = parents[i]
        if p >= i:
            raise ValueError("calib_score: a parent after its child")
        d = 1 if p < 0 else dp[p] + 1
        dp[i] = d
        r = raws[i]
        m = (one_len if lens is NULL else lens[i])
        if grow:
            m = m + d - 1
        a, b, k = _bucket(_raw_edges, _n_raw, r), _bucket(_match_edges, _n_match, <double>m), \
            _bucket(_depth_edges, _n_depth, <double>d)
        key = (src, a, b, k)
        prior = r * fmin(0.9, 0.35 + 0.1 * m) * pow(0.92, <double>(d - 1))
        c = _rate(levels, key, (src, a, b), prior)
        sc[i] = c if p < 0 else sc[p] * c
        keys[i] = key
    return 0


def calib_score(list levels, str src, list parents, list raws, list lens, bint grow):
    """``NodeScorer.score``'s loop with ``lookup_prior``: per node its depth, key and path score.

    ``parents`` come before their children; ``lens[i]``, node i's match length (grown by its depth
    when ``grow``). Returns ``(scores, depth, keys)`` as lists.
    """
    cdef Py_ssize_t n = len(parents), i
    cdef long v
    if len(raws) != n or len(lens) != n:
        raise ValueError("calib_score: raws and lens must match parents")
    keys = [None] * n
    cdef double *sc = <double *>malloc(max(n, 1) * sizeof(double))
    cdef long *dp = <long *>malloc(max(n, 1) * sizeof(long))
    cdef int32_t *par = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    cdef double *rw = <double *>malloc(max(n, 1) * sizeof(double))
    cdef long *ln = <long *>malloc(max(n, 1) * sizeof(long))
    try:
        if sc is NULL or dp is NULL or par is NULL or rw is NULL or ln is NULL:
            raise MemoryError()
        for i in range(n):
            v = parents[i]
            if v >= i:
                raise ValueError("calib_score: a parent after its child")
            par[i] = <int32_t>v if v >= 0 else -1  # (any negative parent: a root child, as before)
            rw[i] = raws[i]
            ln[i] = lens[i]
        _score_loop(levels, src, n, par, rw, ln, 0, grow, sc, dp, keys)
        return [sc[i] for i in range(n)], [dp[i] for i in range(n)], keys
    finally:
        free(sc)
        free(dp)
        free(par)
        free(rw)
        free(ln)


def calib_merged(list levels, list scores, list agree, list depth):
    """``MergedCalibration.apply``'s rates: node i's key ``("auto", score bin, sources, depth
    bucket)`` and its rate with the path score as prior. Returns ``(rated, keys)`` as lists."""
    cdef Py_ssize_t n = len(scores), i
    cdef double s
    cdef long a
    if len(agree) != n or len(depth) != n:
        raise ValueError("calib_merged: agree and depth must match scores")
    if _n_depth < 0:
        raise RuntimeError("calib_merged: calib_edges was never called")
    rated = [0.0] * n
    keys = [None] * n
    for i in range(n):
        s = scores[i]
        if not (s == s):
            raise ValueError("calib_merged: a NaN path score")
        a = agree[i]
        key = ("auto", <long>(fmin(s, 0.999) * 20), a if a < 3 else 3,
               _bucket(_depth_edges, _n_depth, <double><long>depth[i]))
        rated[i] = _rate(levels, key, key[:3], s)
        keys[i] = key
    return rated, keys


def calib_learn(dict fine, dict coarse, list waiting, list seen, bint conditional):
    """``Outcomes.learn``'s loop over its waiting proposals, once ``seen`` holds the new tokens:
    observes every node now decided into ``fine`` / ``coarse`` and returns the proposals still
    waiting (before the horizon's cut)."""
    cdef Py_ssize_t have_all = len(seen), n, at, i, base, have
    cdef long d, p
    keep = []
    for w in waiting:
        order, base = w.order, w.start
        n = len(order)
        tokens, parents, depth, keys, state = w.tokens, w.parents, w.depth, w.keys, w.state
        have = have_all - base
        at = w.at
        deepest = w.deepest
        while at < n:
            i = order[at]
            d = depth[i]
            if d < 1:  # (the token list is read unchecked below: a depth is 1 or more)
                raise ValueError("calib_learn: a node at depth below 1")
            if d > have:
                break
            at += 1
            p = parents[i]
            if p >= 0 and state[p] is not True:
                if not conditional:  # under a path that did not follow: a miss
                    state[i] = False
                    _observe(fine, coarse, keys[i], 0.0)
                continue
            hit = tokens[i] == seen[base + d - 1]
            state[i] = hit
            if hit:
                deepest = d
            _observe(fine, coarse, keys[i], 1.0 if hit else 0.0)
        w.at = at
        w.deepest = deepest
        if at < n:
            if <long>depth[order[at]] - 1 <= <long>deepest:
                keep.append(w)
            elif not conditional:
                for j in range(at, n):
                    _observe(fine, coarse, keys[order[j]], 0.0)
    return keep


cdef struct _cand:
    double neg      # minus the candidate's path score
    int64_t order   # push order: ties pop first-pushed first
    int64_t parent
    int64_t token
    int64_t rank
    double prob
    int64_t depth


cdef inline bint _before(const _cand *a, const _cand *b) noexcept nogil:
    return a.neg < b.neg or (a.neg == b.neg and a.order < b.order)


cdef void _heap_push(_cand *heap, Py_ssize_t *size, _cand c) noexcept nogil:
    cdef Py_ssize_t i = size[0], up
    size[0] += 1
    while i > 0:
        up = (i - 1) // 2
        if not _before(&c, &heap[up]):
            break
        heap[i] = heap[up]
        i = up
    heap[i] = c


cdef _cand _heap_pop(_cand *heap, Py_ssize_t *size) noexcept nogil:
    cdef _cand top = heap[0], last
    cdef Py_ssize_t i = 0, child, n
    size[0] -= 1
    n = size[0]
    if n > 0:
        last = heap[n]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _before(&heap[child + 1], &heap[child]):
                child += 1
            if not _before(&heap[child], &last):
                break
            heap[i] = heap[child]
            i = child
        heap[i] = last
    return top


def recycle_expand(list levels, const int64_t[:, ::1] ids, const float[:, ::1] probs, int64_t root, list breadth,
                   Py_ssize_t max_nodes, Py_ssize_t depth_cap):
    """``recycle.expand`` with Token Recycling's calibrated rate, in one call: best-first by path score
    (ties: first pushed), each node's conditional the rate (``Calibration.rate`` over ``levels``) of key
    ``("recycle", rank, probability bucket, depth bucket)`` with prior ``0.7 * probability``; at most
    ``breadth[d - 1]`` children at depth ``d``, none deeper than ``depth_cap``, ``max_nodes`` in all.

    Returns ``(tokens, parents, scores, depth, keys)`` as lists, nodes in the order taken (parents
    first). ``tests/oracles/recycle.py``'s ``expand`` with ``RecycleDrafter._rate`` is the reference.
    """
    cdef Py_ssize_t n_tok = ids.shape[0], k = ids.shape[1], size = 0, cap, j, r, most
    cdef int64_t counter = 0, node, tok
    cdef double p, c, score
    cdef _cand cand, got
    if probs.shape[0] != n_tok or probs.shape[1] != k:
        raise ValueError("recycle_expand: ids and probs differ in shape")
    if _n_raw < 0:
        raise RuntimeError("recycle_expand: calib_edges was never called")
    depth_cap = min(depth_cap, len(breadth))
    tokens, parents, scores, depth, keys = [], [], [], [], []
    if max_nodes <= 0 or depth_cap <= 0:
        return tokens, parents, scores, depth, keys
    cap = 1 + k * (max_nodes + 1)
    cdef _cand *heap = <_cand *>malloc(cap * sizeof(_cand))
    if heap is NULL:
        raise MemoryError()
    try:
        # (parent, token, path score, depth) whose children are pushed next: the root first.
        node, tok, score, d = -1, root, 1.0, 1
        while True:
            if d <= depth_cap and 0 <= tok < n_tok:
                most = min(<Py_ssize_t>breadth[d - 1], k)
                for r in range(most):
                    if ids[tok, r] < 0:
                        break
                    p = probs[tok, r]
                    a, b, e = r, _bucket(_raw_edges, _n_raw, p), _bucket(_depth_edges, _n_depth, <double>d)
                    c = _rate(levels, ("recycle", a, b, e), ("recycle", a, b), p * 0.7)
                    if c <= 0.0:
                        continue
                    cand.neg, cand.order, cand.parent, cand.token = -(score * c), counter, node, ids[tok, r]
                    cand.rank, cand.prob, cand.depth = r, p, d
                    counter += 1
                    _heap_push(heap, &size, cand)
            if size == 0 or len(tokens) >= max_nodes:
                break
            got = _heap_pop(heap, &size)
            node = len(tokens)
            tokens.append(got.token)
            parents.append(got.parent)
            scores.append(-got.neg)
            depth.append(got.depth)
            keys.append(("recycle", got.rank, _bucket(_raw_edges, _n_raw, got.prob),
                         _bucket(_depth_edges, _n_depth, <double>got.depth)))
            tok, score, d = got.token, -got.neg, got.depth + 1
    finally:
        free(heap)
    return tokens, parents, scores, depth, keys
