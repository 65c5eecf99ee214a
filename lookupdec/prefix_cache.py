"""Reuse of KV rows across requests: a prompt that starts with tokens an earlier sequence ran
(a chat's next turn, a shared system prompt, the same document asked about again) prefills
only the tokens after them.

A sequence's prompt rows are kept as soon as it is prefilled (so requests decoding beside it,
the same document asked about at once, reuse them too), and all its rows with their tokens (its
prompt and its output) when it finishes; a later prompt takes the rows of its longest common
prefix with any kept sequence and runs the rest. An entry that extends a kept one (the finished
sequence over its prompt, a chat's next turn over the last) takes that one's rows over and copies
only the rows after them.
The store holds at most ``max_mb`` MiB of rows, least recently used dropped first; a kept
sequence whose tokens begin another's is dropped as the longer one arrives.

Exact by construction where a row's bits do not depend on the forward that computed it
(``FastForward.rows_independent``: the quantized formats): a reused row is the row a prefill
of the whole prompt computes, bit for bit (tests/test_prefix_cache.py), so every output is
unchanged. In the float formats a row's rounding depends slightly on its forward's width (the
same caveat as a tree's rows: README, What is guaranteed), so the store is used there only when
asked for.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

# Default size where reuse is exact (the quantized formats): a few thousand rows of a small model
# (the embedded model's rows take 45 KiB a token: 5,800 tokens).
DEFAULT_MB = 256.0


@dataclass
class _Kept:
    ids: np.ndarray                  # (n,) int64: the tokens whose rows are kept
    parts: "list[torch.Tensor]"      # (layers, 2, kv_heads, rows, head_dim) each: their rows, in order, n in all

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


@dataclass(frozen=True)
class PrefixStats:
    """What the store did.

    Attributes:
        entries: sequences kept now.
        bytes: their rows' bytes.
        lookups: prompts looked up.
        hits: prompts that reused rows.
        reused_tokens: prompt tokens whose rows were reused (not prefilled).
    """

    entries: int
    bytes: int
    lookups: int
    hits: int
    reused_tokens: int


def check_prefix_cache_mb(value, name: str = "prefix_cache_mb") -> float | None:
    """``value`` as MiB (>= 0; 0 turns reuse off), or None (the default); ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise ValueError(f"{name} must be a number of MiB >= 0 (0 turns prefix reuse off), got {value!r}")
    return float(value)


def prefix_store(fast, mb: float | None) -> "PrefixCache | None":
    """A decoder's store: ``mb`` MiB (checked), or for None ``DEFAULT_MB`` where rows do not depend on
    their forward (``fast.rows_independent``) and none elsewhere; ``fast`` is the verifier's
    ``FastForward`` (None on transformers' forward, which cannot reuse rows: ValueError if asked)."""
    if fast is None:
        if mb:
            raise ValueError("prefix_cache_mb needs lookupdec's fast forward (a Llama-family model on a CPU, "
                             "hf_kernels=False); this decoder runs transformers' forward: leave it unset or 0")
        return None
    if mb is None:
        mb = DEFAULT_MB if fast.rows_independent else 0.0
    return PrefixCache(mb) if mb else None


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    """Rows of finished sequences for later prompts (see the module docstring).

    Args:
        max_mb: most MiB of rows kept (> 0).

    Example:
        >>> store = PrefixCache(64)                                    # doctest: +SKIP
        >>> reused = store.fill(cache, prompt_ids)   # rows 0..reused-1 now in cache  # doctest: +SKIP
        >>> store.keep(prompt_ids + output_ids, cache)                 # doctest: +SKIP
    """

    def __init__(self, max_mb: float) -> None:
        if not check_prefix_cache_mb(max_mb, "max_mb"):
            raise ValueError(f"max_mb must be > 0, got {max_mb!r}")
        self.max_bytes = int(max_mb * 2**20)
        self._kept: OrderedDict[int, _Kept] = OrderedDict()  # least recently used first
        self._next = 0
        self._bytes = 0
        self._lookups = self._hits = self._reused = 0

    def stats(self) -> PrefixStats:
        return PrefixStats(len(self._kept), self._bytes, self._lookups, self._hits, self._reused)

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0

    def fill(self, cache, prompt_ids: Sequence[int]) -> int:
        """Copy the rows of the prompt's longest kept prefix into the empty ``cache``.

        At least the prompt's last token is left to run (its row gives the first logits).

        Returns:
            the rows reused (``cache.length``; 0 when none).
        """
        self._lookups += 1
        if cache.length:
            raise ValueError("a prefix is filled into an empty cache only")
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        best, best_n = None, 0
        for key, kept in self._kept.items():
            n = common_prefix(kept.ids, prompt)
            if n > best_n:
                best, best_n = key, n
        best_n = min(best_n, len(prompt) - 1)
        if best is None or best_n <= 0:
            return 0
        kept = self._kept[best]
        self._kept.move_to_end(best)
        cache.reserve(best_n)
        at = 0
        for part in kept.parts:
            take = min(part.shape[3], best_n - at)
            if take <= 0:
                break
            cache.kv[:, :, :, at:at + take].copy_(part[:, :, :, :take])
            at += take
        cache.length = best_n
        self._hits += 1
        self._reused += best_n
        return best_n

    def keep(self, token_ids: Sequence[int], cache) -> None:
        """Keep the rows of ``cache`` (those of ``token_ids``' first ``cache.length`` tokens).

        Nothing is copied when a kept sequence already begins with these tokens. A kept sequence
        that these tokens begin with (a prompt kept at its prefill, now finished; a chat's earlier
        turn) is replaced: its rows become the new entry's first part, and only the rows after
        it are copied. Then the least recently used go until the store fits ``max_mb``. A
        sequence larger than the whole store is not kept.
        """
        n = min(cache.length, len(token_ids))
        if n <= 0:
            return
        ids = np.asarray(token_ids[:n], dtype=np.int64)
        base = None  # the longest kept prefix of these tokens
        for key, kept in list(self._kept.items()):
            shared = common_prefix(kept.ids, ids)
            if shared == n:  # already kept (as a prefix of a longer sequence or the same one)
                self._kept.move_to_end(key)
                return
            if shared == len(kept.ids):  # a prefix of these tokens: the new entry takes its rows over
                if base is None or len(kept.ids) > len(base.ids):
                    base = kept
                self._drop(key)
        start = 0 if base is None else len(base.ids)
        rest = cache.kv[:, :, :, start:n].clone()
        entry = _Kept(ids, ([] if base is None else base.parts) + [rest])
        nbytes = entry.nbytes
        if nbytes > self.max_bytes:
            return
        while self._kept and self._bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._kept)))
        self._kept[self._next] = entry
        self._next += 1
        self._bytes += nbytes

    def _drop(self, key: int) -> None:
        self._bytes -= self._kept.pop(key).nbytes
