# A drafting step's small loops in one call each (auto's selection scan, a tree's cut, Token Recycling's
# table update), included by _native.pyx. Each has a slow reference in the tests.

from libc.stdint cimport int16_t
from libc.stdlib cimport malloc, free, qsort


cdef struct _ranked_node:
    double neg  # minus the node's path score
    int64_t depth
    int64_t index


cdef int _rank_cmp(const void *a, const void *b) noexcept nogil:
    cdef const _ranked_node *x = <const _ranked_node *>a
    cdef const _ranked_node *y = <const _ranked_node *>b
    if x.neg != y.neg:
        return -1 if x.neg < y.neg else 1
    if x.depth != y.depth:
        return -1 if x.depth < y.depth else 1
    return -1 if x.index < y.index else (1 if x.index > y.index else 0)


def select_scan(const int32_t[::1] parents, const double[::1] scores, const double[::1] cost, int64_t limit,
                int64_t max_depth, double margin):
    """The selection of ``select_nodes`` in one call: path scores, depths, the ranking (path score
    descending, then shallower, then index), the expected-rate scan over its prefixes and the choice.

    ``parents`` must come before their children (a valid ``DraftTree``); ``cost[w]``, the modelled ms
    of ``w`` rows, is read for w in 1..limit + 1 (the caller bounds ``limit`` by its length).
    Returns ``(nodes, accepted, gain)``: the chosen node indices ascending (int64; empty: draft
    nothing), the sum of their path scores and the rate over a plain step's (1.0 for nothing).
    ``tests/oracles/select.py`` is the slow reference.
    """
    cdef int64_t n = parents.shape[0], i, m = 0, k = 0, j
    cdef int32_t p
    cdef double c1, total = 0.0, g, best = -1.0, at_best = 0.0
    cdef int64_t[::1] out
    if scores.shape[0] != n or cost.shape[0] < 2:
        raise ValueError("select_scan: scores must match parents and cost hold widths 0 and 1")
    if limit > n:
        limit = n
    if limit > cost.shape[0] - 2:
        limit = cost.shape[0] - 2
    c1 = cost[1]
    if limit <= 0 or n == 0:
        return _NO_NODES, 0.0, 1.0
    cdef _ranked_node *rank = <_ranked_node *>malloc(n * sizeof(_ranked_node))
    cdef double *ps = <double *>malloc(n * sizeof(double))
    cdef int64_t *depth = <int64_t *>malloc(n * sizeof(int64_t))
    if rank == NULL or ps == NULL or depth == NULL:
        free(rank); free(ps); free(depth)
        raise MemoryError("select_scan")
    try:
        for i in range(n):
            p = parents[i]
            if p >= i:
                raise ValueError(f"select_scan: node {i}'s parent {p} does not come before it")
            ps[i] = scores[i]
            if p >= 0:
                if ps[i] > ps[p]:
                    ps[i] = ps[p]
                depth[i] = depth[p] + 1
            else:
                depth[i] = 1
            if depth[i] <= max_depth:
                rank[m].neg = -ps[i]
                rank[m].depth = depth[i]
                rank[m].index = i
                m += 1
        qsort(rank, m, sizeof(_ranked_node), _rank_cmp)
        if m > limit:
            m = limit
        for j in range(m):
            total += ps[rank[j].index]
            g = (1.0 + total) / cost[2 + j]
            if g > best:
                best, k, at_best = g, j + 1, total
        if k == 0 or best * c1 <= 1.0 + margin:
            return _NO_NODES, 0.0, 1.0
        for j in range(k):  # the chosen indices ascending, in ``depth`` (no longer needed): a few dozen
            i = rank[j].index
            m = j
            while m > 0 and depth[m - 1] > i:
                depth[m] = depth[m - 1]
                m -= 1
            depth[m] = i
        nodes = np.empty(k, dtype=np.int64)
        out = nodes
        for j in range(k):
            out[j] = depth[j]
        return nodes, at_best, best * c1
    finally:
        free(rank); free(ps); free(depth)


