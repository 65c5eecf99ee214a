"""Exactness: every method's greedy tokens must equal ``ar``'s, token for token.

Spec-Bench's own ``equal.py`` compares with ``zip()``, which passes when one
output is a truncated copy of the other. Here the whole sequences are
compared, lengths included, and a mismatch raises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


class OutputMismatch(Exception):
    """A method's greedy output differs from the reference method's.

    Attributes:
        method, question_id, turn: where it happened (turn counts from 1).
        position: index of the first differing new token (for a truncated or
            over-long output, the length of the shorter one).
        expected, got: the two canonical token sequences.
    """

    def __init__(self, method: str, reference: str, question_id: int, turn: int, position: int,
                 expected: Sequence[int], got: Sequence[int]):
        self.method, self.reference = method, reference
        self.question_id, self.turn, self.position = question_id, turn, position
        self.expected, self.got = tuple(expected), tuple(got)
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"method {self.method!r}, question {self.question_id}, turn {self.turn}"
        e, g = self.expected, self.got
        if self.position >= min(len(e), len(g)):
            what = (f"{'truncated' if len(g) < len(e) else 'too long'}: {len(g)} new tokens vs "
                    f"{len(e)} from {self.reference!r}, equal up to position {self.position}")
        else:
            what = (f"first differing position {self.position}: got token {g[self.position]}, "
                    f"{self.reference!r} has {e[self.position]}")
        lo = max(0, self.position - 3)
        return (f"OUTPUT MISMATCH: {where}: {what}; "
                f"{self.reference} [{lo}:] = {list(e[lo:lo + 8])}, {self.method} [{lo}:] = {list(g[lo:lo + 8])}")


def canonical(token_ids: Sequence[int], eos_ids: Sequence[int]) -> tuple[int, ...]:
    """The new tokens without one trailing EOS.

    transformers keeps the EOS it stopped on; a decoder may drop it. Only a
    single final EOS is removed, so tokens after an EOS still count as
    different output.

    Example:
        >>> canonical([5, 6, 2], eos_ids=[2]), canonical([5, 6], eos_ids=[2])
        ((5, 6), (5, 6))
    """
    ids = tuple(int(t) for t in token_ids)
    if ids and ids[-1] in set(int(e) for e in eos_ids):
        return ids[:-1]
    return ids


def first_difference(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first position where the sequences differ; ``None`` if equal.

    A sequence that is a strict prefix of the other differs at its length.

    Example:
        >>> first_difference([1, 2, 3], [1, 2, 3]), first_difference([1, 2, 3], [1, 9, 3])
        (None, 1)
        >>> first_difference([1, 2, 3], [1, 2])
        2
    """
    n = min(len(expected), len(got))
    for i in range(n):
        if expected[i] != got[i]:
            return i
    return None if len(expected) == len(got) else n


@dataclass(frozen=True)
class ExactnessCheck:
    """Compares outputs against the reference method's, raising on any difference.

    Attributes:
        reference: the reference method's name (``"ar"``).
        eos_ids: EOS ids, for ``canonical``.
    """

    reference: str
    eos_ids: tuple[int, ...]

    def check(self, method: str, question_id: int, turn: int, expected: Sequence[int], got: Sequence[int]) -> None:
        """Raise ``OutputMismatch`` unless ``got`` equals ``expected`` (both canonicalised).

        Raises:
            OutputMismatch: naming the method, question, turn and first differing position.
        """
        e, g = canonical(expected, self.eos_ids), canonical(got, self.eos_ids)
        pos = first_difference(e, g)
        if pos is not None:
            raise OutputMismatch(method, self.reference, question_id, turn, pos, e, g)
