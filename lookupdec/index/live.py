"""LiveIndex: the prompt plus the generated tokens, indexed as they arrive (native).

The index answers one question per decoding step: which is the longest suffix
of the sequence (``min_n`` to ``max_n`` tokens) that also occurred earlier, and
where did those earlier occurrences continue?

The work happens in C (``ext/csrc/live.c``, through ``lookupdec._native.LiveCore``):
every position is chained to the previous position whose preceding
``min_n``-gram has the same hash, and (when ``max_n > min_n``) likewise for the
``(min_n + 1)``-gram; a query walks the chain of the current suffix's longer
n-gram, most recent first, extending each candidate backwards up to ``max_n``
tokens, and falls back to the shorter chain only when the longer n-gram never
occurred. Appending costs O(1) per token (a 32,000-token prompt is indexed in
well under a millisecond), a query O(occurrences of the suffix's n-gram), and
the index holds at most 16 bytes per token. Results equal the slow oracle in ``tests/oracles/live.py``
(tested on random and adversarial sequences).

This module must not import torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from lookupdec.index.manifest import MAX_TOKEN


@dataclass(frozen=True)
class LiveMatch:
    """The longest earlier occurrence of the sequence's suffix.

    Attributes:
        length: tokens matched (0 when no suffix of length >= ``min_n`` occurred earlier).
        starts: positions where the occurrences' continuations start, most recent
            first; ``tokens[start - length:start]`` equals the current suffix and
            ``start < len(tokens)``, so at least one continuation token is known.
        total: how many earlier occurrences there are (``starts`` holds at most
            ``max_occurrences`` of them).
    """

    length: int
    starts: tuple[int, ...]
    total: int

    @classmethod
    def none(cls) -> "LiveMatch":
        return cls(0, (), 0)


@dataclass(frozen=True)
class LiveDraft:
    """The longest match and its continuations counted into a trie (``LiveIndex.draft``).

    Attributes:
        length: tokens matched (0: no match; the arrays are empty).
        occurrences: occurrences whose continuations were counted (the most recent ones).
        tokens, parents, counts: the trie's best nodes as flat arrays (int64, int32,
            int64), parents before children; ``counts[i]`` occurrences continue
            with the path to node ``i``.
        shares: float64 ``counts / occurrences``, the share of the occurrences continuing with each path.
        conditionals: float64 ``shares[i] / shares[parent]`` (a child of the root: its share),
            the share of the parent's occurrences continuing with the node.
    """

    length: int
    occurrences: int
    tokens: np.ndarray
    parents: np.ndarray
    counts: np.ndarray
    shares: np.ndarray
    conditionals: np.ndarray


_NO_DRAFT = LiveDraft(0, 0, np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64),
                      np.zeros(0, np.float64), np.zeros(0, np.float64))


class LiveIndex:
    """Incremental index over a growing token sequence.

    Args:
        max_n: longest suffix looked up (tokens).
        min_n: shortest suffix that counts as a match (>= 1).

    Raises:
        ValueError: when ``min_n < 1`` or ``max_n < min_n``.

    Example:
        >>> idx = LiveIndex(max_n=4, min_n=1)
        >>> idx.extend([7, 8, 9, 5, 7, 8])
        >>> m = idx.match()
        >>> m.length, m.starts, idx.continuation(m.starts[0], 3)
        (2, (2,), [9, 5, 7])
    """

    def __init__(self, max_n: int = 16, min_n: int = 1) -> None:
        from lookupdec import _native

        if min_n < 1:
            raise ValueError(f"min_n must be >= 1, got {min_n}")
        if max_n < min_n:
            raise ValueError(f"max_n ({max_n}) must be >= min_n ({min_n})")
        self.max_n = int(max_n)
        self.min_n = int(min_n)
        self._core = _native.LiveCore(self.min_n, self.max_n)

    # ---------------------------------------------------------------- update
    def reset(self, tokens: Iterable[int] = ()) -> None:
        """Forget everything, then index ``tokens``."""
        self._core.clear()
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens``: O(1) work per token.

        Raises:
            ValueError: a token id outside ``[0, 2^31 - 1]``.
        """
        if type(tokens) in (list, tuple) and self._core.extend_ints(tokens):
            return  # plain ints in range, appended natively (a decoding step's path)
        arr = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
        if arr.size == 0:
            return
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"tokens must be a 1-D sequence of integer ids, got {arr.dtype} of shape {arr.shape}")
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high > MAX_TOKEN:
            raise ValueError(f"token id {low if low < 0 else high} is outside [0, {MAX_TOKEN}]")
        self._core.extend(np.ascontiguousarray(arr, dtype=np.int32))

    def append(self, token: int) -> None:
        """Append one token."""
        self.extend((token,))

    # ---------------------------------------------------------------- query
    def __len__(self) -> int:
        return len(self._core)

    @property
    def nbytes(self) -> int:
        """Bytes the index holds (its token copy included)."""
        return int(self._core.nbytes)

    @property
    def tokens(self) -> np.ndarray:
        """A copy of the whole sequence as int64."""
        return self._core.tokens().astype(np.int64)

    def _bounds(self, max_n: int | None, min_n: int | None) -> tuple[int, int]:
        lo = self.min_n if min_n is None else int(min_n)
        hi = self.max_n if max_n is None else int(max_n)
        if lo < self.min_n or hi > self.max_n or hi < lo:
            raise ValueError(f"query lengths [{lo}, {hi}] must lie inside the index's [{self.min_n}, {self.max_n}]")
        return lo, hi

    def match(self, max_occurrences: int = 8, max_n: int | None = None, min_n: int | None = None) -> LiveMatch:
        """The longest suffix that occurred earlier, and where it continued.

        Args:
            max_occurrences: how many occurrences to return (most recent first).
            max_n, min_n: narrower length bounds for this query (within the index's).

        Returns:
            A LiveMatch; ``LiveMatch.none()`` when no suffix of length
            ``>= min_n`` occurred earlier (also for sequences shorter than ``min_n + 1``).

        Raises:
            ValueError: when the bounds fall outside the index's ``[min_n, max_n]``.
        """
        lo, hi = self._bounds(max_n, min_n)
        length, total, starts = self._core.match(lo, hi, max(0, int(max_occurrences)))
        if not length:
            return LiveMatch.none()
        return LiveMatch(int(length), tuple(starts), int(total))

    def draft(self, max_occurrences: int, depth: int, width: int, max_n: int | None = None,
              min_n: int | None = None) -> LiveDraft:
        """The longest match's most recent occurrences, their continuations counted into a trie.

        Each of up to ``max_occurrences`` occurrences (most recent first)
        contributes ``depth`` tokens (``continuation(start, depth)``, periodic);
        the ``width`` best nodes are kept, ranked by count, then shallower, then
        insertion order (so the most recent occurrence wins ties).

        Raises:
            ValueError: bounds outside the index's.

        Example:
            >>> idx = LiveIndex(max_n=4, min_n=2)
            >>> idx.extend([1, 2, 3, 1, 2, 4, 1, 2])
            >>> d = idx.draft(max_occurrences=4, depth=2, width=8)
            >>> d.length, d.tokens.tolist(), d.parents.tolist(), d.counts.tolist()
            (2, [4, 1, 3, 1], [-1, 0, -1, 2], [1, 1, 1, 1])
        """
        if depth < 1 or width < 1:
            return _NO_DRAFT
        lo, hi = self._bounds(max_n, min_n)
        length, occurrences, tokens, parents, counts, shares, cond = self._core.draft(
            lo, hi, int(max_occurrences), int(depth), int(width))
        if not length:
            return _NO_DRAFT
        return LiveDraft(int(length), int(occurrences), tokens, parents, counts, shares, cond)

    def continuation(self, start: int, depth: int, periodic: bool = True) -> list[int]:
        """Up to ``depth`` tokens that followed an occurrence, from ``start`` on.

        An occurrence close to the end runs into the current suffix; with
        ``periodic`` its continuation then repeats with the period
        ``len(tokens) - start`` (the sequence so far is consistent with that
        period), so a repeating pattern is drafted to full depth rather than
        cut at the end of the sequence (as it is without ``periodic``).

        Raises:
            ValueError: when ``start`` is not in ``[1, len(tokens))``.
        """
        n = len(self._core)
        if not 0 < start < n:
            raise ValueError(f"start {start} is outside [1, {n}); pass a start from LiveIndex.match()")
        return self._core.continuation(int(start), max(int(depth), 0), bool(periodic))
