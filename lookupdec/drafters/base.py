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

Every drafter subclasses :class:`Drafter`, whose default hooks do nothing, so
the decoder calls them directly instead of probing with ``getattr``:

- ``topk: int`` (default 0): when > 0, the verifier computes the top-``topk``
  ids and probabilities (softmax of the raw logits, no temperature) of the
  verified rows and the step's outcome carries them (``row_tokens``,
  ``topk_ids``, ``topk_probs``); the first outcome (the prefill's) carries
  those of the prompt's last row. Token Recycling learns from them.
- ``window(request) -> ExtraRows | None`` (default None): rows run in the same
  forward after the tree's rows, with their own positions and visibility among
  themselves (``ExtraRows``). They see the past and the root, never tree nodes,
  and no tree node sees them, so they change no verified logit; they are never
  committed. Their argmax come back as ``outcome.extra_argmax``. Only asked for
  when ``request.extra_rows`` (the verifier verifies whole trees). Lookahead's
  Jacobi window runs this way. ``window_rows()`` says how many it will run.
- ``set_sampling(params, generator)`` (default: nothing).
- ``second_stage`` / ``pays(selection, max_depth, margin)`` (default: False / True): a
  source that a merging drafter (``auto``) asks only after the other sources' tree is
  selected, and only where ``pays`` says its draft is worth more; the small LM is one,
  through these hooks, not by identity.

The request says what the verifier can run (``DraftRequest.tree``,
``DraftRequest.extra_rows``): under chain verification only one path of the
tree is verified (the best-scored one) and no extra row runs, so a drafter
that prices its draft prices a chain. An object that is not a ``Drafter``
subclass but has ``name``/``begin``/``propose``/``commit`` is wrapped by
:func:`as_drafter`, the one place where missing hooks are filled in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

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
        tree: the verifier verifies whole trees (True) or one path of the tree,
            its best-scored one (False: chain verification, sliding-window or
            flash-attention models): a drafter that prices its draft then prices
            a chain.
        extra_rows: the step may run the drafter's ``window`` rows (never under
            chain verification).

    Example:
        >>> DraftRequest(budget=16, max_depth=127).budget
        16
        >>> DraftRequest(16, 127, tree=False).extra_rows
        False
    """

    budget: int
    max_depth: int
    # Whole trees, extra rows allowed: what a tree-mask verifier (sdpa, eager, the fast backend) runs.
    tree: bool = True
    extra_rows: bool | None = None  # None: as ``tree`` (extra rows need tree masks)

    def __post_init__(self) -> None:
        if self.budget < 0 or self.max_depth < 0:
            raise ValueError(f"budget and max_depth must be >= 0, got {self.budget}, {self.max_depth}")
        if self.extra_rows is None:
            object.__setattr__(self, "extra_rows", bool(self.tree))
        elif self.extra_rows and not self.tree:
            raise ValueError("extra rows need tree masks: a chain request (tree=False) cannot allow extra_rows")

    def sub(self, budget: int) -> "DraftRequest":
        """The same request with another budget (what a merging drafter asks of its sources)."""
        return DraftRequest(int(budget), self.max_depth, self.tree, self.extra_rows)


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


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# The signals' and outcomes' empty defaults, shared: a step builds several outcomes, and each fresh
# array costs ~0.4 us warm and several times that right after a forward (empty and read-only:
# nothing can be written into them).
_NO_ROWS = _read_only(np.zeros(0, np.int64))
_NO_IDS = _read_only(np.zeros((0, 0), np.int64))
_NO_PROBS = _read_only(np.zeros((0, 0), np.float32))


@dataclass(frozen=True, kw_only=True)
class VerifierSignals:
    """What a verify forward reports besides the logits the acceptance walk reads.

    One type for both ends: ``lookupdec.verify.VerifyResult`` and :class:`StepOutcome`
    subclass it, so a result's signals reach the drafter as ``StepOutcome(...,
    **res.signals().fields())`` and no field is copied by hand. Keyword-only.

    Attributes:
        row_tokens: int64 ``(rows,)`` input token of each row whose top-k is reported
            (the root, then nodes; empty unless the drafter asked for top-k).
        topk_ids, topk_probs: ``(rows, k)`` the target's top-k next tokens and their
            probabilities (softmax of the raw logits) after each of those rows.
        extra_argmax: int64 ``(m,)`` the target's argmax after each extra row the
            drafter's ``window`` asked for (empty when none ran).

    Example:
        >>> VerifierSignals(extra_argmax=np.array([3, 4])).window(1, 1).extra_argmax.tolist()
        [4]
    """

    row_tokens: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    topk_ids: np.ndarray = field(default_factory=lambda: _NO_IDS)
    topk_probs: np.ndarray = field(default_factory=lambda: _NO_PROBS)
    extra_argmax: np.ndarray = field(default_factory=lambda: _NO_ROWS)

    # The field names, in one place (what ``fields`` hands on).
    NAMES = ("row_tokens", "topk_ids", "topk_probs", "extra_argmax")

    def fields(self) -> dict:
        """The signals as keyword arguments (for a ``StepOutcome`` or another ``VerifierSignals``)."""
        return {name: getattr(self, name) for name in VerifierSignals.NAMES}

    def signals(self) -> "VerifierSignals":
        """The signals alone, as a plain ``VerifierSignals``."""
        return VerifierSignals(**self.fields())

    def window(self, lo: int, m: int) -> "VerifierSignals":
        """The same top-k with only extra rows ``lo .. lo + m - 1`` (one source's window in a merged one)."""
        return VerifierSignals(row_tokens=self.row_tokens, topk_ids=self.topk_ids, topk_probs=self.topk_probs,
                               extra_argmax=self.extra_argmax[lo:lo + m])


@dataclass(frozen=True, init=False)
class StepOutcome(VerifierSignals):
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
        topk_ms: what the deferred top-k (``row_tokens``, ``topk_ids``, ``topk_probs``)
            took to compute, in ms (0 when no top-k was asked for).
        row_tokens, topk_ids, topk_probs, extra_argmax: the verifier's signals
            (:class:`VerifierSignals`, keyword-only).

    Example:
        >>> StepOutcome((0,), (7, 9), DraftTree.chain([7]), np.array([0])).accepted
        (0,)
    """

    accepted: tuple[int, ...]
    new_tokens: tuple[int, ...]
    tree: DraftTree = field(default_factory=DraftTree.empty)
    origin: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    # What computing the deferred top-k took (ms): a cost of the sources that asked for it.
    topk_ms: float = 0.0

    def __init__(self, accepted: tuple[int, ...], new_tokens: tuple[int, ...], tree: DraftTree | None = None,
                 origin: np.ndarray = _NO_ROWS, topk_ms: float = 0.0, *, row_tokens: np.ndarray = _NO_ROWS,
                 topk_ids: np.ndarray = _NO_IDS, topk_probs: np.ndarray = _NO_PROBS,
                 extra_argmax: np.ndarray = _NO_ROWS) -> None:
        # The dataclass's fields, set in one call: its generated frozen ``__init__`` sets each
        # through ``object.__setattr__`` (~16 us an outcome right after a forward, and a drafted
        # step of ``auto`` builds one per source besides the step's own).
        self.__dict__.update(accepted=accepted, new_tokens=new_tokens,
                             tree=DraftTree.empty() if tree is None else tree, origin=origin, topk_ms=topk_ms,
                             row_tokens=row_tokens, topk_ids=topk_ids, topk_probs=topk_probs,
                             extra_argmax=extra_argmax)

    @property
    def n_accepted(self) -> int:
        return len(self.accepted)

    @classmethod
    def plain(cls, new_tokens: Sequence[int]) -> "StepOutcome":
        """A step that verified no draft (the prefill's first token, a plain step)."""
        return cls((), tuple(int(t) for t in new_tokens))


class Drafter:
    """Base class of every drafter: the protocol's calls, with default hooks.

    Subclasses set ``name`` and override ``propose`` (and ``begin``/``commit`` when
    they keep state); the optional hooks default to "none": no top-k, no window,
    no sampling of their own.

    Example:
        >>> class Fixed(Drafter):
        ...     name = "fixed"
        ...     def propose(self, request):
        ...         return DraftTree.chain([5, 6][: request.budget])
        >>> d = Fixed()
        >>> len(d.propose(DraftRequest(1, 4))), d.topk, d.window(DraftRequest(1, 4)), d.window_rows()
        (1, 0, None, 0)
    """

    name: str = "drafter"
    # Top-k candidates per verified row asked of the verifier (0: none); see the module docstring.
    topk: int = 0
    # A second-stage source in a merging drafter (``auto``): asked to propose only on steps where
    # ``pays`` says so, given what the other sources' tree is worth (the small LM: a forward per token).
    second_stage: bool = False

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """A new sequence starts with ``prompt_ids``."""

    def propose(self, request: DraftRequest) -> DraftTree:
        """A tree continuing the current sequence within ``request`` (default: the empty tree)."""
        return DraftTree.empty()

    def commit(self, outcome: StepOutcome) -> None:
        """What the verification made of the last proposal."""

    def set_sampling(self, params: Any, generator: Any) -> None:
        """The request's ``SamplingParams`` and a generator of the drafter's own (None when greedy)."""

    def window(self, request: DraftRequest) -> ExtraRows | None:
        """Extra rows for this step's forward (asked only when ``request.extra_rows``)."""
        return None

    def window_rows(self) -> int:
        """How many extra rows ``window`` will ask for this step."""
        return 0

    def pays(self, selection: Any, max_depth: int, margin: float) -> bool:
        """For a ``second_stage`` source: whether to propose this step.

        Args:
            selection: the ``Selection`` chosen from the other sources' merged tree.
            max_depth: deepest useful node this step.
            margin: how much more the draft must be worth (``drafters/select.py``).
        Returns:
            True to call ``propose`` (the default: always).
        """
        return True


class _Wrapped(Drafter):
    """A drafter object that does not subclass ``Drafter``: its missing hooks are the defaults."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.begin = inner.begin
        self.propose = inner.propose
        self.commit = inner.commit
        self.second_stage = bool(getattr(inner, "second_stage", False))
        for hook in ("set_sampling", "window", "window_rows", "pays"):
            fn = getattr(inner, hook, None)
            if fn is not None:
                setattr(self, hook, fn)

    @property
    def topk(self) -> int:  # read each step: a drafter may change it
        return max(int(getattr(self.inner, "topk", 0) or 0), 0)


def as_drafter(obj: Any) -> Drafter:
    """``obj`` as a :class:`Drafter`: itself when it subclasses it, else wrapped with the default hooks.

    Raises:
        TypeError: ``obj`` lacks ``begin``, ``propose`` or ``commit``.

    Example:
        >>> class Plain:
        ...     name = "plain"
        ...     def begin(self, ids): pass
        ...     def propose(self, request): return DraftTree.empty()
        ...     def commit(self, outcome): pass
        >>> d = as_drafter(Plain())
        >>> d.name, d.topk, isinstance(d, Drafter)
        ('plain', 0, True)
    """
    if isinstance(obj, Drafter):
        return obj
    missing = [m for m in ("begin", "propose", "commit") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"a drafter needs begin, propose and commit methods; {type(obj).__name__} lacks "
                        f"{', '.join(missing)} (subclass lookupdec.Drafter)")
    return _Wrapped(obj)


class NoDrafter(Drafter):
    """Drafts nothing: the decoder then runs plain autoregressive decoding (``ar``)."""

    name = "ar"
