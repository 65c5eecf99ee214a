"""Scores of ``auto``'s merged tree mapped to observed acceptance (``MergedCalibration``).

Keeping the best of several sources' estimates of a path biases it upward, so
``auto`` calibrates the merged scores once more, by score, by how many
sources proposed the path and by depth, against how often such paths were
accepted.
"""
from __future__ import annotations

import numpy as np

from lookupdec._native import calib_merged
from lookupdec.drafters.calibrate import Calibration, Outcomes
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
        self._outcomes = Outcomes(calibration, conditional=False)

    def apply(self, merged: Merged) -> DraftTree:
        tree = merged.tree
        n = len(tree)
        if n == 0:
            return tree
        depth = tree.depth.tolist()
        scores = tree.path_scores().tolist()
        # One native call (``ext/calib.pxi``); ``tests/oracles/calibrate.py``'s ``merged_rates`` is its reference.
        rated, keys = calib_merged(self.calibration.levels(), scores, merged.agree, depth)
        self._outcomes.add(tree.tokens.tolist(), tree.parents.tolist(), depth, keys)
        return DraftTree.trusted(tree.tokens, tree.parents, np.array(rated, np.float64), tree.sources)

    def record(self, tokens: list[int], parents: list[int], depth: list[int], keys: list[tuple]) -> None:
        """Wait for the outcome of a merged tree whose rates were taken elsewhere (``auto_choose``, ext/choose.pxi)."""
        self._outcomes.add(tokens, parents, depth, keys)

    def learn(self, new_tokens) -> None:
        """Observe what the tokens that followed decide of the merged trees still waiting."""
        self._outcomes.learn(new_tokens)

    def restart(self) -> None:
        """Forget the merged trees still waiting (a new sequence begins)."""
        self._outcomes.clear()
