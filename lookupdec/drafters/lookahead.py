"""Lookahead: an n-gram pool harvested from Jacobi iterations run beside verification.

After Fu et al. (Lookahead decoding, ICML 2024). Each step the drafter runs a
2-D window of ``L = N - 1`` levels by ``W`` columns as extra rows of the
verify forward (protocol version 3, ``window``): level 0 is a causal chain
after the root; row (l, c) sees level 0 up to column ``c - l``, then the
diagonal (1, c - l + 1), ..., (l, c): a chain of ``c + 1`` tokens, so its
position is ``past + 1 + c``. The target's argmax after each row comes back
with the step's outcome. Then:

- the last level's rows close N-grams: the diagonal chain a row (L - 1, c)
  sees (one token per level) plus its argmax; each goes into the pool, keyed
  by its first token, most recent first, at most ``G`` per key;
- the levels move up one (level 0 is dropped) and the last level's argmax
  become the new top level, one column to the right (the Jacobi update: the
  token after column ``c`` is the guess for column ``c + 1``).

The pool is also seeded with the prompt's N-grams and receives those of the
committed text. The step's draft is the pool's continuations of the root
token, scored by calibrated acceptance (source ``lookahead``).

Sizing (W, N, G from the cost curve, not constants tuned for a GPU): the
window gets the most rows ``m`` whose forward costs at most
``row_fraction`` (default 10%) over a plain step, ``c(1 + j) <= (1 + f) c(1)``
for every ``j <= m`` (``m <= 64``); then ``N - 1 = clamp(floor(sqrt(m)), 1, 4)``
levels of ``W = m // (N - 1)`` columns, and ``G = max(W, 2)`` (Lookahead's
own choice is G = W). With 64 rows this is W = 16, N = 5, the paper's shape
for 7B models on a GPU; on a CPU whose forward grows fast with width it is a
window of a few rows, or none.

Drafts and window tokens are functions of the committed history and the
target's argmax, never of the sampling draws, so greedy decoding and exact
speculative sampling for deterministic drafts both stay lossless.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from lookupdec.costs import CostCurve
from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, ExtraRows, StepOutcome
from lookupdec.drafters.calibrate import Calibration, NodeScorer, conditional
from lookupdec.tree import DraftTree

MAX_WINDOW_ROWS = 64
MAX_LEVELS = 4


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of :class:`LookaheadDrafter`; None sizes come from the cost curve (module docstring).

    Raises:
        ValueError: sizes below their minimum, or a fraction outside [0, 1].
    """

    window: int | None = None   # W: columns of the Jacobi window (0: no window, the pool only)
    ngram: int | None = None    # N: n-gram size (levels = N - 1)
    guess: int | None = None    # G: most continuations kept per key
    # Extra cost the window may add to a plain step (the sizing rule's f).
    row_fraction: float = 0.10

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window}")
        if self.ngram is not None and self.ngram < 2:
            raise ValueError(f"ngram must be >= 2, got {self.ngram}")
        if self.guess is not None and self.guess < 1:
            raise ValueError(f"guess must be >= 1, got {self.guess}")
        if not 0.0 <= self.row_fraction <= 1.0:
            raise ValueError(f"row_fraction must be in [0, 1], got {self.row_fraction}")


@dataclass(frozen=True)
class LookaheadShape:
    """The window and pool sizes in use: ``window`` (W) columns, ``ngram`` (N), ``guess`` (G)."""

    window: int
    ngram: int
    guess: int

    @property
    def rows(self) -> int:
        return self.window * (self.ngram - 1)


