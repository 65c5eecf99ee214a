"""DraftTree: a tree of drafted tokens stored as flat arrays.

The root of the tree is the last committed token of the context (it is not
stored). Node ``i`` holds ``tokens[i]`` and hangs under ``parents[i]``, with
``parents[i] < i`` and ``-1`` meaning "child of the root". A chain is the
special case ``parents = [-1, 0, 1, ...]``; no draft is the empty tree.

``scores[i]`` is the proposing source's estimate of the probability that the
path to node ``i`` is accepted (so a node never scores above its parent), and
``sources[i]`` the id of the source that proposed it (``lookupdec.drafters.base.SOURCES``).
Scores from different sources are comparable because each source calibrates
its own; raw counts never leave a source.

A *sampled* tree (``sampled=True``) holds tokens drawn at random (a small LM
sampling its drafts); ``q[i]`` is then the distribution node ``i``'s token was
really drawn from, which the q-aware acceptance rule needs to stay exact. A
tree with ``q=None`` holds deterministic drafts (a function of the context).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from lookupdec._native import merge_arrays, subset_arrays

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_F64 = np.zeros(0, dtype=np.float64)
_EMPTY_I16 = np.zeros(0, dtype=np.int16)


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A token trie hanging under the last committed token.

    Attributes:
        tokens: int64 ``(n,)`` token id of each node.
        parents: int32 ``(n,)`` index of each node's parent, ``-1`` for children
            of the root; always ``parents[i] < i``.
        scores: float64 ``(n,)`` estimated probability that the path to the node
            is accepted (default 1.0).
        sources: int16 ``(n,)`` id of the source that proposed the node (default 0).
        q: None for deterministic drafts; for a sampled tree, float ``(n, vocab)``:
            row ``i`` is the distribution node ``i``'s token was drawn from (given
            everything drawn before it), so ``q[i, tokens[i]] > 0``.
        sampled: the tokens were drawn at random. Such a tree needs ``q``
            (the decoder refuses one without it), and may be cut only in ways that do
            not depend on the drawn tokens (see ``subset``).
        ids: node provenance: int64 ``(n,)``, each node's index in the tree this one
            was cut from (``subset`` composes them, so a subset of a subset names the
            nodes of the first tree), or -1 for a node added since (a token a grammar
            forces); None: the tree is its own origin (``node_ids()`` is ``0..n-1``).

    Example:
        >>> t = DraftTree.from_sequences([[5, 6, 7], [5, 8]])
        >>> t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()
        ([5, 6, 7, 8], [-1, 0, 1, 0], [1.0, 0.5, 0.5, 0.5])
    """

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray | None = None
    sources: np.ndarray | None = None
    q: np.ndarray | None = None
    sampled: bool = False
    ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        tokens = np.ascontiguousarray(self.tokens, dtype=np.int64)
        n = tokens.shape[0] if tokens.ndim == 1 else -1
        scores = np.ones(max(n, 0)) if self.scores is None else self.scores
        sources = np.zeros(max(n, 0), np.int16) if self.sources is None else self.sources
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", np.ascontiguousarray(self.parents, dtype=np.int32))
        object.__setattr__(self, "scores", np.ascontiguousarray(scores, dtype=np.float64))
        object.__setattr__(self, "sources", np.ascontiguousarray(sources, dtype=np.int16))
        if self.q is not None:
            object.__setattr__(self, "q", np.asarray(self.q))
            object.__setattr__(self, "sampled", True)  # a q is only ever the law of a random draw
        object.__setattr__(self, "sampled", bool(self.sampled))
        if self.ids is not None:
            object.__setattr__(self, "ids", np.ascontiguousarray(self.ids, dtype=np.int64))
        problem = self.check()
        if problem:
            raise ValueError(f"invalid DraftTree: {problem}")

    # ------------------------------------------------------------------ build
    @classmethod
    def trusted(cls, tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray,
                sources: np.ndarray | None = None, *, q: np.ndarray | None = None, sampled: bool = False,
                ids: np.ndarray | None = None, depth: list[int] | None = None) -> "DraftTree":
        """Wrap arrays already known to form a valid tree, skipping conversion and checks.

        For hot paths whose producer guarantees the invariants (native tries, merges and cuts of
        valid trees); the arrays must already be int64 / int32 / float64 / int16 (``sources``
        None: all 0; ``ids`` int64). ``depth``: the nodes' depths when the producer has them
        (becomes ``depth``, not computed again). ``check()`` still tells whether they really do.
        """
        tree = object.__new__(cls)
        # The fields in one update of the instance's dict (seven object.__setattr__ calls cost ~10 us
        # right after a forward; a drafting step makes a dozen trees).
        tree.__dict__.update({"tokens": tokens, "parents": parents, "scores": scores,
                              "sources": np.zeros(len(tokens), np.int16) if sources is None else sources,
                              "q": q, "sampled": sampled, "ids": ids})
        if depth is not None:
            d = np.array(depth, np.int32)
            d.setflags(write=False)
            tree.__dict__["depth"] = d  # the cached property's slot
        return tree

    @classmethod
    def empty(cls) -> "DraftTree":
        """The tree without nodes: one shared instance (a plain step asks for it several times, and a
        fresh one costs ~10 us right after a forward)."""
        return _EMPTY_TREE

    @classmethod
    def chain(cls, tokens: Sequence[int], scores: Sequence[float] | None = None, source: int = 0) -> "DraftTree":
        """A single path: ``tokens[0]`` under the root, each next under the last."""
        n = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64), np.arange(-1, n - 1, dtype=np.int32),
                   None if scores is None else np.asarray(scores, np.float64), np.full(n, source, np.int16))

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], weights: Iterable[float] | None = None,
                       source: int = 0) -> "DraftTree":
        """Merge candidate continuations into one trie.

        Args:
            sequences: token sequences, each continuing the context.
            weights: weight of each sequence (default 1 each).
            source: the source id every node gets.
        Returns:
            The trie, each node scored with the share of the total weight whose
            sequence passes through it (the empirical probability of its path);
            nodes appear in first-insertion order, so parents precede children.
        """
        sequences = [list(s) for s in sequences]
        w = [1.0] * len(sequences) if weights is None else [float(c) for c in weights]
        if len(w) != len(sequences):
            raise ValueError(f"{len(sequences)} sequences but {len(w)} weights")
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        toks: list[int] = []
        pars: list[int] = []
        depth: list[int] = []
        mass: list[float] = []
        for seq, weight in zip(sequences, w):
            node = -1
            for tok in seq:
                key = (node, int(tok))
                child = index.get(key)
                if child is None:
                    child = len(toks)
                    index[key] = child
                    toks.append(int(tok))
                    pars.append(node)
                    depth.append(depth[node] + 1 if node >= 0 else 1)
                    mass.append(0.0)
                mass[child] += weight
                node = child
        total = sum(w) or 1.0
        scores = [m / total for m in mass]  # (plain floats, checked with builtins: numpy's reductions
        n = len(toks)                       # cost ~30 us right after a forward)
        arrays = (np.array(toks, np.int64), np.array(pars, np.int32), np.array(scores, np.float64),
                  np.full(n, source, np.int16))
        if (toks and min(toks) < 0) or not all(math.isfinite(x) for x in scores):
            return cls(*arrays)  # the constructor's checks name the fault
        # A trie built parent first: valid by construction, without the constructor's checks
        # (Lookahead builds one a step).
        return cls.trusted(*arrays, depth=depth)

    @classmethod
    def merge(cls, trees: Iterable["DraftTree"]) -> "DraftTree":
        """One trie holding every node of every tree (see ``merge_trees``)."""
        return merge_trees(list(trees)).tree

    # -------------------------------------------------------------- queries
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """int32 ``(n,)``: 1 for children of the root, 2 for their children, ... (read-only, computed once)."""
        d: list[int] = []  # plain ints: numpy item access costs more than this loop's work
        for p in self.parents.tolist():
            d.append(1 if p < 0 else d[p] + 1)
        out = np.array(d, np.int32)
        out.setflags(write=False)
        return out

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

    def path_scores(self) -> np.ndarray:
        """``scores`` made monotone: each node's score capped by its parent's (so a child never outranks it).

        Read-only, computed once per tree: a step asks for it several times (selection, the
        batch's pricing, the cut), and a tree's arrays do not change.
        """
        return self._path_scores

    @functools.cached_property
    def _path_scores(self) -> np.ndarray:
        s = self.scores.tolist()  # Python floats are the same doubles
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0 and s[i] > s[p]:
                s[i] = s[p]
        out = np.array(s, np.float64)
        out.setflags(write=False)
        return out

    # -------------------------------------------------------------- reshape
    def best(self, budget: int, max_depth: int | None = None) -> np.ndarray:
        """Indices (ascending) of the ``budget`` best nodes no deeper than ``max_depth``, ancestor-closed.

        Nodes rank by ``path_scores`` (so a node never outranks its ancestors),
        then by shallower depth, then by index.
        """
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        return np.sort(self.ranked(max_depth)[:budget])

    def ranked(self, max_depth: int | None = None) -> np.ndarray:
        """Indices of the nodes no deeper than ``max_depth``, best first: by ``path_scores``, then
        shallower depth, then index. Every prefix is ancestor-closed (a node never outranks its ancestors).

        Example:
            >>> DraftTree.from_sequences([[5, 6], [5, 6], [7]]).ranked().tolist()
            [0, 1, 2]
        """
        depth = self.depth
        order = np.lexsort((np.arange(len(self)), depth, -self.path_scores()))
        return order if max_depth is None else order[depth[order] <= max_depth]

    def prune(self, budget: int) -> "DraftTree":
        """Keep the ``budget`` best nodes (see ``best``), as a valid tree."""
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        if len(self) <= budget:
            return self
        return self.subset(self.best(budget))

    def subset(self, nodes) -> "DraftTree":
        """The tree of ``nodes`` (which must include every ancestor of each), in index order.

        Example:
            >>> DraftTree.from_sequences([[5, 6], [7]]).subset([2, 0]).tokens.tolist()
            [5, 7]
        """
        # One native call: the kept nodes in index order (parents before children), parents
        # renumbered, provenance composed (the kept nodes' ids in this tree's origin, or their
        # indices here when this tree is its own origin); numpy's sort, remap and gathers cost
        # ~40 us a cut right after a forward (their form is the reference in tests/test_tree.py).
        # Rows of a valid tree: valid without the constructor's checks.
        tokens, parents, scores, sources, ids = subset_arrays(self.tokens, self.parents, self.scores,
                                                              self.sources, self.ids, nodes)
        # A sampled tree keeps its q rows. Cutting it stays exact only when the choice of
        # nodes does not depend on their drawn tokens (a depth limit, a fixed shape): a
        # node kept *because* of its value no longer has law q[i] given that it was kept.
        q = None if self.q is None else self.q[np.sort(np.asarray(nodes, dtype=np.int64))]
        return DraftTree.trusted(tokens, parents, scores, sources, q=q, sampled=self.sampled, ids=ids)

    def node_ids(self) -> np.ndarray:
        """Each node's index in the tree this one was cut from (-1: added since); see ``ids``.

        Example:
            >>> t = DraftTree.chain([4, 5, 6, 7])
            >>> t.node_ids().tolist(), t.subset([0, 1, 2]).subset([0, 1]).node_ids().tolist()
            ([0, 1, 2, 3], [0, 1])
        """
        if self.ids is not None:
            return self.ids
        n = len(self.tokens)
        return np.arange(n, dtype=np.int64) if n else _EMPTY_I64  # (a plain step's: no array made)

    def with_ids(self, ids: np.ndarray | None) -> "DraftTree":
        """The same nodes with the provenance ``ids`` (None: this tree becomes its own origin). New
        ids are checked; dropping them re-checks nothing (the same arrays; ``check_tree`` does it a step)."""
        if ids is None:
            if self.ids is None:
                return self
            return DraftTree.trusted(self.tokens, self.parents, self.scores, self.sources, q=self.q,
                                     sampled=self.sampled)
        tree = object.__new__(DraftTree)
        for name in ("tokens", "parents", "scores", "sources", "q", "sampled"):
            object.__setattr__(tree, name, getattr(self, name))
        object.__setattr__(tree, "ids", np.ascontiguousarray(ids, dtype=np.int64))
        problem = tree.check()
        if problem:
            raise ValueError(f"invalid DraftTree: {problem}")
        return tree

    def with_scores(self, scores: np.ndarray, source: int | None = None) -> "DraftTree":
        """The same nodes with new scores (and, if given, one source id for all)."""
        sources = self.sources if source is None else np.full(len(self), source, np.int16)
        return DraftTree.trusted(self.tokens, self.parents, np.asarray(scores, np.float64), sources,
                                 q=self.q, sampled=self.sampled, ids=self.ids)

    def check(self) -> str:
        """Return "" if the arrays form a valid tree, else a description of the fault."""
        n = self.tokens.shape[0]
        if (self.tokens.ndim != 1 or self.parents.shape != (n,) or self.scores.shape != (n,)
                or self.sources.shape != (n,)):
            return (f"shapes differ: tokens {self.tokens.shape}, parents {self.parents.shape}, "
                    f"scores {self.scores.shape}, sources {self.sources.shape}")
        if n and np.any(self.parents >= np.arange(n)):
            i = int(np.flatnonzero(self.parents >= np.arange(n))[0])
            return f"parents[{i}] = {int(self.parents[i])} is not < {i}"
        if n and np.any(self.parents < -1):
            return "parents below -1"
        if n and np.any(self.tokens < 0):
            return "negative token id"
        if n and not np.all(np.isfinite(self.scores)):
            return "non-finite score"
        if self.ids is not None and (self.ids.shape != (n,) or (n and int(self.ids.min()) < -1)):
            return f"ids must be ({n},) indices >= -1, got shape {self.ids.shape}"
        if self.q is not None:
            q = self.q
            if q.ndim != 2 or q.shape[0] != n or not np.issubdtype(q.dtype, np.floating):
                return f"q must be a float array of shape ({n}, vocab), got {q.dtype} {q.shape}"
            if n:
                if not np.all(np.isfinite(q)) or q.min() < 0:
                    return "q holds a negative or non-finite probability"
                sums = q.sum(axis=1, dtype=np.float64)
                if np.any(np.abs(sums - 1.0) > 1e-3):
                    return f"q rows must each sum to 1, got sums {sums.round(4).tolist()}"
                if np.any(self.tokens >= q.shape[1]):
                    return "a token id is outside q's vocabulary"
                drawn = q[np.arange(n), self.tokens]
                if np.any(drawn <= 0):
                    i = int(np.flatnonzero(drawn <= 0)[0])
                    return f"node {i}'s token {int(self.tokens[i])} has probability 0 under its q, so it was not drawn from it"
        return ""

    def __repr__(self) -> str:
        return (f"DraftTree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()}, "
                f"scores={[round(s, 4) for s in self.scores.tolist()]})")


