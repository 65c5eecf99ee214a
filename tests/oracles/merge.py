"""Slow reference for ``_native.merge_arrays`` (``merge_trees``' trie): a dict by (merged parent, token)."""
from __future__ import annotations


def merge_reference(trees) -> tuple[list, list, list, list, list, list, list]:
    """``(tokens, parents, scores, sources, depth, maps, agree)`` as lists: each node becomes the merged
    node of (its parent's merged node, its token), made in input order; a merged node keeps the highest
    score (first on ties) and that node's source; ``agree``: trees that proposed it."""
    index: dict[tuple[int, int], int] = {}
    toks, pars, depth, scores, srcs, maps = [], [], [], [], [], []
    for tree in trees:
        where: list[int] = []
        for tok, par, sc, src in zip(tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist(),
                                     tree.sources.tolist()):
            key = (where[par] if par >= 0 else -1, tok)
            node = index.get(key)
            if node is None:
                node = index[key] = len(toks)
                toks.append(tok)
                pars.append(key[0])
                depth.append(depth[key[0]] + 1 if key[0] >= 0 else 1)
                scores.append(sc)
                srcs.append(src)
            elif sc > scores[node]:
                scores[node], srcs[node] = sc, src
            where.append(node)
        maps.append(where)
    agree = [0] * len(toks)
    for where in maps:
        for m in set(where):
            agree[m] += 1
    return toks, pars, scores, srcs, depth, maps, agree
