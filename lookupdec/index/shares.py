"""How a lookup shares its occurrence budget among the shards that hold the longest match.

Policy, not a hot loop: a lookup samples at most ``max_occurrences``
occurrences in all, and each shard holding the match gets a share in
proportion to its count, so the continuations keep their corpus-wide
frequencies. This module must not import torch.
"""
from __future__ import annotations

from typing import Sequence


def split_occurrences(counts: Sequence[int], max_occurrences: int) -> list[int]:
    """Splits an occurrence budget across shards in proportion to their counts.

    If sum(counts) <= max_occurrences every shard gets its count. Otherwise
    shard s gets floor(M * c_s / C) (M = max_occurrences, C = sum(counts)),
    and the M - sum(floors) left over go one each to the shards with the
    largest remainders (M * c_s) mod C, ties to the lower shard index (the
    largest-remainder method; no shard gets more than its count).

    Example:
        >>> split_occurrences([6, 3, 1], 5)
        [3, 2, 0]
    """
    total = sum(counts)
    if total <= max_occurrences:
        return list(counts)
    quotas = [(max_occurrences * c) // total for c in counts]
    left = max_occurrences - sum(quotas)
    order = sorted(range(len(counts)), key=lambda s: (-((max_occurrences * counts[s]) % total), s))
    for s in order[:left]:
        quotas[s] += 1
    return quotas
