"""Choose how much of a scored tree to verify, from the verifier's cost curve.

With calibrated scores, ``scores[i]`` estimates the probability that node
``i``'s path is accepted. Siblings exclude one another under greedy
acceptance, so a tree's expected accepted tokens are the sum of its scores,
and one step yields ``1 + sum`` tokens on average (the bonus token). Its rate
is that over ``c(1 + k)``, the forward's time at width ``1 + k``. The best
ancestor-closed set of ``k`` nodes is the ``k`` best by path score, so the
choice is a scan over ``k``: the ``k`` maximising ``(1 + S_k) / c(1 + k)``,
and ``k = 0`` (a plain step) unless some tree beats it by ``margin``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lookupdec.tree import DraftTree

# A tree must beat a plain step by this share of expected rate to be drafted:
# the drafting and acceptance work outside the forward are not in c(w).
DEFAULT_MARGIN = 0.02


@dataclass(frozen=True)
class Selection:
    """The chosen subtree.

    Attributes:
        nodes: indices (ascending) of the chosen nodes in the scored tree.
        expected_tokens: ``1 + sum`` of their scores.
        ms: modelled forward time at width ``1 + len(nodes)``.
        gain: expected rate over a plain step's (1.0 when nothing is drafted).
    """

    nodes: np.ndarray
    expected_tokens: float
    ms: float
    gain: float


def select_nodes(tree: DraftTree, cost_ms: np.ndarray, budget: int, max_depth: int | None = None,
                 margin: float = DEFAULT_MARGIN) -> Selection:
    """The subtree with the best expected tokens per ms.

    Args:
        tree: candidate nodes, scored.
        cost_ms: ``cost_ms[w]`` = modelled ms of a forward of ``w`` rows, for
            w in 1..len(cost_ms)-1 (``CostCurve.table``).
        budget: most nodes chosen.
        max_depth: deepest node allowed (None: any).
        margin: see ``DEFAULT_MARGIN``.
    Returns:
        A Selection (empty nodes: draft nothing).

    Example:
        >>> t = DraftTree.chain([5, 6, 7], scores=[0.9, 0.8, 0.1])
        >>> flat = np.array([np.inf, 10.0, 10.5, 11.0, 20.0])   # a 4th row costs a lot
        >>> select_nodes(t, flat, budget=8).nodes.tolist()
        [0, 1]
    """
    limit = min(budget, len(tree), len(cost_ms) - 2)
    c1 = float(cost_ms[1])
    if limit <= 0:
        return Selection(np.zeros(0, np.int64), 1.0, c1, 1.0)
    scores = tree.path_scores()
    ranked = tree.ranked(max_depth)[:limit]  # best first: every prefix is ancestor-closed
    if not len(ranked):
        return Selection(np.zeros(0, np.int64), 1.0, c1, 1.0)
    gains = (1.0 + np.cumsum(scores[ranked])) / cost_ms[2:2 + len(ranked)]
    k = int(np.argmax(gains)) + 1
    best = float(gains[k - 1]) * c1
    if best <= 1.0 + margin:
        return Selection(np.zeros(0, np.int64), 1.0, c1, 1.0)
    nodes = np.sort(ranked[:k])
    return Selection(nodes, 1.0 + float(scores[ranked[:k]].sum()), float(cost_ms[1 + k]), best)
