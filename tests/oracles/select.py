"""Slow reference for ``_native.select_scan`` (``select_nodes``' scan): numpy, one step at a time."""
from __future__ import annotations

import numpy as np

from lookupdec.tree import DraftTree


def select_reference(tree: DraftTree, cost_ms: np.ndarray, budget: int, max_depth: int | None,
                     margin: float) -> tuple[list[int], float, float]:
    """``(nodes ascending, sum of their path scores, gain)`` as ``select_nodes`` defines them: the
    nodes ranked best first (``DraftTree.ranked``), the prefix with the best ``(1 + S_k) / c(1 + k)``,
    nothing unless it beats a plain step by ``margin``."""
    limit = min(budget, len(tree), len(cost_ms) - 2)
    if limit <= 0:
        return [], 0.0, 1.0
    scores = tree.path_scores()
    ranked = tree.ranked(max_depth)[:limit]
    if not len(ranked):
        return [], 0.0, 1.0
    sums = np.cumsum(scores[ranked])
    gains = (1.0 + sums) / cost_ms[2:2 + len(ranked)]
    k = int(np.argmax(gains)) + 1
    best = float(gains[k - 1]) * float(cost_ms[1])
    if best <= 1.0 + margin:
        return [], 0.0, 1.0
    return sorted(ranked[:k].tolist()), float(sums[k - 1]), best
