"""Prompt lookup decoding (PLD): draft by copying from the live context.

At each step the longest suffix of the sequence (``min_n`` to ``max_n``
tokens) that occurred earlier in the prompt or the generated text is looked
up in a :class:`~lookupdec.index.live.LiveIndex`; what followed its most
recent occurrences is merged into one DraftTree. The draft depth adapts to
recent acceptance: it grows after a fully accepted draft and shrinks to just
past the accepted length after a rejection.

Defaults follow an offline replay of the embedded model's greedy outputs on
72 Spec-Bench generations (``benchmarks/simulate.py``, swept with
``benchmarks/sweep_pld.py``), weighed against the measured cost of the
decoder's fast verify forward (``benchmarks/simulate.py`` curve "fast"): any draft costs ~16%
over a 1-token forward, but the next few nodes are nearly free (width 4 costs
1.21x width 1, width 8 1.41x, width 16 1.78x). So the adaptive depth never
drops below 4 tokens, matches of 2+ tokens get up to 12 nodes 12 deep, and 1-token
matches get a 3-node tree. Modelled speedup over plain decoding 1.50x -> 1.55x
(tau 1.73 -> 1.83), up on each task and on both halves of the records; every
setting changed adds to it on both halves, and settings near these model
within ~1% of them. Under transformers' steeper cost curve ("hf") they model
about even with the narrower settings tuned for it (1.49x vs 1.48x).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lookupdec._native import context_propose
from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.calibrate import Calibration, NodeScorer, lookup_prior
from lookupdec.index.live import LiveIndex
from lookupdec.tree import DraftTree


@dataclass(frozen=True)
class PLDConfig:
    """Settings of :class:`PLDDrafter`.

    Raises:
        ValueError: for bounds out of order or below 1.
    """

    # Shortest match given a full draft: 1-token matches are right too rarely
    # to pay for a full-width verify forward (they get the fallback below).
    # (3, with the fallback taking 1- and 2-token matches, modelled 0.2% slower.)
    min_n: int = 2
    # Longer suffixes pick the right occurrence; beyond ~8 tokens they rarely disagree with shorter ones.
    max_n: int = 8
    # Most nodes per draft, whatever budget the decoder offers. A forward over
    # 13 tokens costs ~1.6x one over 1; 8 nodes modelled 0.5% slower, 16 0.3%.
    max_width: int = 12
    # Earlier occurrences (most recent first) whose continuations are merged.
    # More votes rank the fallback's 1-token-match continuations better (4: -0.2%, 16: even).
    max_occurrences: int = 8
    # Draft depth bounds and the starting depth; depth adapts between the bounds.
    # min_depth 4: a rejection shrinks the next draft to one past what was
    # accepted, but no shorter than 4 tokens, as widths 2 to 5 cost about the
    # same (39.9 to 42.9 ms) and a longer draft now and then runs on (min_depth
    # 1 modelled 1.5% slower, 2 1.0%, 3 and 6 0.2%).
    min_depth: int = 4
    max_depth: int = 12
    # Starting at the top pays: a fresh match is as likely to run long as a later one.
    init_depth: int = 8
    # Depth added after a draft is accepted in full.
    grow: int = 4
    # When no suffix of min_n+ tokens matched, a small tree from the shorter
    # matches (down to 1 token): at most fallback_width nodes (0: draft
    # nothing), fallback_depth deep; none when min_n is 1. Such drafts do not
    # move the adaptive depth. Phrases copied from the prompt start with a
    # 1-token match; 3 nodes 3 deep catch many of them for little forward
    # time (no fallback: -4.0%; 2 nodes: -1.4%; 4: -0.2%; 6: -1.4%; 2 deep: -0.6%).
    fallback_width: int = 3
    fallback_depth: int = 3

    def __post_init__(self) -> None:
        if self.min_n < 1 or self.max_n < self.min_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        if self.max_width < 1:
            raise ValueError(f"max_width must be >= 1, got {self.max_width}")
        if self.max_occurrences < 1:
            raise ValueError(f"max_occurrences must be >= 1, got {self.max_occurrences}")
        if not 1 <= self.min_depth <= self.init_depth <= self.max_depth:
            raise ValueError(
                f"need 1 <= min_depth <= init_depth <= max_depth, got "
                f"{self.min_depth}, {self.init_depth}, {self.max_depth}")
        if self.grow < 0:
            raise ValueError(f"grow must be >= 0, got {self.grow}")
        if self.fallback_width < 0 or self.fallback_depth < 1:
            raise ValueError(f"need fallback_width >= 0 and fallback_depth >= 1, got "
                             f"{self.fallback_width}, {self.fallback_depth}")


_EMPTY_F64 = np.zeros(0, np.float64)


@dataclass(frozen=True)
class ContextDraft:
    """Continuations of the longest earlier match of the sequence's suffix.

    Attributes:
        match_len: tokens matched (0: no match, and an empty tree).
        tree: the continuations merged; each node scored with the share of the
            merged occurrences that continue with its path.
        conditional: each node's share of its parent's occurrences (``calibrate.conditional``).
    """

    match_len: int
    tree: DraftTree
    conditional: np.ndarray


def lookup_tree(index: LiveIndex, depth: int, width: int, max_occurrences: int,
                max_n: int | None = None, min_n: int | None = None) -> ContextDraft:
    """The draft for the index's current sequence: continuations of its longest earlier match.

    Args:
        index: the live index (its last token is the tree's root).
        depth: tokens read after each occurrence.
        width: most nodes in the tree.
        max_occurrences: occurrences merged, most recent first.
        max_n, min_n: match length bounds (default: the index's).

    Returns:
        A ContextDraft whose tree has at most ``width`` nodes; empty when nothing matched.

    Example:
        >>> idx = LiveIndex(max_n=4, min_n=2)
        >>> idx.extend([1, 2, 3, 1, 2, 4, 1, 2])
        >>> d = lookup_tree(idx, depth=2, width=8, max_occurrences=4)
        >>> d.match_len, d.tree.tokens.tolist(), d.tree.parents.tolist(), d.tree.scores.tolist()
        (2, [4, 1, 3, 1], [-1, 0, -1, 2], [0.5, 0.5, 0.5, 0.5])
    """
    d = index.draft(max_occurrences, depth, width, max_n=max_n, min_n=min_n)
    if not d.length:
        return _NO_DRAFT
    # Most recent first: on equal counts the earlier-inserted (more recent) nodes rank first.
    # The native trie is valid by construction (tests/test_live_index.py checks it against an oracle).
    return ContextDraft(d.length, DraftTree.trusted(d.tokens, d.parents, d.shares), d.conditionals)


_NO_DRAFT = ContextDraft(0, DraftTree.empty(), _EMPTY_F64)


class PLDDrafter(Drafter):
    """Drafts continuations of the longest earlier match in the prompt + generated text.

    Args:
        config: a :class:`PLDConfig`; or its fields as keyword settings.
        calibration: the shared calibration rates (a private one when None).

    Raises:
        TypeError: when both a config and keyword settings are given.
        ValueError: for invalid settings (see :class:`PLDConfig`).

    Example:
        >>> d = PLDDrafter(min_n=2, max_n=4, init_depth=4)
        >>> d.begin([5, 6, 7, 8, 5, 6])
        >>> d.propose(DraftRequest(budget=16, max_depth=100)).tokens.tolist()
        [7, 8, 5, 6]
    """

    name = "pld"
    # Lookups and scoring in one native call (``_propose_native``); False: the Python route, its reference.
    native_propose = True

    def __init__(self, config: PLDConfig | None = None, *, calibration: Calibration | None = None,
                 **settings) -> None:
        if config is not None and settings:
            raise TypeError("pass either a PLDConfig or keyword settings, not both")
        self.config = config if config is not None else PLDConfig(**settings)
        self._scorer = NodeScorer(self.name, calibration, grow=True)
        c = self.config
        # The fallback needs the 1-token matches indexed too.
        self._index = LiveIndex(max_n=c.max_n, min_n=1 if c.fallback_width else c.min_n)
        # The match-length bounds of the draft and of its fallback (None: no fallback), as LiveIndex.draft checks them.
        self._full_bounds = self._index._bounds(None, c.min_n)
        self._fallback_bounds = self._index._bounds(c.min_n - 1, 1) if c.fallback_width and c.min_n > 1 else None
        self._depth = self.config.init_depth
        self._drafted = 0  # depth of the last proposed tree (0: nothing drafted)

    @property
    def depth(self) -> int:
        """The current draft depth."""
        return self._depth

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._index.reset(prompt_ids)
        self._depth = self.config.init_depth
        self._drafted = 0
        self._scorer.restart()

    def propose(self, request: DraftRequest) -> DraftTree:
        """A tree of at most ``min(request.budget, max_width)`` nodes, scored; empty when nothing matched."""
        c = self.config
        budget = int(request.budget)
        depth = min(self._depth, request.max_depth)
        width = min(budget, c.max_width)
        if self.native_propose and self._scorer.prior is lookup_prior and depth >= 1 and width >= 1:
            return self._propose_native(depth, width, request)
        d = lookup_tree(self._index, depth, width, c.max_occurrences, min_n=c.min_n)
        full = len(d.tree) > 0  # a full draft moves the adaptive depth; the fallback's does not
        if not full and c.fallback_width and c.min_n > 1:
            d = lookup_tree(self._index, min(c.fallback_depth, request.max_depth), min(budget, c.fallback_width),
                            c.max_occurrences, max_n=c.min_n - 1, min_n=1)
        tree = self._scorer.score(d.tree, d.conditional, d.match_len, SOURCES[self.name])
        self._drafted = max(tree.depth.tolist()) if full else 0  # (the scorer's depths: not computed again)
        return tree

    def _propose_native(self, depth: int, width: int, request: DraftRequest) -> DraftTree:
        """``propose``'s lookups and scoring in one native call (``context_propose``, ext/context.pxi);
        the route through ``lookup_tree`` and ``NodeScorer.score`` is its reference in the tests."""
        c, s = self.config, self._scorer
        fb_depth, fb_width = min(c.fallback_depth, request.max_depth), min(int(request.budget), c.fallback_width)
        fallback = (*self._fallback_bounds, fb_depth, fb_width) if self._fallback_bounds and fb_depth >= 1 \
            and fb_width >= 1 else None
        out = context_propose(self._index._core, (*self._full_bounds, depth, width), fallback, c.max_occurrences,
                              s.calibration.levels(), s.source, s.grow, SOURCES[self.name])
        if out is None:
            self._drafted = 0
            return DraftTree.empty()
        full, tokens, parents, scores, sources, depth_list, keys, token_list, parent_list = out
        s.record(token_list, parent_list, depth_list, keys)
        self._drafted = max(depth_list) if full else 0
        return DraftTree.trusted(tokens, parents, scores, sources, depth=depth_list)

    def commit(self, outcome: StepOutcome) -> None:
        c = self.config
        accepted = outcome.n_accepted
        if self._drafted:
            if accepted >= self._drafted:
                self._depth = min(c.max_depth, self._depth + c.grow)
            else:
                # One past what was accepted: the next draft is as long as the last
                # one that would have been accepted in full, plus one to probe.
                self._depth = max(c.min_depth, min(self._depth, accepted + 1))
        self._drafted = 0
        self._scorer.learn(outcome.new_tokens)
        self._index.extend(outcome.new_tokens)
