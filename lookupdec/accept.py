"""Acceptance walks over a verified DraftTree: greedy, exact speculative sampling, the most likely path.

Each walk starts at the root (row 0) and visits only the rows it needs, so
the verifier can compute logit rows lazily. ``lookupdec.verify`` re-exports
these names for older imports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from lookupdec.sampling import sample
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
    at = argmax if callable(argmax) else argmax.__getitem__
    if not len(tree):  # a plain step (nothing drafted, or a gate paused drafting): the root's token only
        return Acceptance((), (int(at(0)),))
    children = tree.children()
    toks = tree.tokens.tolist()
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
    """Exact speculative sampling over a tree of deterministic or sampled drafts.

    At node ``u`` the residual ``r`` starts as the target distribution ``p``
    (row ``u + 1``), and the children are tried in order. Child ``x`` with
    proposal ``q_k`` (its row of ``tree.q``; one-hot at ``x`` for a
    deterministic tree) is accepted with probability ``min(1, r(x) / q_k(x))``;
    on rejection ``r <- normalise(max(r - q_k, 0))`` and the next child is
    tried. When every child is rejected (or ``u`` is a leaf) the bonus token is
    drawn from ``r``. A chain is then standard speculative sampling, siblings
    drawn without replacement recursive rejection sampling, and deterministic
    children the one-hot case (accept with ``r(x)``, else remove ``x``).

    Why it is exact: if ``X ~ q_k`` independently of the acceptance draws, one
    try emits ``y`` with probability ``min(q_k(y), r(y))`` and otherwise hands
    on ``max(r - q_k, 0)`` (total mass ``1 - sum min(q_k, r)``), so accepted
    or handed on, ``y`` gets exactly ``r(y)``; by induction over the remaining
    children (each drawn from its own ``q_k`` given everything drawn before
    it, which is what ``tree.q`` must hold) and then the bonus draw, the token
    emitted at ``u`` has law ``p``, and the walk continues below an accepted
    child whose children were drawn given it. A rejected ``x`` had
    ``r(x) < q_k(x)``, so the new residual gives it zero mass: a sibling drawn
    without replacement (``x`` removed from its proposal) loses nothing the
    residual still needs, and no token is proposed twice.

    Args:
        tree: the verified draft tree (``tree.q`` set for sampled drafts).
        row_probs: returns the target distribution (1-D, sums to 1) of a row
            (0 = root, ``1 + i`` = node ``i``); called only for visited rows.
        generator: torch CPU generator for the uniform draws (seedable).
    Returns:
        The accepted nodes and the tokens to append.
    Example:
        >>> t = DraftTree.from_sequences([[2], [5]])
        >>> p = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        >>> sample_accept(t, lambda r: p, None).tokens
        (2, 2)
    """
    def coin(ratio: float) -> bool:
        return float(torch.rand((), generator=generator, dtype=torch.float64)) < ratio

    def draw(p: torch.Tensor) -> int:
        return sample(p, generator)

    return accept_walk(tree, row_probs, coin, draw)


def accept_walk(tree: DraftTree, row_probs: Callable[[int], torch.Tensor], coin: Callable[[float], bool],
                draw: Callable[[torch.Tensor], int]) -> Acceptance:
    """``sample_accept`` with its randomness passed in (tests enumerate it to get exact output laws).

    Args:
        tree, row_probs: as for ``sample_accept``.
        coin: ``coin(a)`` is True with probability ``a`` (an acceptance).
        draw: a token drawn from a probability vector (the bonus token).
    Returns:
        The accepted nodes and the tokens to append.
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    q_rows = tree.q
    node, nodes, out = -1, [], []
    while True:
        p = row_probs(node + 1).to(device="cpu", dtype=torch.float64)
        vocab = p.shape[0]
        nxt = None
        residual_changed = False
        for c in children.get(node, ()):
            x = toks[c]
            px = float(p[x]) if x < vocab else 0.0
            if q_rows is None:
                # Deterministic draft: q is one-hot at x, the ratio is r(x), the residual r without x.
                if px > 0.0 and coin(px):
                    nxt = c
                    break
                if px > 0.0:
                    if not residual_changed:
                        p = p.clone()
                        residual_changed = True
                    p[x] = 0.0
                    p /= p.sum()
                continue
            q = _aligned(q_rows[c], vocab)
            qx = float(q[x])  # > 0: DraftTree.check guarantees the token was drawn from q
            if coin(min(1.0, px / qx)):
                nxt = c
                break
            rest = torch.clamp(p - q, min=0.0)
            mass = float(rest.sum())
            # mass == 0 only when r == q up to rounding: then x's ratio was 1 and this
            # rejection had probability 0 in exact arithmetic; r is the best residual left.
            if mass > 0.0:
                p = rest / mass
                residual_changed = True
        if nxt is None:
            out.append(draw(p))
            return Acceptance(tuple(nodes), tuple(out))
        nodes.append(nxt)
        out.append(toks[nxt])
        node = nxt


def _aligned(q_row, vocab: int) -> torch.Tensor:
    """A proposal row as float64 of the target's vocabulary size.

    A draft vocabulary longer than the target's (padded embedding rows) is cut:
    the target gives those ids 0, so ``max(r - q, 0)`` is 0 there either way.
    A shorter one is padded with zeros (the draft never proposes those ids).
    """
    q = torch.from_numpy(np.asarray(q_row, dtype=np.float64))
    if q.shape[0] >= vocab:
        return q[:vocab]
    return torch.cat([q, torch.zeros(vocab - q.shape[0], dtype=torch.float64)])


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
