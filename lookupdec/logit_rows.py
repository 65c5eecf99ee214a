"""The logit rows of one verify forward, computed on first use (``LazyLogits``).

The fast backend runs the forward up to the last hidden states and computes
``lm_head`` only for the rows an acceptance walk (or a drafter asking for
top-k) needs; transformers' backend hands over rows already computed.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from lookupdec.tree import DraftTree


def subtree(tree: DraftTree, node: int) -> list[int]:
    """``node`` and all its descendants, ascending (uses ``parents[i] < i``)."""
    inside = {node}
    for i in range(node + 1, len(tree)):
        if int(tree.parents[i]) in inside:
            inside.add(i)
    return sorted(inside)


class LazyLogits:
    """The logit rows of one verify forward, each computed on first use.

    Row 0 is the root, row ``1 + i`` node ``i``. An acceptance walk needs the
    rows of the nodes it visits only, and the ``lm_head`` product costs in
    proportion to its rows, so rows are computed in batches: ``prefetch``
    before the walk (the verifier fetches the root and the tree's most likely
    path), then on a miss the missing row together with its node's whole
    subtree (the only rows the walk can visit next). Every row equals the same
    row of a full product up to the float rounding of the batch size.

    Args:
        n_rows: ``1 + len(tree)``.
        tree: the verified tree (for the subtree batches).
        compute: maps a ``(R,)`` int64 row index tensor to ``(R, vocab)`` logits.

    Attributes:
        computed: how many rows have been computed so far.
        compute_s: seconds spent computing rows.

    Example:
        >>> lz = LazyLogits.of(torch.eye(3))
        >>> lz.row(1).tolist(), lz.computed
        ([0.0, 1.0, 0.0], 3)
    """

    def __init__(self, n_rows: int, tree: DraftTree | None, compute: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.n_rows = int(n_rows)
        self.tree = tree
        self._compute = compute
        self._rows: dict[int, torch.Tensor] = {}
        self.compute_s = 0.0

    @classmethod
    def of(cls, logits: torch.Tensor) -> "LazyLogits":
        """Rows already computed (``(n_rows, vocab)``)."""
        lz = cls(logits.shape[0], None, lambda idx: logits[idx])
        lz._rows = {i: logits[i] for i in range(logits.shape[0])}
        return lz

    @property
    def computed(self) -> int:
        return len(self._rows)

    def computed_rows(self) -> list[int]:
        """Indices of the rows computed so far, ascending."""
        return sorted(self._rows)

    def prefetch(self, rows) -> None:
        """Compute the missing ones of ``rows`` in one product."""
        missing = sorted({int(r) for r in rows} - self._rows.keys())
        if not missing:
            return
        if missing[0] < 0 or missing[-1] >= self.n_rows:
            raise IndexError(f"logit rows {missing} out of range 0..{self.n_rows - 1}")
        t = time.perf_counter()
        out = self._compute(torch.tensor(missing, dtype=torch.long))
        self.compute_s += time.perf_counter() - t
        for k, r in enumerate(missing):
            self._rows[r] = out[k]

    def store(self, rows, logits: torch.Tensor) -> None:
        """Rows computed elsewhere (in a product shared with other rows): ``logits[k]`` is row ``rows[k]``."""
        for k, r in enumerate(rows):
            self._rows[int(r)] = logits[k]

    def row(self, r: int) -> torch.Tensor:
        """Logits ``(vocab,)`` of row ``r``; a miss also computes the rows of the node's subtree."""
        if r not in self._rows:
            if r >= 1 and self.tree is not None:
                self.prefetch([1 + i for i in subtree(self.tree, r - 1)])
            else:
                self.prefetch([r])
        return self._rows[r]

    def full(self) -> torch.Tensor:
        """All rows ``(n_rows, vocab)`` (computes the missing ones)."""
        self.prefetch(range(self.n_rows))
        return torch.stack([self._rows[r] for r in range(self.n_rows)])
