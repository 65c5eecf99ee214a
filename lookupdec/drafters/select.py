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

from lookupdec._native import select_scan
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
    c1 = float(cost_ms[1])
    # One native call: path scores, ranking, the scan over its prefixes and the choice (numpy's
    # lexsort, cumsum and argmax cost ~60 us a drafting step right after a forward). Its slow
    # reference is tests/oracles/select.py.
    nodes, accepted, gain = select_scan(_as_i32(tree.parents), _as_f64(tree.scores), _as_f64(cost_ms),
                                        min(int(budget), len(tree)), _MAX_DEPTH if max_depth is None else int(max_depth),
                                        float(margin))
    if not len(nodes):
        return Selection(nodes, 1.0, c1, 1.0)
    return Selection(nodes, 1.0 + accepted, float(cost_ms[1 + len(nodes)]), gain)


def _as_i32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.int32 and x.flags.c_contiguous else np.ascontiguousarray(x, np.int32)


def _as_f64(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float64 and x.flags.c_contiguous else np.ascontiguousarray(x, np.float64)


_MAX_DEPTH = 2**62