_EMPTY_TREE = DraftTree.trusted(_EMPTY_I64, _EMPTY_I32, _EMPTY_F64, _EMPTY_I16)  # DraftTree.empty()


@dataclass(frozen=True)
class Merged:
    """Several trees merged into one.

    Attributes:
        tree: the merged trie; a path proposed by several trees keeps the highest
            score, and the source of that score.
        maps: for each input tree, int64 ``(len(tree_k),)``: the merged node of each of its nodes.
        agree: per merged node, how many input trees proposed it.
    """

    tree: DraftTree
    maps: tuple[np.ndarray, ...]
    agree: list[int]


def merge_trees(trees: Sequence[DraftTree]) -> Merged:
    """Merge ``trees`` into one trie, keeping the best score of each path.

    Example:
        >>> a = DraftTree.chain([1, 2], scores=[0.9, 0.5], source=1)
        >>> b = DraftTree.chain([1, 3], scores=[0.6, 0.6], source=2)
        >>> m = merge_trees([a, b])
        >>> m.tree.tokens.tolist(), m.tree.scores.tolist(), m.tree.sources.tolist(), [x.tolist() for x in m.maps]
        ([1, 2, 3], [0.9, 0.5, 0.6], [1, 1, 2], [[0, 1], [0, 2]])
    """
    # A sampled tree cannot be merged with others: merging collapses equal paths into
    # one node, so whether a sampled node survives as its own node (and where it is
    # tried among its siblings) would depend on the token it drew; given that it
    # survived, its token would no longer have the law q it carries, and the q-aware
    # acceptance would be biased. Alone (the others empty) it is returned as it is.
    live = [k for k, t in enumerate(trees) if len(t)]
    if not live:  # nothing proposed (about half of auto's proposals): no trie to build
        return Merged(DraftTree.empty(), (_EMPTY_I64,) * len(trees), [])
    if any(trees[k].sampled for k in live):
        if len(live) > 1:
            raise ValueError("a sampled DraftTree cannot be merged with other non-empty trees: merging would make "
                             "its nodes depend on the tokens they drew; draft deterministic nodes to merge")
        k = live[0]
        return Merged(trees[k], tuple(np.arange(len(t), dtype=np.int64) for t in trees), [1] * len(trees[k]))
    # One native call (``ext/merge.pxi``; ``tests/oracles/merge.py`` is the loop in Python). A trie of
    # valid trees' nodes, each after its parent: valid by construction.
    toks, pars, scores, srcs, depth, path, maps, agree = merge_arrays(
        [(t.tokens, t.parents, t.scores, t.sources) for t in trees])
    tree = DraftTree.trusted(toks, pars, scores, srcs, depth=depth)
    path.setflags(write=False)
    tree.__dict__["_path_scores"] = path  # the cached property's slot: not computed again
    return Merged(tree, maps, agree)
