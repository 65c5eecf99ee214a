# auto's merge of its sources' trees into one trie in one call, included by _native.pyx.
# tests/oracles/merge.py is the slow reference (the loop in Python, a dict by (parent, token)).


def merge_arrays(list trees):
    """``merge_trees``' trie: ``trees`` holds ``(tokens int64, parents int32, scores float64, sources
    int16)`` per tree, each a valid tree (parents before children). A node is the merged node of its
    parent's merged node and its token (made in input order); it keeps the highest score of the
    nodes merged into it and that node's source (the first on ties).

    Returns ``(tokens, parents, scores, sources, depth, path, maps, agree)``: the merged arrays, the
    depths as a list, the path scores (``DraftTree.path_scores``: each score capped by its parent's), per tree the int64 merged node of each of its nodes, and per merged node how many
    trees proposed it (a tree counted once however many of its nodes fall on it).
    """
    cdef Py_ssize_t total = 0, k, j, n, cnt = 0
    cdef int64_t tok, c, mp, root_first = -1, root_last = -1
    cdef int32_t p
    cdef const int64_t[::1] tt
    cdef const int32_t[::1] pp
    cdef const double[::1] ss
    cdef const int16_t[::1] rr
    cdef int64_t[::1] where
    for t in trees:
        total += len(t[0])
    toks = np.empty(total, np.int64)
    pars = np.empty(total, np.int32)
    scs = np.empty(total, np.float64)
    srcs = np.empty(total, np.int16)
    cdef int64_t[::1] o_tok = toks
    cdef int32_t[::1] o_par = pars
    cdef double[::1] o_sc = scs
    cdef int16_t[::1] o_src = srcs
    cdef double[::1] o_path
    cdef int64_t *first = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    cdef int64_t *last = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    cdef int64_t *sib = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    cdef int64_t *dep = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    cdef int64_t *mark = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    cdef int64_t *agr = <int64_t *>malloc(max(total, 1) * sizeof(int64_t))
    maps = []
    try:
        if first is NULL or last is NULL or sib is NULL or dep is NULL or mark is NULL or agr is NULL:
            raise MemoryError()
        for k in range(len(trees)):
            tt, pp, ss, rr = trees[k]
            n = tt.shape[0]
            if pp.shape[0] != n or ss.shape[0] != n or rr.shape[0] != n:
                raise ValueError("merge_arrays: a tree's arrays differ in length")
            w = np.empty(n, np.int64)
            where = w
            for j in range(n):
                tok, p = tt[j], pp[j]
                if p >= j:
                    raise ValueError("merge_arrays: a parent after its child")
                mp = where[p] if p >= 0 else -1
                c = first[mp] if mp >= 0 else root_first
                while c >= 0 and o_tok[c] != tok:
                    c = sib[c]
                if c < 0:
                    c = cnt
                    cnt += 1
                    o_tok[c], o_par[c], o_sc[c], o_src[c] = tok, <int32_t>mp, ss[j], rr[j]
                    dep[c] = dep[mp] + 1 if mp >= 0 else 1
                    first[c] = last[c] = sib[c] = -1
                    mark[c] = -1
                    agr[c] = 0
                    if mp >= 0:  # appended to its parent's children
                        if first[mp] < 0:
                            first[mp] = c
                        else:
                            sib[last[mp]] = c
                        last[mp] = c
                    else:
                        if root_first < 0:
                            root_first = c
                        else:
                            sib[root_last] = c
                        root_last = c
                elif ss[j] > o_sc[c]:
                    o_sc[c], o_src[c] = ss[j], rr[j]
                where[j] = c
                if mark[c] != k:
                    mark[c] = k
                    agr[c] += 1
            maps.append(w)
        depth = [dep[j] for j in range(cnt)]
        agree = [agr[j] for j in range(cnt)]
        path = np.empty(cnt, np.float64)
        o_path = path
        for j in range(cnt):  # parents come first: their path scores are final
            mp = o_par[j]
            o_path[j] = o_path[mp] if mp >= 0 and o_sc[j] > o_path[mp] else o_sc[j]
    finally:
        free(first)
        free(last)
        free(sib)
        free(dep)
        free(mark)
        free(agr)
    return toks[:cnt], pars[:cnt], scs[:cnt], srcs[:cnt], depth, path, tuple(maps), agree
