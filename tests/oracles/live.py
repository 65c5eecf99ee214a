"""The slow, obvious live index: the oracle ``lookupdec.index.live.LiveIndex`` is tested against.

(It was lookupdec's live index before the native one; kept here unchanged in
its rules, with ``match_reference`` and ``continuation_reference``, slower still.)

The index answers one question per decoding step: which is the longest suffix
of the sequence (``min_n`` to ``max_n`` tokens) that also occurred earlier, and
where did those earlier occurrences continue?

Structure: one dict from n-gram (a tuple of ``n`` tokens, for every ``n`` in
``[min_n, max_n]``) to the list of positions where its continuation starts,
in increasing order. Tuples of different lengths never compare equal, so one
dict serves every ``n``. An n-gram is registered only once the token after it
is known, so the dict never holds the current suffix itself: every position
in it has at least one continuation token. Appending a token costs
``max_n - min_n + 1`` dict updates; a query costs ``O(log(max_n))`` lookups
(binary search: if a suffix of length ``n`` occurred earlier, so did its
suffix of length ``n - 1``, ending at the same place). Nothing is ever rebuilt.

"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from lookupdec.index.live import LiveMatch


class PyLiveIndex:
    """Incremental n-gram index over a growing token sequence.

    Args:
        max_n: longest suffix looked up (tokens).
        min_n: shortest suffix that counts as a match (>= 1).

    Raises:
        ValueError: when ``min_n < 1`` or ``max_n < min_n``.

    Example:
        >>> idx = PyLiveIndex(max_n=4, min_n=1)
        >>> idx.extend([7, 8, 9, 5, 7, 8])
        >>> m = idx.match()
        >>> m.length, m.starts, idx.continuation(m.starts[0], 3)
        (2, (2,), [9, 5, 7])
    """

    def __init__(self, max_n: int = 16, min_n: int = 1) -> None:
        if min_n < 1:
            raise ValueError(f"min_n must be >= 1, got {min_n}")
        if max_n < min_n:
            raise ValueError(f"max_n ({max_n}) must be >= min_n ({min_n})")
        self.max_n = int(max_n)
        self.min_n = int(min_n)
        self._seq: list[int] = []
        # n-gram tuple -> increasing positions where its continuation starts.
        self._grams: dict[tuple[int, ...], list[int]] = {}

    # ---------------------------------------------------------------- update
    def reset(self, tokens: Iterable[int] = ()) -> None:
        """Forget everything, then index ``tokens``."""
        self._seq = []
        self._grams = {}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens``; O(len(tokens) * (max_n - min_n + 1)) work."""
        seq = self._seq
        grams = self._grams
        lo, hi = self.min_n, self.max_n
        for tok in tokens:
            tok = int(tok)
            # `end` = len(seq) is where the continuation of every n-gram ending
            # just before it starts: those n-grams get their first known token now.
            end = len(seq)
            for n in range(lo, min(hi, end) + 1):
                key = tuple(seq[end - n:end])
                where = grams.get(key)
                if where is None:
                    grams[key] = [end]
                else:
                    where.append(end)
            seq.append(tok)

    def append(self, token: int) -> None:
        """Append one token."""
        self.extend((token,))

    # ---------------------------------------------------------------- query
    def __len__(self) -> int:
        return len(self._seq)

    @property
    def tokens(self) -> np.ndarray:
        """A copy of the whole sequence as int64."""
        return np.array(self._seq, dtype=np.int64)

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
        lo = self.min_n if min_n is None else int(min_n)
        hi = self.max_n if max_n is None else int(max_n)
        if lo < self.min_n or hi > self.max_n or hi < lo:
            raise ValueError(f"query lengths [{lo}, {hi}] must lie inside the index's [{self.min_n}, {self.max_n}]")
        seq = self._seq
        L = len(seq)
        hi = min(hi, L - 1)  # a match needs a continuation token before the suffix's own start
        grams = self._grams
        best = 0
        best_where: list[int] | None = None
        # Binary search for the largest n in [lo, hi] whose suffix is indexed
        # (membership is monotone: shorter suffixes of a found one are found too).
        while lo <= hi:
            mid = (lo + hi) // 2
            where = grams.get(tuple(seq[L - mid:]))
            if where is None:
                hi = mid - 1
            else:
                best, best_where = mid, where
                lo = mid + 1
        if best_where is None:
            return LiveMatch.none()
        k = max(0, int(max_occurrences))
        starts = tuple(best_where[::-1][:k]) if k < len(best_where) else tuple(reversed(best_where))
        return LiveMatch(best, starts, len(best_where))

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
        seq = self._seq
        L = len(seq)
        if not 0 < start < L:
            raise ValueError(f"start {start} is outside [1, {L}); pass a start from LiveIndex.match()")
        out = seq[start:start + depth]
        if not periodic:
            return out
        period = L - start
        while len(out) < depth:
            # out[j] stands for position start + j >= L of the extended
            # sequence, which repeats position start + j - period (< start + j).
            src = start + len(out) - period
            out.append(seq[src] if src < L else out[src - start])
        return out


def match_reference(tokens: Sequence[int], max_n: int, min_n: int, max_occurrences: int = 8) -> LiveMatch:
    """Slow, obvious LiveIndex.match: scan the whole sequence for each length.

    Example:
        >>> match_reference([1, 2, 3, 1, 2], max_n=4, min_n=1)
        LiveMatch(length=2, starts=(2,), total=1)
    """
    seq = [int(t) for t in tokens]
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = seq[L - n:]
        # The occurrence ending just before `start` must leave start < L (a known continuation).
        starts = [s for s in range(n, L) if seq[s - n:s] == suffix]
        if starts:
            return LiveMatch(n, tuple(starts[::-1][:max_occurrences]), len(starts))
    return LiveMatch.none()


def continuation_reference(tokens: Sequence[int], start: int, depth: int) -> list[int]:
    """Slow LiveIndex.continuation: extend the sequence with period ``len - start``."""
    ext = [int(t) for t in tokens]
    period = len(ext) - start
    for _ in range(depth):
        ext.append(ext[len(ext) - period])
    return ext[start:start + depth]
