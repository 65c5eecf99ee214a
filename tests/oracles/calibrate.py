"""Slow references for ``_native.calib_learn`` (``Outcomes.learn``'s loop: the waiting proposals in Python)
and ``_native.calib_merged`` (``MergedCalibration.apply``'s keys and rates)."""
from __future__ import annotations

from lookupdec.drafters.calibrate import DEPTH_EDGES, Calibration, bucket


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


def merged_rates(calibration: Calibration, scores: list[float], agree: list[int],
                 depth: list[int]) -> tuple[list[float], list[tuple]]:
    """``MergedCalibration.apply``'s keys and rates in Python (the native call's reference).

    Key: ``("auto", score in 20 bins, sources that proposed the path (up to 3), depth bucket)``;
    the prior is the path score itself.
    """
    keys = [("auto", int(min(s, 0.999) * 20), min(a, 3), bucket(DEPTH_EDGES, d))
            for s, a, d in zip(scores, agree, depth)]
    return [calibration.rate(k, s) for k, s in zip(keys, scores)], keys
