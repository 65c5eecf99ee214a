"""Slow, exact reference for one speculative-sampling step on a tiny vocabulary.

Everything random is enumerated: the draft's draws (each with its
probability under the draft's distributions, siblings without replacement)
and the acceptance walk's coin flips and bonus draw (``accept_walk`` run
once per branch of its decisions). The result is the exact law of the first
``k`` tokens a step emits, continued by plain sampling from the target when
the step emits fewer; for an exact rule it equals the target's own law.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch

from lookupdec.accept import accept_walk
from lookupdec.tree import DraftTree

Dist = Callable[[tuple], np.ndarray]  # context (tuple of tokens) -> probabilities


class _Need(Exception):
    def __init__(self, kind, value):
        self.kind, self.value = kind, value


def walk_law(tree: DraftTree, target: Dist, ctx: tuple) -> dict[tuple, float]:
    """Exact law of the tokens ``accept_walk`` emits for ``tree`` (every coin and draw enumerated)."""
    def rows(r):
        path = () if r == 0 else tuple(tree.path_tokens(r - 1))
        return torch.from_numpy(target(ctx + path))

    law: dict[tuple, float] = {}
    todo = [[]]
    while todo:
        script = todo.pop()
        pos = [0]
        weight = [1.0]

        def coin(ratio):
            if pos[0] == len(script):
                raise _Need("coin", ratio)
            d = script[pos[0]]
            pos[0] += 1
            weight[0] *= ratio if d else 1.0 - ratio
            return d

        def draw(p):
            if pos[0] == len(script):
                raise _Need("draw", p)
            y = script[pos[0]]
            pos[0] += 1
            weight[0] *= float(p[y])
            return y

        try:
            acc = accept_walk(tree, rows, coin, draw)
        except _Need as need:
            if need.kind == "coin":
                todo += [script + [True], script + [False]]
            else:
                todo += [script + [int(y)] for y in torch.nonzero(need.value).flatten().tolist()]
            continue
        if weight[0] > 0:
            law[acc.tokens] = law.get(acc.tokens, 0.0) + weight[0]
    return law


def draft_trees(shape: str, draft: Dist, ctx: tuple, vocab: int, renormalise: bool = True):
    """Every tree the draft can produce for ``shape`` with its probability.

    Shapes: ``chain`` (x ~ q, then z ~ q(.|x)), ``tree`` (x ~ q, sibling y ~ q
    without x, z ~ q(.|x) under x). ``renormalise=False`` stores q itself as the
    sibling's proposal (wrong: it was drawn without x) to show the check's power.
    """
    q0 = draft(ctx)
    for x in range(vocab):
        if q0[x] == 0:
            continue
        q1 = draft(ctx + (x,))
        siblings = [None] if shape == "chain" else [y for y in range(vocab) if y != x and q0[y] > 0]
        for y, z in itertools.product(siblings, range(vocab)):
            if q1[z] == 0:
                continue
            w = q0[x] * q1[z]
            if y is None:
                tree = DraftTree(np.array([x, z]), np.array([-1, 0]), q=np.stack([q0, q1]))
            else:
                rest = q0.copy()
                rest[x] = 0.0
                rest /= rest.sum()
                w *= rest[y]
                tree = DraftTree(np.array([x, y, z]), np.array([-1, -1, 0]),
                                 q=np.stack([q0, rest if renormalise else q0, q1]))
            yield tree, float(w)


def step_law(shape: str, target: Dist, draft: Dist, ctx: tuple, vocab: int, k: int = 3,
             renormalise: bool = True) -> np.ndarray:
    """Exact law ``(vocab,) * k`` of the first ``k`` tokens: one drafted step, then plain target sampling."""
    out = np.zeros((vocab,) * k)
    for tree, w in draft_trees(shape, draft, ctx, vocab, renormalise):
        for toks, pw in walk_law(tree, target, ctx).items():
            _extend(out, target, ctx, toks[:k], w * pw, k)
    return out


def target_law(target: Dist, ctx: tuple, vocab: int, k: int = 3) -> np.ndarray:
    out = np.zeros((vocab,) * k)
    _extend(out, target, ctx, (), 1.0, k)
    return out


def _extend(out, target, ctx, toks, w, k):
    if len(toks) == k:
        out[toks] += w
        return
    p = target(ctx + tuple(toks))
    for y in range(len(p)):
        if p[y] > 0:
            _extend(out, target, ctx, tuple(toks) + (y,), w * float(p[y]), k)
