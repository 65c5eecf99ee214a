# auto's selection scan (lookupdec.drafters.select.select_nodes), included by _native.pyx.

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
