"""Scores of ``auto``'s merged tree mapped to observed acceptance (``MergedCalibration``).

Keeping the best of several sources' estimates of a path biases it upward, so
``auto`` calibrates the merged scores once more, by score, by how many
sources proposed the path and by depth, against how often such paths were
accepted.
"""
from __future__ import annotations

import numpy as np

from lookupdec.drafters.calibrate import DEPTH_EDGES, Calibration, bucket
from lookupdec.tree import DraftTree, Merged


class MergedCalibration:
    """Path scores of the merged tree mapped to observed acceptance.

    Key: (score in 20 bins, sources that proposed the path (up to 3), depth
    bucket); the prior is the merged score itself. An observation is
    unconditional: a path is a hit if every token on it was accepted, a miss if
    one was not, unknown if it runs past the step's new tokens.
    """

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._pending: tuple[list[int], list[int], list[int], list[tuple]] | None = None

    def apply(self, merged: Merged) -> DraftTree:
        tree = merged.tree
        n = len(tree)
        if n == 0:
            self._pending = None
            return tree
        agree = np.zeros(n, np.int64)
        for where in merged.maps:
            agree[np.unique(where)] += 1
        depth = tree.depth.tolist()
        scores = tree.path_scores()
        keys = [("auto", int(min(s, 0.999) * 20), int(min(a, 3)), bucket(DEPTH_EDGES, d))
                for s, a, d in zip(scores.tolist(), agree.tolist(), depth)]
        rated = np.array([self.calibration.rate(k, float(s)) for k, s in zip(keys, scores.tolist())])
        self._pending = (tree.tokens.tolist(), tree.parents.tolist(), depth, keys)
        return DraftTree.trusted(tree.tokens, tree.parents, rated, tree.sources)

    def learn(self, new_tokens) -> None:
        pend, self._pending = self._pending, None
        if pend is None:
            return
        tokens, parents, depth, keys = pend
        new = list(new_tokens)
        state: list[bool | None] = [None] * len(tokens)  # path accepted / not / unknown
        for i, (tok, p, d) in enumerate(zip(tokens, parents, depth)):
            if p >= 0 and state[p] is not True:
                state[i] = state[p]  # under a rejected node: rejected; under an unknown one: unknown
            elif d <= len(new):
                state[i] = tok == new[d - 1]
            if state[i] is not None:
                self.calibration.observe(keys[i], state[i])
