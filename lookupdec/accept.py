"""Acceptance walks over a verified DraftTree: greedy, exact speculative sampling, the most likely path.

Each walk starts at the root (row 0) and visits only the rows it needs, so
the verifier can compute logit rows lazily. ``lookupdec.verify`` re-exports
these names for older imports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np  # noqa: F401  (main_path's example)
import torch

from lookupdec.tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """The outcome of one verification step.

    Attributes:
        nodes: indices of the accepted tree nodes, root to leaf (may be empty).
        tokens: the tokens to append: the accepted nodes' tokens, then the
            bonus token the target chose after the last accepted node.

    Example:
        >>> Acceptance(nodes=(0, 1), tokens=(5, 6, 9)).accepted
        2
    """

    nodes: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return len(self.nodes)


def greedy_accept(tree: DraftTree, argmax: Sequence[int] | Callable[[int], int]) -> Acceptance:
    """Longest path whose tokens equal the target's argmax, plus the bonus token.

    Args:
        tree: the verified draft tree.
        argmax: the target's argmax token for row 0 (root) and each node row, as a
            sequence or a function of the row (called only for the rows the walk visits).
    Returns:
        The accepted nodes and the tokens to append.
    Example:
        >>> t = DraftTree.from_sequences([[5, 6], [7]])      # nodes 0:5 1:6 2:7
        >>> greedy_accept(t, [7, 0, 0, 3])                   # root -> 7, then node 2 -> 3
        Acceptance(nodes=(2,), tokens=(7, 3))
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    at = argmax if callable(argmax) else argmax.__getitem__
    node, nodes, out = -1, [], []
    while True:
        want = int(at(node + 1))
        nxt = next((c for c in children.get(node, ()) if toks[c] == want), None)
        out.append(want)
        if nxt is None:
            return Acceptance(tuple(nodes), tuple(out))
        nodes.append(nxt)
        node = nxt


def sample_accept(tree: DraftTree, row_probs: Callable[[int], torch.Tensor], generator: torch.Generator | None) -> Acceptance:
    """Exact speculative sampling for a tree of deterministic drafts.

    At node ``u`` with target distribution ``p`` (row ``u + 1``), the children
    are tried in order. A deterministic draft proposes child token ``x`` with
    probability 1, so the acceptance ratio ``min(1, p(x)/q(x))`` is ``p(x)``;
    on rejection the residual ``max(p - q, 0)`` is ``p`` with ``x`` removed,
    renormalised, and the next child is tried against it. When every child is
    rejected (or ``u`` is a leaf) the bonus token is drawn from the current
    residual. Each emitted token is therefore distributed exactly as ``p``.

    Args:
        tree: the verified draft tree.
        row_probs: returns the target distribution (1-D, sums to 1) of a row
            (0 = root, ``1 + i`` = node ``i``); called only for visited rows.
        generator: torch CPU generator for the uniform draws (seedable).
    Returns:
        The accepted nodes and the tokens to append.
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    node, nodes, out = -1, [], []
    while True:
        p = row_probs(node + 1).to(device="cpu", dtype=torch.float64)
        nxt = None
        residual_changed = False
        for c in children.get(node, ()):
            x = toks[c]
            px = float(p[x]) if x < p.shape[0] else 0.0
            if px > 0.0 and float(torch.rand((), generator=generator, dtype=torch.float64)) < px:
                nxt = c
                break
            if px > 0.0:
                if not residual_changed:
                    p = p.clone()
                    residual_changed = True
                p[x] = 0.0
                p /= p.sum()
        if nxt is None:
            out.append(int(torch.multinomial(p, 1, generator=generator).item()))
            return Acceptance(tuple(nodes), tuple(out))
        nodes.append(nxt)
        out.append(toks[nxt])
        node = nxt


def main_path(tree: DraftTree) -> list[int]:
    """Nodes on the tree's most likely path: from the root, the highest-scoring child each time (first on ties).

    Example:
        >>> main_path(DraftTree(np.array([5, 6, 7]), np.array([-1, 0, -1]), np.array([0.2, 0.2, 0.6])))
        [2]
    """
    best: dict[int, int] = {}
    scores = tree.scores.tolist()
    for i, p in enumerate(tree.parents.tolist()):
        if p not in best or scores[i] > scores[best[p]]:
            best[p] = i
    out, node = [], -1
    while node in best:
        node = best[node]
        out.append(node)
    return out
