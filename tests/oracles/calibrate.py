"""Slow reference for ``_native.calib_learn`` (``Outcomes.learn``'s loop): the waiting proposals in Python."""
from __future__ import annotations


def learn_reference(calibration, waiting: list, seen: list[int], conditional: bool) -> list:
    """Observe (``calibration.observe``) every node of ``waiting`` that ``seen`` now decides: a node at
    depth ``d`` is decided once ``d`` tokens followed its proposal; under ``conditional`` only where its
    parent's path followed, otherwise a node under a path that did not follow is a miss. Returns the
    proposals still waiting: those with a node left whose parent one level up followed (without
    ``conditional`` the rest of a dropped proposal's nodes are observed as misses)."""
    keep = []
    for w in waiting:
        have = len(seen) - w.start
        while w.at < len(w.order):
            i = w.order[w.at]
            d = w.depth[i]
            if d > have:
                break
            w.at += 1
            p = w.parents[i]
            if p >= 0 and w.state[p] is not True:
                if not conditional:
                    w.state[i] = False
                    calibration.observe(w.keys[i], False)
                continue
            hit = w.tokens[i] == seen[w.start + d - 1]
            w.state[i] = hit
            if hit:
                w.deepest = d
            calibration.observe(w.keys[i], hit)
        if w.at < len(w.order):
            if w.depth[w.order[w.at]] - 1 <= w.deepest:
                keep.append(w)
            elif not conditional:
                for i in w.order[w.at:]:
                    calibration.observe(w.keys[i], False)
    return keep
