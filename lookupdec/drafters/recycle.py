"""Token Recycling: draft from the target's own top-k candidates of earlier forwards.

After Luo et al. (ACL 2025), without training: every verify forward already
computes, for each row, the target's distribution over the next token. The
drafter keeps an adjacency table ``vocab x k``: for each token, the top-k
next tokens (and their probabilities) the target gave after the latest row
whose input was that token; every verified row of every step overwrites its
token's entry (the paper's update rule; within one step a later row wins).

A draft expands the table from the root: the root's successors, theirs, and
so on. The tree's shape is static given the calibration: at most
``breadth[d - 1]`` children per node at depth ``d``, nodes taken best-first by
path score, where each node's conditional score is the calibrated acceptance
of its (rank, probability bucket, depth) key, learnt from what the verifier
accepted. ``auto`` (and method ``recycle``) then keep the subtree that pays
under the cost curve.

The table outlives one request: drafters built with the same ``DrafterState``
(one Decoder's requests, ``drafters/state.py``) and the same ``table_key`` (the
method: ``recycle`` and ``auto`` keep separate tables, so one method's run never
warms another's on the same prompt) share it, as the paper's table warms up
across queries; a drafter built without a state has its own.

The drafter asks the decoder for the top-k of every verified row through the
protocol's ``topk`` attribute (version 3). Drafts are a function of the
committed history, so greedy and sampled decoding stay exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from lookupdec._native import recycle_expand, recycle_update
from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.calibrate import DEPTH_EDGES, RAW_EDGES, Calibration, Outcomes, bucket
from lookupdec.tree import DraftTree

if TYPE_CHECKING:
    from lookupdec.drafters.state import DrafterState


@dataclass(frozen=True)
class RecycleConfig:
    """Settings of :class:`RecycleDrafter`.

    Raises:
        ValueError: ``topk`` below 1, an empty or non-positive ``breadth``, or ``max_nodes`` below 1.
    """

    # Successors kept per token (the paper keeps 8).
    topk: int = 8
    # Most children of a node at depth 1, 2, ...; its length is the deepest draft. Wide near
    # the root, where the target's top candidates are most often right, thin below (the
    # paper's static tree narrows the same way).
    breadth: tuple[int, ...] = (8, 4, 3, 2, 2, 1, 1, 1)
    # Nodes proposed; the cost curve decides how many are verified.
    max_nodes: int = 48

    def __post_init__(self) -> None:
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if not self.breadth or min(self.breadth) < 1:
            raise ValueError(f"breadth must be a non-empty sequence of counts >= 1, got {self.breadth}")
        if max(self.breadth) > self.topk:
            raise ValueError(f"breadth {self.breadth} asks for more children than topk={self.topk} keeps")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")


class RecycleTable:
    """The adjacency table: for each token, the target's latest top-k next tokens and probabilities.

    Args:
        k: candidates per token.

    Example:
        >>> t = RecycleTable(2)
        >>> t.update(np.array([5, 7, 5]), np.array([[1, 2], [3, 4], [8, 9]]), np.ones((3, 2), np.float32) / 2)
        >>> t.successors(5)[0], t.successors(6)[0]
        ([8, 9], [])
    """

    def __init__(self, k: int) -> None:
        self.k = int(k)
        self.ids = np.full((0, self.k), -1, np.int64)   # -1: no candidate yet
        self.probs = np.zeros((0, self.k), np.float32)

    def update(self, row_tokens: np.ndarray, topk_ids: np.ndarray, topk_probs: np.ndarray) -> None:
        """Overwrite the entries of ``row_tokens`` (in row order: a later row of the same token wins)."""
        rows = np.asarray(row_tokens, np.int64)
        if not len(rows):
            return
        top = max(rows.tolist()) + 1  # (builtins: numpy's reductions cost ~30 us right after a forward)
        if top > len(self.ids):
            grow = max(top, 2 * len(self.ids))
            ids = np.full((grow, self.k), -1, np.int64)
            probs = np.zeros((grow, self.k), np.float32)
            ids[: len(self.ids)], probs[: len(self.ids)] = self.ids, self.probs
            self.ids, self.probs = ids, probs
        if topk_ids.dtype == np.int64 and topk_probs.dtype == np.float32:
            # One native call, row by row in order (the loop below cost ~50 us a step right after a
            # forward; it stays as the route for other dtypes and as the tests' reference).
            recycle_update(self.ids, self.probs, rows, topk_ids, topk_probs)
            return
        kk = min(self.k, topk_ids.shape[1])
        # Row by row, in order (a later row of the same token overwrites).
        ids, probs = self.ids, self.probs
        for i, t in enumerate(rows.tolist()):
            ids[t, :kk] = topk_ids[i, :kk]
            probs[t, :kk] = topk_probs[i, :kk]
            if kk < self.k:
                ids[t, kk:] = -1
                probs[t, kk:] = 0.0

    def successors(self, token: int, most: int | None = None) -> tuple[list[int], list[float]]:
        """The token's candidates (ids, probabilities), most likely first, at most ``most`` (default
        all); empty when it was never seen. Plain lists: an expansion asks a few dozen times a step,
        where numpy's per-call cost exceeds the work.

        Example:
            >>> t = RecycleTable(3)
            >>> t.update(np.array([5]), np.array([[1, 2]]), np.array([[0.5, 0.25]], np.float32))
            >>> t.successors(5), t.successors(5, 1), t.successors(9)
            (([1, 2], [0.5, 0.25]), ([1], [0.5]), ([], []))
        """
        if token >= len(self.ids) or (most is not None and most <= 0):
            return [], []
        ids = self.ids[token, :most].tolist()
        if not ids or ids[0] < 0:
            return [], []
        if ids[-1] < 0:
            ids = ids[:ids.index(-1)]
        return ids, self.probs[token, :len(ids)].tolist()


def recycle_prior(rank: int, prob: float, depth: int) -> float:
    """A starting guess before any outcome: the table's probability, discounted (its context was another one)."""
    return float(prob) * 0.7