def window_rows_for(curve: CostCurve | None, fraction: float, past: int | None = None) -> int:
    """The most window rows ``m`` with ``c(1 + j) <= (1 + fraction) c(1)`` for every ``j <= m`` (at most 64).

    ``c(1 + j)`` includes the ``lm_head`` product over the ``j`` rows (``CostCurve.logits_extra_ms``).

    Example:
        >>> window_rows_for(CostCurve((1, 9, 64), (10.0, 10.8, 30.0), 0, (0, 0, 0), "", ""), 0.1)
        8
    """
    if curve is None:
        return 0
    c1 = curve.ms_at(1, past)
    m = 0
    while m < MAX_WINDOW_ROWS:
        w = m + 2  # the root and m + 1 window rows, every one with logits
        if curve.ms_at(w, past) + curve.logits_extra_ms(w, w) > (1.0 + fraction) * c1:
            break
        m += 1
    return m


def shape_for(rows: int, config: LookaheadConfig) -> LookaheadShape:
    """W, N and G for ``rows`` window rows, with the config's explicit sizes taking precedence.

    Example:
        >>> shape_for(64, LookaheadConfig())
        LookaheadShape(window=16, ngram=5, guess=16)
        >>> shape_for(4, LookaheadConfig())
        LookaheadShape(window=2, ngram=3, guess=2)
    """
    levels = max(1, min(MAX_LEVELS, int(math.isqrt(max(rows, 1)))))
    ngram = config.ngram if config.ngram is not None else levels + 1
    window = config.window if config.window is not None else rows // (ngram - 1)
    guess = config.guess if config.guess is not None else max(window, 2)
    return LookaheadShape(int(window), int(ngram), int(guess))


def window_rows(levels: np.ndarray) -> ExtraRows:
    """The extra rows of a ``(L, W)`` window: row ``l * W + c`` holds ``levels[l, c]`` (module docstring).

    Example:
        >>> x = window_rows(np.array([[5, 6], [7, 8]]))
        >>> x.depth.tolist(), x.visible.astype(int).tolist()
        ([1, 2, 1, 2], [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]])
    """
    depth, visible = _layout(*levels.shape)
    return ExtraRows(levels.reshape(-1).copy(), depth, visible)


@lru_cache(maxsize=16)
def _layout(L: int, W: int) -> tuple[np.ndarray, np.ndarray]:
    """Depths and visibility of an ``(L, W)`` window: fixed by its shape, so built once per shape (read-only)."""
    m = L * W
    visible = np.zeros((m, m), bool)
    for l in range(L):
        for c in range(W):
            r = l * W + c
            for j in range(0, c - l + 1):           # level 0 up to column c - l
                visible[r, j] = True
            for j in range(min(l, c) + 1):          # the diagonal up to itself
                visible[r, (l - j) * W + (c - j)] = True
    depth = np.tile(np.arange(1, W + 1), L)
    depth.flags.writeable = False
    visible.flags.writeable = False
    return depth, visible


class NgramPool:
    """Continuations by first token, most recent first, at most ``guess`` per key.

    Example:
        >>> p = NgramPool(2)
        >>> for g in ([1, 2, 3], [1, 4, 5], [1, 2, 3], [1, 6, 7]): p.add(g)
        >>> p.get(1)
        [(6, 7), (2, 3)]
    """

    def __init__(self, guess: int) -> None:
        self.guess = int(guess)
        self._pool: dict[int, list[tuple[int, ...]]] = {}

    def add(self, gram: Sequence[int]) -> None:
        key, value = int(gram[0]), tuple(int(t) for t in gram[1:])
        entries = self._pool.setdefault(key, [])
        if value in entries:
            entries.remove(value)
        entries.insert(0, value)
        del entries[self.guess:]

    def get(self, key: int) -> list[tuple[int, ...]]:
        return list(self._pool.get(int(key), ()))

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())


