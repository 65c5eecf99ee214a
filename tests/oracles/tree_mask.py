"""Slow, obvious tree attention mask: the reference for ``verify.tree_attention_bias``."""
from __future__ import annotations

import numpy as np

from lookupdec.tree import DraftTree


def reference_tree_attention_bias(tree: DraftTree, past: int, width: int) -> np.ndarray:
    """Slow, obvious version of ``tree_attention_bias`` (bool: True = attend), for tests."""
    n = len(tree)
    out = np.zeros((width, past + width), dtype=bool)
    for r in range(width):
        for c in range(past + 1):
            out[r, c] = True
        if 1 <= r <= n:
            for j in tree.path(r - 1):
                out[r, past + 1 + j] = True
    return out