_NO_NODES = np.zeros(0, dtype=np.int64)
_NO_NODES.flags.writeable = False


def subset_arrays(const int64_t[:] tokens, const int32_t[:] parents, const double[:] scores,
                  const int16_t[:] sources, const int64_t[:] ids, nodes):
    """``DraftTree.subset``'s arrays in one call: the nodes ``nodes`` (which hold every kept node's
    ancestors) in index order, parents renumbered (a parent not kept: -1), provenance composed
    (``ids[kept]``, or the kept indices when ``ids`` is None). Returns
    ``(tokens int64, parents int32, scores float64, sources int16, ids int64)``.
    ``DraftTree.subset``'s numpy form in tests/test_tree.py is the slow reference.
    """
    cdef int64_t n = tokens.shape[0], k, i, j, v
    cdef const int64_t[:] keep_in = np.asarray(nodes, dtype=np.int64)
    if parents.shape[0] != n or scores.shape[0] != n or sources.shape[0] != n or (ids is not None and ids.shape[0] != n):
        raise ValueError("subset_arrays: the tree's arrays differ in length")
    k = keep_in.shape[0]
    keep = np.empty(k, dtype=np.int64)
    cdef int64_t[::1] kv = keep
    for j in range(k):  # ascending (insertion sort: a cut keeps a few dozen nodes)
        v = keep_in[j]
        if v < 0 or v >= n:
            raise IndexError(f"node {v} out of range for a tree of {n} nodes")
        i = j
        while i > 0 and kv[i - 1] > v:
            kv[i] = kv[i - 1]
            i -= 1
        kv[i] = v
    out_tok = np.empty(k, dtype=np.int64)
    out_par = np.empty(k, dtype=np.int32)
    out_sc = np.empty(k, dtype=np.float64)
    out_src = np.empty(k, dtype=np.int16)
    out_ids = np.empty(k, dtype=np.int64)
    cdef int64_t[::1] ot = out_tok, oi = out_ids
    cdef int32_t[::1] op = out_par
    cdef double[::1] osc = out_sc
    cdef int16_t[::1] osr = out_src
    remap = np.full(n, -1, dtype=np.int64) if k else _NO_NODES
    cdef int64_t[::1] rm
    if k:
        rm = remap
    cdef int32_t p
    for j in range(k):
        i = kv[j]
        rm[i] = j
        ot[j] = tokens[i]
        p = parents[i]
        op[j] = <int32_t>rm[p] if p >= 0 else -1
        osc[j] = scores[i]
        osr[j] = sources[i]
        oi[j] = i if ids is None else ids[i]
    return out_tok, out_par, out_sc, out_src, out_ids


def recycle_update(int64_t[:, ::1] ids, float[:, ::1] probs, const int64_t[:] rows,
                   const int64_t[:, :] topk_ids, const float[:, :] topk_probs):
    """Token Recycling's table update (``RecycleTable.update``) in one call: each row's token gets its
    top-k ids and probabilities, in row order (a later row of the same token wins); candidates
    beyond those given are cleared (-1, 0). The caller has grown the table past every row token.
    """
    cdef int64_t R = rows.shape[0], k = ids.shape[1], kk = min(k, topk_ids.shape[1]), r, c, t
    if topk_ids.shape[0] < R or topk_probs.shape[0] < R or topk_probs.shape[1] < kk or probs.shape[1] != k:
        raise ValueError("recycle_update: shapes do not match")
    for r in range(R):
        t = rows[r]
        if t < 0 or t >= ids.shape[0]:
            raise IndexError(f"row token {t} outside the table's {ids.shape[0]} entries")
        for c in range(kk):
            ids[t, c] = topk_ids[r, c]
            probs[t, c] = topk_probs[r, c]
        for c in range(kk, k):
            ids[t, c] = -1
            probs[t, c] = 0.0
