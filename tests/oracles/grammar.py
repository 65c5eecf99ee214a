"""Slow obvious oracle for structured output over a character-level vocabulary.

The language is given as a finite list of strings; with one character per token,
token ``c`` is allowed after text ``s`` exactly when ``s + c`` is a prefix of a
word, and EOS exactly when ``s`` is a word.
"""
from __future__ import annotations

import itertools
import re


def enumerate_regex(pattern: str, alphabet: str, max_len: int) -> list[str]:
    """Every string over ``alphabet`` of length <= ``max_len`` that ``re.fullmatch``es ``pattern`` (brute force)."""
    out = []
    for n in range(1, max_len + 1):
        for chars in itertools.product(alphabet, repeat=n):
            w = "".join(chars)
            if re.fullmatch(pattern, w):
                out.append(w)
    return out


class FiniteLanguage:
    """Allowed next characters / EOS after a prefix, from the word list itself."""

    def __init__(self, words) -> None:
        self.words = sorted(set(words))

    def allowed_chars(self, prefix: str) -> set[str]:
        return {w[len(prefix)] for w in self.words if len(w) > len(prefix) and w.startswith(prefix)}

    def eos_allowed(self, prefix: str) -> bool:
        return prefix in self.words

    def is_prefix(self, text: str) -> bool:
        return any(w.startswith(text) for w in self.words)

    def forced(self, prefix: str) -> str:
        """The characters every word continuing ``prefix`` shares next (empty if ``prefix`` is a word)."""
        if prefix in self.words:
            return ""
        conts = [w[len(prefix):] for w in self.words if w.startswith(prefix)]
        if not conts:
            return ""
        out = []
        for chars in zip(*conts):
            if len(set(chars)) != 1:
                break
            out.append(chars[0])
        return "".join(out)
