"""Drafting from suffix-array indexes: the mechanism LLMA, REST and history share.

Each step the last ``max_n`` tokens of the sequence are looked up in every
index (``SuffixIndex.lookup``: the longest suffix found, what followed up to
``max_occurrences`` of its occurrences, counted into a trie); each index's
tree is scored by the source's calibration (raw estimate: the share of the
parent's occurrences that continue with the node; key: the match length),
and the trees are merged, each path keeping its best score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.calibrate import Calibration, NodeScorer, conditional
from lookupdec.tree import DraftTree, merge_trees


@dataclass(frozen=True)
class LookupSettings:
    """How an index-backed source looks the context up.

    Raises:
        ValueError: for bounds out of order or below 1.
    """

    # Longest suffix tried; longer ones rarely change which occurrences are read.
    max_n: int = 16
    # Shortest suffix that counts as a match.
    min_n: int = 2
    # Occurrences read per lookup (spread evenly over all of them).
    max_occurrences: int = 256
    # Tokens read after each occurrence.
    depth: int = 12
    # Nodes kept per index before scoring (the decoder's budget may cut further).
    width: int = 48

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        for name in ("max_occurrences", "depth", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class IndexDrafter(Drafter):
    """Drafts continuations of the sequence's longest suffix found in one or more suffix indexes.

    Args:
        indexes: objects with ``SuffixIndex.lookup``'s signature.
        source: the source's name (a ``SOURCES`` key): its id on every node and its calibration key.
        settings: a LookupSettings.
        calibration: shared acceptance rates (a private one when None).

    Example:
        >>> from lookupdec.index.memory import memory_index
        >>> d = IndexDrafter([memory_index([[5, 6, 7, 8, 9]])], "llma", LookupSettings(min_n=1))
        >>> d.begin([1, 6, 7])
        >>> d.propose(DraftRequest(budget=8, max_depth=3)).tokens.tolist()
        [8, 9]
    """

    def __init__(self, indexes: Sequence, source: str, settings: LookupSettings | None = None, *,
                 calibration: Calibration | None = None) -> None:
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}; expected one of {sorted(SOURCES)}")
        self.name = source
        self.indexes = list(indexes)
        self.settings = settings or LookupSettings()
        self._source_id = SOURCES[source]
        self._scorer = NodeScorer(source, calibration, grow=True)
        self._seq: list[int] = []

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._seq = [int(t) for t in prompt_ids]
        self._scorer.restart()

    def propose(self, request: DraftRequest) -> DraftTree:
        s = self.settings
        depth = min(s.depth, request.max_depth)
        width = min(s.width, request.budget)
        if depth < 1 or width < 1 or not self.indexes:
            return self._scorer.score(DraftTree.empty(), (), 0, self._source_id)
        tail = self._seq[-s.max_n:]
        trees, lengths = [], []
        for index in self.indexes:
            hit = index.lookup(tail, max_n=s.max_n, min_n=s.min_n, max_occurrences=s.max_occurrences,
                               depth=depth, budget=width)
            if hit.match_len:
                trees.append(hit.tree)
                lengths.append(hit.match_len)
        if not trees:
            return self._scorer.score(DraftTree.empty(), (), 0, self._source_id)
        if len(trees) == 1:
            return self._scorer.score(trees[0], conditional(trees[0]), lengths[0], self._source_id)
        # Several indexes: one trie, each path keeping its best share of occurrences;
        # a node's match length is the longest of the indexes that proposed it.
        merged = merge_trees(trees)
        length_of = [0] * len(merged.tree)
        for k, where in enumerate(merged.maps):
            for m in where.tolist():
                length_of[m] = max(length_of[m], lengths[k])
        keep = merged.tree.best(width)
        tree = merged.tree.subset(keep)
        return self._scorer.score(tree, conditional(tree), [length_of[int(m)] for m in keep], self._source_id)

    def commit(self, outcome: StepOutcome) -> None:
        self._scorer.learn(outcome.new_tokens)
        self._seq.extend(int(t) for t in outcome.new_tokens)
