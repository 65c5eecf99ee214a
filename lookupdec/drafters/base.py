"""The drafter protocol (version 3) every drafting source implements.

The decoder owns the token sequence. A drafter sees it through three calls:

- ``begin(prompt_ids)``: a new sequence starts with these prompt tokens;
- ``propose(request)``: a DraftTree continuing the current sequence (whose
  last token is the tree's root), with at most ``request.budget`` nodes, none
  deeper than ``request.max_depth``. Each node carries a score, the source's
  calibrated estimate of the probability that the path to it is accepted, and
  the source's id. The empty tree when nothing is worth verifying;
- ``commit(outcome)``: what the verification of the step made of it:
  ``outcome.accepted`` are the ids of the drafter's *own* proposed nodes that
  were accepted (in the numbering of the tree it returned, never renumbered),
  ``outcome.new_tokens`` the tokens appended to the sequence (accepted draft
  tokens plus the bonus token), ``outcome.tree`` the tree actually verified.

A drafter that samples may implement ``set_sampling(params, generator)``: the
decoder calls it before ``begin`` with the request's ``SamplingParams`` and a
``torch.Generator`` of its own, seeded from the request's seed (None when
greedy). Its tree must then be ``sampled`` with ``q`` set (row ``i``: the
distribution node ``i``'s token was drawn from) and respect the request's
budget and depth: the decoder refuses a sampled tree without ``q`` and never
cuts one by score.

Scores, not raw counts, are what the decoder and ``auto`` compare across
sources. Drafters never call the model; those that need it (small LM,
Lookahead) get an interface from the decoder.

Version 3 adds two optional hooks, found with ``getattr`` (a version-2
drafter has neither and runs unchanged):

- ``topk: int`` (default 0): when > 0, the verifier computes the top-``topk``
  ids and probabilities (softmax of the raw logits, no temperature) of every
  verified row (the root and every tree node) and the step's outcome carries
  them (``row_tokens``, ``topk_ids``, ``topk_probs``); the first outcome (the
  prefill's) carries those of the prompt's last row. Token Recycling learns
  from them.
- ``window(request) -> ExtraRows | None``: rows run in the same forward after
  the tree's rows, with their own positions and visibility among themselves
  (``ExtraRows``). They see the past and the root, never tree nodes, and no
  tree node sees them, so they change no verified logit; they are never
  committed. Their argmax come back as ``outcome.extra_argmax``. Only asked for
  when the verifier verifies whole trees (not under chain verification).
  Lookahead's Jacobi window runs this way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from lookupdec.tree import DraftTree

# Source ids carried by DraftTree.sources (0: unnamed, e.g. a caller's own drafter).
SOURCES: dict[str, int] = {
    "pld": 1,        # the prompt and the generated text
    "llma": 2,       # reference documents passed with the request
    "rest": 3,       # corpus datastores (suffix-array indexes)
    "history": 4,    # earlier outputs
    "lookahead": 5,  # n-grams from Jacobi iterations of the target
    "recycle": 6,    # the target's own earlier top-k candidates
    "draft": 7,      # a small draft model
    "grammar": 8,    # tokens a structured-output constraint forces (no drafting cost)
    "prediction": 9, # the request's predicted output (OpenAI's Predicted Outputs), drafted as LLMA drafts
}
SOURCE_NAMES: dict[int, str] = {v: k for k, v in SOURCES.items()} | {0: "other"}


@dataclass(frozen=True)
class DraftRequest:
    """What the decoder asks of a drafter at one step.

    Attributes:
        budget: most nodes the tree may have.
        max_depth: deepest useful node (the tokens still to generate minus the
            bonus token); deeper nodes are cut before verification.

    Example:
        >>> DraftRequest(budget=16, max_depth=127).budget
        16
    """

    budget: int
    max_depth: int

    def __post_init__(self) -> None:
        if self.budget < 0 or self.max_depth < 0:
            raise ValueError(f"budget and max_depth must be >= 0, got {self.budget}, {self.max_depth}")


@dataclass(frozen=True)
class ExtraRows:
    """Rows a drafter runs in the verify forward beside the tree (never committed).

    Attributes:
        tokens: int64 ``(m,)`` input token of each row.
        depth: int64 ``(m,)`` each row's depth under the root (>= 1): its
            position is ``past + depth``.
        visible: bool ``(m, m)``: ``visible[i, j]`` when row ``i`` attends to
            row ``j`` (besides the whole past and the root, which every row sees).

    Raises:
        ValueError: shapes that disagree, a depth below 1, or a negative token.

    Example:
        >>> x = ExtraRows(np.array([5, 6]), np.array([1, 2]), np.tril(np.ones((2, 2), bool)))
        >>> len(x), x.depth.tolist()
        (2, [1, 2])
    """

    tokens: np.ndarray
    depth: np.ndarray
    visible: np.ndarray

    def __post_init__(self) -> None:
        tokens = np.ascontiguousarray(self.tokens, dtype=np.int64)
        depth = np.ascontiguousarray(self.depth, dtype=np.int64)
        visible = np.ascontiguousarray(self.visible, dtype=bool)
        m = tokens.shape[0] if tokens.ndim == 1 else -1
        if m < 0 or depth.shape != (m,) or visible.shape != (m, m):
            raise ValueError(f"extra rows need tokens (m,), depth (m,) and visible (m, m); got {tokens.shape}, "
                             f"{depth.shape}, {visible.shape}")
        if m and (int(depth.min()) < 1 or int(tokens.min()) < 0):
            raise ValueError("extra rows need depths >= 1 and token ids >= 0")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "visible", visible)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])




@dataclass(frozen=True)
class StepOutcome:
    """What became of one step's draft.

    Attributes:
        accepted: ids of the drafter's own nodes that were accepted, root to
            leaf, in the numbering of the tree it proposed (empty if none).
        new_tokens: tokens appended to the sequence this step (the accepted
            draft tokens, then the bonus token; cut at EOS or the length limit).
        tree: the tree that was verified (after pruning, merging or the
            verifier's chain fallback; its own numbering).
        origin: for each node of ``tree``, the id of the drafter's node it
            verified, or -1 for nodes the drafter did not propose.
        row_tokens: int64 ``(rows,)`` input token of each verified row: the
            root, then ``tree``'s nodes (empty unless the drafter asked for top-k).
        topk_ids, topk_probs: ``(rows, k)`` the target's top-k next tokens and
            their probabilities after each row (empty unless asked for).
        extra_argmax: int64 ``(m,)`` the target's argmax after each extra row
            the drafter's ``window`` asked for (empty when none ran).

    Example:
        >>> StepOutcome((0,), (7, 9), DraftTree.chain([7]), np.array([0])).accepted
        (0,)
    """

    accepted: tuple[int, ...]
    new_tokens: tuple[int, ...]
    tree: DraftTree = field(default_factory=DraftTree.empty)
    origin: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    row_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    topk_ids: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    topk_probs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    extra_argmax: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n_accepted(self) -> int:
        return len(self.accepted)

    @classmethod
    def plain(cls, new_tokens: Sequence[int]) -> "StepOutcome":
        """A step that verified no draft (the prefill's first token, a plain step)."""
        return cls((), tuple(int(t) for t in new_tokens))


@runtime_checkable
class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(self, request: DraftRequest) -> DraftTree: ...

    def commit(self, outcome: StepOutcome) -> None: ...


class NoDrafter:
    """Drafts nothing: the decoder then runs plain autoregressive decoding (``ar``)."""

    name = "ar"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree.empty()

    def commit(self, outcome: StepOutcome) -> None:
        pass