class RecycleDrafter(Drafter):
    """Token Recycling as a drafting source (see the module docstring).

    Args:
        config: a :class:`RecycleConfig`; or its fields as keyword settings.
        calibration: the shared acceptance rates (None: the state's).
        state: the decoder's ``DrafterState``, which holds the shared tables (None: a private one).
        table_key: which of the state's tables to use (the method's name).

    Attributes:
        topk: how many candidates per verified row it asks the verifier for (protocol version 3).

    Example:
        >>> d = RecycleDrafter(topk=2, breadth=(2, 1))
        >>> d.begin([4, 1])
        >>> d.commit(StepOutcome((), (2,), row_tokens=np.array([1]), topk_ids=np.array([[2, 3]]),
        ...                      topk_probs=np.array([[0.6, 0.3]], np.float32)))
        >>> d.propose(DraftRequest(budget=8, max_depth=8)).tokens.tolist()     # 2 was never a row yet
        []
    """

    name = "recycle"

    def __init__(self, config: RecycleConfig | None = None, *, calibration: Calibration | None = None,
                 state: "DrafterState | None" = None, table_key: str = "recycle", **settings) -> None:
        from lookupdec.drafters.state import DrafterState

        if config is not None and settings:
            raise TypeError("pass either a RecycleConfig or keyword settings, not both")
        self.config = config if config is not None else RecycleConfig(**settings)
        if state is None:
            state = DrafterState(calibration if calibration is not None else Calibration())
        self.calibration = calibration if calibration is not None else state.calibration
        # One table for every temperature band (the top-k is of the raw logits, whatever the sampling).
        self.table = state.recycle_table(self.config.topk, table_key)
        self._last = -1
        self._outcomes = Outcomes(self.calibration)

    @property
    def topk(self) -> int:
        return self.config.topk

    def _key(self, rank: int, prob: float, depth: int) -> tuple:
        return ("recycle", int(rank), bucket(RAW_EDGES, prob), bucket(DEPTH_EDGES, depth))

    def _rate(self, rank: int, prob: float, depth: int) -> float:
        return self.calibration.rate(self._key(rank, prob, depth), recycle_prior(rank, prob, depth))

    def begin(self, prompt_ids: Sequence[int]) -> None:
        # The table is kept: what the target predicted after a token stays a good guess.
        self._last = int(prompt_ids[-1]) if len(prompt_ids) else -1
        self._outcomes.clear()

    def propose(self, request: DraftRequest) -> DraftTree:
        """The expansion under the last token, at most ``min(budget, max_nodes)`` nodes."""
        c = self.config
        budget = min(int(request.budget), c.max_nodes)
        if self._last < 0 or budget <= 0 or request.max_depth <= 0:
            return DraftTree.empty()
        # One native call with the calibrated rate inside (``ext/calib.pxi``); its reference is
        # ``tests/oracles/recycle.py``'s ``expand`` with ``self._rate`` (a Python heap and a rate call
        # a candidate cost ~85 us a step).
        tokens, parents, scores, depth, keys = recycle_expand(
            self.calibration.levels(), self.table.ids, self.table.probs, self._last, list(c.breadth), budget,
            int(request.max_depth))
        n = len(tokens)
        tree = DraftTree.trusted(np.array(tokens, np.int64), np.array(parents, np.int32),
                                 np.array(scores, np.float64), np.full(n, SOURCES["recycle"], np.int16), depth=depth)
        self._outcomes.add(tokens, parents, depth, keys)
        return tree

    def commit(self, outcome: StepOutcome) -> None:
        self._outcomes.learn(outcome.new_tokens)  # each proposed node, once the tokens decide it
        if len(outcome.row_tokens):
            self.table.update(outcome.row_tokens, outcome.topk_ids, outcome.topk_probs)
        if outcome.new_tokens:
            self._last = int(outcome.new_tokens[-1])
