# auto's choice of a step's nodes in one call, included by _native.pyx: its sources' trees merged
# (merge_arrays), the merged tree's rates (calib_merged's loop), the selection (select_scan), the
# chosen subtree (subset_arrays) and each source's share of the step (ledger.step_shares). Right
# after a forward each Python step between these cost 5-35 us; auto's Python route (merge_trees,
# MergedCalibration.apply, select_nodes, DraftTree.subset, step_shares) is the reference in the tests.


def auto_choose(list trees, list levels, const double[::1] cost, int64_t budget, int64_t max_depth,
                double margin, list spent, list window_costs):
    """The merged, rated and selected tree of one ``auto`` step.

    Args:
        trees: per source its DraftTree (deterministic: merge_trees' other case stays in Python).
        levels: ``Calibration.levels()`` of the band decoded at.
        cost: ``cost[w]``, the modelled ms of ``w`` rows beside the step's window (index 0 unused).
        budget, max_depth, margin: as ``select_nodes``.
        spent: per source, its drafting ms this step (``step_shares``).
        window_costs: per source, None when it runs no window rows, else ``cost`` without its rows:
            what its rows add to the step is the difference at the chosen width.

    Returns None when no source proposed a node, else ``(merged, rated, record, nodes, sub, shares)``: ``merged`` = merge_arrays' ``(tokens,
    parents, scores, sources, depth, maps, agree)``; ``rated`` the merged nodes' calibrated scores
    (float64); ``record`` = ``(tokens, parents, depth, keys)`` lists for the merged outcomes;
    ``nodes`` the chosen nodes ascending (int64; empty: draft nothing); ``sub`` subset_arrays' arrays
    of them (None when every node is chosen); ``shares`` = ``(rows_ms, forward_ms, owner)``.
    """
    cdef Py_ssize_t n, i, k, u
    cdef double s, forward
    cdef long a
    arrays = []
    n = 0
    for t in trees:
        arrays.append((t.tokens, t.parents, t.scores, t.sources))
        n += len(t.tokens)
    if n == 0:  # nothing proposed (a third of auto's proposals)
        return None
    toks, pars, scs, srcs, depth, path, maps, agree = merge_arrays(arrays)
    n = len(depth)
    if n and _n_depth < 0:
        raise RuntimeError("auto_choose: calib_edges was never called")
    if len(spent) != len(maps) or len(window_costs) != len(maps):
        raise ValueError("auto_choose: spent and window_costs need one entry per tree")
    rated = np.empty(n, np.float64)
    cdef double[::1] rv = rated
    cdef const double[::1] pv = path
    keys = [None] * n
    for i in range(n):  # calib_merged's loop over the path scores
        s = pv[i]
        if not (s == s):
            raise ValueError("auto_choose: a NaN score")
        a = agree[i]
        key = ("auto", <long>(fmin(s, 0.999) * 20), a if a < 3 else 3,
               _bucket(_depth_edges, _n_depth, <double><long>depth[i]))
        rv[i] = _rate(levels, key, key[:3], s)
        keys[i] = key
    nodes, accepted, gain = select_scan(pars, rated, cost, min(budget, n), max_depth, margin)
    k = len(nodes)
    sub = subset_arrays(toks, pars, rated, srcs, None, nodes) if k < n else None
    # step_shares: a node several sources proposed is owned by the cheapest of them (ties in
    # source order); each source is credited with the chosen rows it owns.
    forward = cost[1 + k]
    rows_ms = [0.0 if w is None else forward - <double>w[1 + k] for w in window_costs]
    total = [float(d) + r for d, r in zip(spent, rows_ms)]
    owner = [-1] * n
    cdef const int64_t[::1] wv
    for i in sorted(range(len(maps)), key=total.__getitem__):
        wv = maps[i]
        for u in range(wv.shape[0]):
            if owner[wv[u]] < 0:
                owner[wv[u]] = i
    if k:
        mine = [0] * len(maps)
        for c in nodes.tolist():
            if owner[c] >= 0:
                mine[owner[c]] += 1
        for i in range(len(maps)):
            u = mine[i]
            if u:
                rows_ms[i] += forward - cost[1 + k - u]
    return ((toks, pars, scs, srcs, depth, maps, agree), rated, (toks.tolist(), pars.tolist(), depth, keys),
            nodes, sub, (rows_ms, forward, owner))


def split_outcome(tuple maps, list chosen, accepted, origin_ids, Py_ssize_t n_tree, Py_ssize_t n_merged):
    """A verified ``auto`` step told in each source's own node ids (``AutoDrafter.commit``).

    Args:
        maps: per source, the merged node of each of its nodes (``Merged.maps``).
        chosen: the merged nodes ``auto`` proposed, in its proposal's order.
        accepted: the accepted nodes of the proposal, root to leaf.
        origin_ids: each verified node's node in the proposal (-1: not ``auto``'s); empty: the verified
            tree is the proposal (``n_tree`` nodes).
        n_merged: nodes of the merged tree.

    Returns ``(accepted_merged, parts)``: the accepted nodes' merged nodes, and per source None when
    it proposed nothing or nothing was chosen, else ``(own, origin)``: its accepted nodes up to
    where the accepted path leaves its tree, and each verified node's node in its tree (its first
    node on that merged node; -1: none). ``tests/oracles/choose.py``'s loop is the reference.
    """
    cdef const int64_t[::1] origin = np.ascontiguousarray(origin_ids, np.int64)
    cdef Py_ssize_t k = len(chosen), nv = origin.shape[0] if origin.shape[0] else n_tree, i, j
    cdef int64_t v, m
    cdef const int64_t[::1] wv
    cdef int64_t[::1] ov
    accepted_merged = [chosen[a] for a in accepted]
    for m in accepted_merged:
        if m < 0 or m >= n_merged:
            raise IndexError(f"split_outcome: merged node {m} outside the merged tree's {n_merged}")
    cdef int64_t *vm = <int64_t *>malloc(max(nv, 1) * sizeof(int64_t))
    cdef int64_t *first = <int64_t *>malloc(max(n_merged, 1) * sizeof(int64_t))
    parts = []
    try:
        if vm is NULL or first is NULL:
            raise MemoryError()
        for j in range(nv):  # each verified node's merged node (-1: not auto's)
            v = origin[j] if origin.shape[0] else j
            if k and v >= 0:
                if v >= k:
                    raise IndexError(f"split_outcome: verified node {v} outside the proposal's {k}")
                m = chosen[v]
                if m < 0 or m >= n_merged:
                    raise IndexError(f"split_outcome: merged node {m} outside the merged tree's {n_merged}")
                vm[j] = m
            else:
                vm[j] = -1
        for j in range(n_merged):
            first[j] = -1
        for where in maps:
            wv = where
            if wv.shape[0] == 0 or k == 0:
                parts.append(None)
                continue
            for j in range(wv.shape[0]):
                m = wv[j]
                if m < 0 or m >= n_merged:
                    raise IndexError(f"split_outcome: merged node {m} outside the merged tree's {n_merged}")
                if first[m] < 0:
                    first[m] = j
            own = []
            for m in accepted_merged:  # up to where the accepted path leaves this source's tree
                if first[m] < 0:
                    break
                own.append(first[m])
            o = np.empty(nv, np.int64)
            ov = o
            for j in range(nv):
                ov[j] = first[vm[j]] if vm[j] >= 0 else -1
            parts.append((tuple(own), o))
            for j in range(wv.shape[0]):
                first[wv[j]] = -1
    finally:
        free(vm)
        free(first)
    return accepted_merged, parts
