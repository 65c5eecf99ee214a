"""Slow reference for ``_native.recycle_expand`` (Token Recycling's proposal): the expansion in Python,
best-first with a heap, the rate a callback (``RecycleDrafter._rate`` for the drafter's own)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from lookupdec.drafters.base import SOURCES
from lookupdec.drafters.recycle import RecycleTable
from lookupdec.tree import DraftTree


@dataclass(frozen=True)
class Expansion:
    """A tree expanded from the table, with what each node was scored by.

    Attributes:
        tree: the draft (scores: path scores).
        ranks: each node's rank among its parent's candidates (0 = most likely).
        probs: the probability the table gave each node.
        conditional: each node's score given its parent's path.
    """

    tree: DraftTree
    ranks: np.ndarray
    probs: np.ndarray
    conditional: np.ndarray


def expand(table: RecycleTable, root: int, breadth: Sequence[int], max_nodes: int,
           rate: Callable[[int, float, int], float], max_depth: int | None = None) -> Expansion:
    """Expand ``table`` from ``root`` best-first by path score.

    Args:
        table: the adjacency table.
        root: the last committed token.
        breadth: most children of a node at depth 1, 2, ...
        max_nodes: most nodes.
        rate: ``rate(rank, prob, depth)`` a node's conditional acceptance (in [0, 1]).
        max_depth: deepest node (default ``len(breadth)``).
    Returns:
        An Expansion; nodes in the order taken, so parents precede children.

    Example:
        >>> t = RecycleTable(2)
        >>> t.update(np.array([1, 2]), np.array([[2, 3], [4, 5]]), np.array([[0.6, 0.3], [0.9, 0.1]], np.float32))
        >>> e = expand(t, 1, (2, 1), 8, lambda r, p, d: p)
        >>> e.tree.tokens.tolist(), e.tree.parents.tolist()
        ([2, 4, 3], [-1, 0, -1])
    """
    depth_cap = len(breadth) if max_depth is None else min(len(breadth), int(max_depth))
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    ranks: list[int] = []
    probs: list[float] = []
    cond: list[float] = []
    heap: list[tuple[float, int, int, int, int, float, float, int]] = []
    counter = 0

    def push_children(parent: int, token: int, score: float, depth: int) -> None:
        nonlocal counter
        if depth > depth_cap:
            return
        ids, ps = table.successors(token, breadth[depth - 1])
        for r, (tok, p) in enumerate(zip(ids, ps)):
            c = float(rate(r, p, depth))
            if c <= 0.0:
                continue
            heapq.heappush(heap, (-score * c, counter, parent, tok, r, p, c, depth))
            counter += 1

    if max_nodes > 0:
        push_children(-1, int(root), 1.0, 1)
    while heap and len(tokens) < max_nodes:
        neg, _, parent, tok, r, p, c, depth = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        scores.append(-neg)
        ranks.append(r)
        probs.append(p)
        cond.append(c)
        push_children(node, tok, -neg, depth + 1)
    n = len(tokens)
    # Valid by construction (each parent taken before its children): no re-check per step.
    tree = DraftTree.trusted(np.array(tokens, np.int64), np.array(parents, np.int32), np.array(scores, np.float64),
                             np.full(n, SOURCES["recycle"], np.int16))
    return Expansion(tree, np.array(ranks, np.int64), np.array(probs, np.float64), np.array(cond, np.float64))
