"""DraftTree: a tree of drafted tokens stored as flat arrays.

The root of the tree is the last committed token of the context (it is not
stored). Node ``i`` holds ``tokens[i]`` and hangs under ``parents[i]``, with
``parents[i] < i`` and ``-1`` meaning "child of the root". A chain is the
special case ``parents = [-1, 0, 1, ...]``; no draft is the empty tree.

``counts[i]`` is the support of node ``i`` (how many occurrences in a
datastore continue with the path to ``i``); drafters without counts use 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A token trie hanging under the last committed token.

    Attributes:
        tokens: int64 ``(n,)`` token id of each node.
        parents: int32 ``(n,)`` index of each node's parent, ``-1`` for children
            of the root; always ``parents[i] < i``.
        counts: int64 ``(n,)`` support of each node (occurrence count, or 1).

    Example:
        >>> t = DraftTree.from_sequences([[5, 6, 7], [5, 8]])
        >>> t.tokens.tolist(), t.parents.tolist(), t.counts.tolist()
        ([5, 6, 7, 8], [-1, 0, 1, 0], [2, 1, 1, 1])
    """

    tokens: np.ndarray
    parents: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", np.ascontiguousarray(self.tokens, dtype=np.int64))
        object.__setattr__(self, "parents", np.ascontiguousarray(self.parents, dtype=np.int32))
        object.__setattr__(self, "counts", np.ascontiguousarray(self.counts, dtype=np.int64))
        problem = self.check()
        if problem:
            raise ValueError(f"invalid DraftTree: {problem}")

    # ------------------------------------------------------------------ build
    @classmethod
    def trusted(cls, tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray) -> "DraftTree":
        """Wrap arrays already known to form a valid tree, skipping conversion and checks.

        For hot paths whose producer guarantees the invariants (the native
        trie's ``top``); the arrays must already be int64 / int32 / int64.
        ``check()`` still tells whether they really do.
        """
        tree = object.__new__(cls)
        object.__setattr__(tree, "tokens", tokens)
        object.__setattr__(tree, "parents", parents)
        object.__setattr__(tree, "counts", counts)
        return tree

    @classmethod
    def empty(cls) -> "DraftTree":
        return cls(_EMPTY_I64, _EMPTY_I32, _EMPTY_I64)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        """A single path: ``tokens[0]`` under the root, each next under the last."""
        n = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64), np.arange(-1, n - 1, dtype=np.int32), np.ones(n, np.int64))

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], counts: Iterable[int] | None = None) -> "DraftTree":
        """Merge candidate continuations into one trie, summing their counts.

        Args:
            sequences: token sequences, each continuing the context.
            counts: weight of each sequence (default 1 each).
        Returns:
            The trie; nodes appear in first-insertion order, so parents precede children.
        """
        sequences = [list(s) for s in sequences]
        weights = [1] * len(sequences) if counts is None else [int(c) for c in counts]
        if len(weights) != len(sequences):
            raise ValueError(f"{len(sequences)} sequences but {len(weights)} counts")
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        toks: list[int] = []
        pars: list[int] = []
        cnts: list[int] = []
        for seq, w in zip(sequences, weights):
            node = -1
            for tok in seq:
                key = (node, int(tok))
                child = index.get(key)
                if child is None:
                    child = len(toks)
                    index[key] = child
                    toks.append(int(tok))
                    pars.append(node)
                    cnts.append(0)
                cnts[child] += w
                node = child
        return cls(np.array(toks, np.int64), np.array(pars, np.int32), np.array(cnts, np.int64))

    @classmethod
    def merge(cls, trees: Iterable["DraftTree"]) -> "DraftTree":
        """One trie holding every node of every tree; counts of the same path add up."""
        index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
        toks: list[int] = []
        pars: list[int] = []
        cnts: list[int] = []
        for tree in trees:
            where = [0] * len(tree)  # node of `tree` -> merged node
            for i, (tok, par, cnt) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist(), tree.counts.tolist())):
                key = (where[par] if par >= 0 else -1, tok)
                node = index.get(key)
                if node is None:
                    node = index[key] = len(toks)
                    toks.append(tok)
                    pars.append(key[0])
                    cnts.append(0)
                cnts[node] += cnt
                where[i] = node
        return cls(np.array(toks, np.int64), np.array(pars, np.int32), np.array(cnts, np.int64))

    # -------------------------------------------------------------- queries
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> np.ndarray:
        """int32 ``(n,)``: 1 for children of the root, 2 for their children, ..."""
        d = np.zeros(len(self), np.int32)
        for i, p in enumerate(self.parents.tolist()):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    def path(self, i: int) -> list[int]:
        """Node indices from the root's child down to node ``i``."""
        out = []
        while i >= 0:
            out.append(i)
            i = int(self.parents[i])
        return out[::-1]

    def path_tokens(self, i: int) -> list[int]:
        return [int(self.tokens[j]) for j in self.path(i)]

    def children(self) -> dict[int, list[int]]:
        """Each node's children in index order; key ``-1`` holds the root's."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents.tolist()):
            out.setdefault(p, []).append(i)
        return out

    def leaves(self) -> np.ndarray:
        has_child = np.zeros(len(self), bool)
        has_child[self.parents[self.parents >= 0]] = True
        return np.flatnonzero(~has_child)

    def paths(self) -> list[list[int]]:
        """Root-to-leaf paths as lists of node indices, in leaf order."""
        return [self.path(int(i)) for i in self.leaves()]

    def attention_mask(self) -> np.ndarray:
        """bool ``(n, n)``: ``mask[i, j]`` is True where node ``j`` is ``i`` or one of its ancestors."""
        n = len(self)
        mask = np.zeros((n, n), bool)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i, : p + 1] = mask[p, : p + 1]
            mask[i, i] = True
        return mask

    def position_offsets(self) -> np.ndarray:
        """Position of each node relative to the root token (the node's depth)."""
        return self.depth

    # -------------------------------------------------------------- reshape
    def prune(self, budget: int) -> "DraftTree":
        """Keep the ``budget`` best nodes, as a valid tree.

        Nodes are ranked by the smallest count on their path (so a node never
        outranks its ancestors), then by shallower depth, then by index.
        """
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        n = len(self)
        if n <= budget:
            return self
        support = self.counts.copy()
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                support[i] = min(support[i], support[p])
        order = np.lexsort((np.arange(n), self.depth, -support))[:budget]
        return self.subset(order)

    def subset(self, nodes) -> "DraftTree":
        """The tree of ``nodes`` (which must include every ancestor of each), in index order.

        Example:
            >>> DraftTree.from_sequences([[5, 6], [7]]).subset([2, 0])
            DraftTree(tokens=[5, 7], parents=[-1, -1], counts=[1, 1])
        """
        keep = np.sort(np.asarray(nodes, dtype=np.int64))  # index order keeps parents before children
        remap = np.full(len(self), -1, np.int64)
        remap[keep] = np.arange(len(keep))
        parents = self.parents[keep]
        new_parents = np.where(parents >= 0, remap[np.maximum(parents, 0)], -1)
        return DraftTree(self.tokens[keep], new_parents, self.counts[keep])

    def check(self) -> str:
        """Return "" if the arrays form a valid tree, else a description of the fault."""
        n = self.tokens.shape[0]
        if self.tokens.ndim != 1 or self.parents.shape != (n,) or self.counts.shape != (n,):
            return f"shapes differ: tokens {self.tokens.shape}, parents {self.parents.shape}, counts {self.counts.shape}"
        if n and np.any(self.parents >= np.arange(n)):
            i = int(np.flatnonzero(self.parents >= np.arange(n))[0])
            return f"parents[{i}] = {int(self.parents[i])} is not < {i}"
        if n and np.any(self.parents < -1):
            return "parents below -1"
        if n and np.any(self.tokens < 0):
            return "negative token id"
        return ""

    def __repr__(self) -> str:
        return f"DraftTree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()}, counts={self.counts.tolist()})"