class LookaheadDrafter(Drafter):
    """Lookahead as a drafting source (see the module docstring).

    Args:
        config: a :class:`LookaheadConfig`; or its fields as keyword settings.
        calibration: the shared acceptance rates (a private one when None).
        cost: the verifier's CostCurve, or a callable returning it (sizes W, N, G at ``begin``);
            None and no explicit sizes: W = 4, N = 3.

    Example:
        >>> d = LookaheadDrafter(window=2, ngram=3)
        >>> d.begin([5, 6, 7, 5, 6])
        >>> d.propose(DraftRequest(budget=8, max_depth=8)).tokens.tolist()   # the prompt's 3-gram after 6
        [7, 5]
        >>> len(d.window(DraftRequest(budget=8, max_depth=8)))
        4
    """

    name = "lookahead"

    def __init__(self, config: LookaheadConfig | None = None, *, calibration: Calibration | None = None,
                 cost: CostCurve | Callable[[], CostCurve] | None = None, **settings) -> None:
        if config is not None and settings:
            raise TypeError("pass either a LookaheadConfig or keyword settings, not both")
        self.config = config if config is not None else LookaheadConfig(**settings)
        self._scorer = NodeScorer(self.name, calibration)
        self._cost = cost
        self.shape = shape_for(8, self.config)
        self.pool = NgramPool(self.shape.guess)
        self.levels = np.zeros((self.shape.ngram - 1, self.shape.window), np.int64)
        self._seq: list[int] = []
        self._ran = False

    def _size(self, past: int) -> LookaheadShape:
        cost = self._cost
        if callable(cost) and not isinstance(cost, CostCurve):
            cost = self._cost = cost()
        rows = 8 if cost is None else window_rows_for(cost, self.config.row_fraction, past)
        return shape_for(rows, self.config)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._seq = [int(t) for t in prompt_ids]
        self._scorer.restart()
        self.shape = self._size(len(self._seq))
        self.pool = NgramPool(self.shape.guess)
        n = self.shape.ngram
        for i in range(max(len(self._seq) - n + 1, 0)):
            self.pool.add(self._seq[i:i + n])
        # The window starts from prompt tokens (deterministic: a seeded draw from the prompt).
        rng = np.random.default_rng(len(self._seq))
        src = np.asarray(self._seq or [0], np.int64)
        self.levels = src[rng.integers(0, len(src), (n - 1, self.shape.window))]
        self._ran = False

    def window_rows(self) -> int:
        """Rows ``window`` will return this step (what ``auto`` prices)."""
        return self.shape.rows

    def window(self, request: DraftRequest) -> ExtraRows | None:
        """The Jacobi window as extra rows (None when the window is empty)."""
        if not self.shape.rows:
            return None
        self._ran = True
        return window_rows(self.levels)

    def propose(self, request: DraftRequest) -> DraftTree:
        """The pool's continuations of the last token, scored; empty when it holds none."""
        if not self._seq or request.budget <= 0 or request.max_depth <= 0:
            return self._scorer.score(DraftTree.empty(), np.zeros(0), 1, SOURCES[self.name])
        cands = [c[: request.max_depth] for c in self.pool.get(self._seq[-1])]
        cands = [c for c in cands if c]
        tree = DraftTree.from_sequences(cands).prune(request.budget) if cands else DraftTree.empty()
        return self._scorer.score(tree, conditional(tree), 1, SOURCES[self.name])

    def commit(self, outcome: StepOutcome) -> None:
        self._scorer.learn(outcome.new_tokens)
        L, W = self.levels.shape
        if self._ran and len(outcome.extra_argmax) == L * W:
            out = np.asarray(outcome.extra_argmax, np.int64).reshape(L, W)
            for c in range(L - 1, W):
                gram = [int(self.levels[l, c - (L - 1) + l]) for l in range(L)] + [int(out[L - 1, c])]
                self.pool.add(gram)
            top = np.empty(W, np.int64)
            top[1:] = out[L - 1, :-1]
            top[0] = out[L - 1, 0]
            self.levels = np.concatenate([self.levels[1:], top[None]])
        self._ran = False
        n = self.shape.ngram
        start = len(self._seq)
        self._seq.extend(int(t) for t in outcome.new_tokens)
        for j in range(max(start, n - 1), len(self._seq)):  # the N-grams the new tokens complete
            self.pool.add(self._seq[j - n + 1:j + 1])
