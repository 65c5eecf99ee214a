"""Slow, obvious references for the native core (``lookupdec._native``).

Each function here states a rule of the datastore in the plainest code that
can be checked by eye; tests compare the native routines against them on
random and adversarial inputs. They are quadratic or worse: use them on a few
thousand tokens at most. No torch, only numpy.

Conventions shared with the native core: token arrays are int32; -1 is the
document separator (SEP), which sorts below every token and is never matched
across; suffixes compare as token sequences, a proper prefix first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

SEP = -1


@dataclass(frozen=True)
class ReferenceLookup:
    """What one lookup finds (the fields the native path must reproduce).

    Attributes:
        match_len: length of the longest matched context suffix (0 = none).
        occurrences: occurrences of that suffix (summed over contributing shards).
        sampled: occurrences whose continuations were read (<= max_occurrences).
        tokens: int64 node tokens, in rank order.
        parents: int32 parent index per node, -1 for children of the root.
        counts: int64 sampled occurrences passing through each node.
    """

    match_len: int
    occurrences: int
    sampled: int
    tokens: np.ndarray
    parents: np.ndarray
    counts: np.ndarray


def suffix_array_reference(tokens: Sequence[int]) -> np.ndarray:
    """Suffix array by sorting the suffixes as Python lists.

    Args:
        tokens: token ids (>= 0) and separators (-1).

    Returns:
        int64 array of start positions, suffixes in increasing order (SEP is the
        smallest symbol because -1 < every id; a prefix sorts first).

    Example:
        >>> suffix_array_reference([1, 0, 1, 0]).tolist()
        [3, 1, 2, 0]
    """
    t = [int(x) for x in tokens]
    return np.array(sorted(range(len(t)), key=lambda i: t[i:]), dtype=np.int64)


def _matchable_context(context: Sequence[int]) -> list[int]:
    """The part of the context after its last separator (a match never spans one)."""
    c = [int(x) for x in context]
    if SEP in c:
        c = c[len(c) - c[::-1].index(SEP):]
    return c


def match_reference(tokens: Sequence[int], sa: Sequence[int], context: Sequence[int],
                    max_n: int, min_n: int) -> tuple[int, int, int]:
    """Longest suffix of context, length in [min_n, max_n], found in tokens.

    Tries lengths from the longest down and scans the whole suffix array for
    entries whose first L tokens equal the pattern.

    Args:
        tokens: the indexed token array; sa: its suffix array.
        context: query tokens, most recent last.
        max_n, min_n: longest and shortest suffix lengths tried (min_n >= 1).

    Returns:
        (match_len, lo, hi) with [lo, hi) the SA range of its occurrences;
        (0, 0, 0) when no length in range occurs.

    Example:
        >>> t = [5, 6, 7, 5, 6, 8]
        >>> match_reference(t, suffix_array_reference(t), [1, 5, 6], 4, 1)
        (2, 0, 2)
    """
    t = [int(x) for x in tokens]
    c = _matchable_context(context)
    for length in range(min(max_n, len(c)), min_n - 1, -1):
        pattern = c[len(c) - length:]
        hits = [i for i, p in enumerate(sa) if t[int(p):int(p) + length] == pattern]
        if hits:
            # a sorted suffix array keeps equal prefixes contiguous
            assert hits == list(range(hits[0], hits[-1] + 1))
            return length, hits[0], hits[-1] + 1
    return 0, 0, 0


def split_occurrences(counts: Sequence[int], max_occurrences: int) -> list[int]:
    """How a lookup shares max_occurrences samples among the shards holding the longest match.

    If sum(counts) <= max_occurrences every shard gets its count. Otherwise
    shard s gets floor(M * c_s / C) (M = max_occurrences, C = sum(counts)),
    and the M - sum(floors) left over go one each to the shards with the
    largest remainders (M * c_s) mod C, ties to the lower shard index (the
    largest-remainder method; no shard gets more than its count), so the
    continuations keep their corpus-wide frequencies.

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


def sample_entries(lo: int, hi: int, max_occurrences: int) -> list[int]:
    """SA entries sampled from [lo, hi): K = min(hi - lo, max_occurrences),
    entry lo + (i * (hi - lo)) // K for i in 0..K-1 (an even spread, so every
    continuation keeps its share of the counts).

    Example:
        >>> sample_entries(10, 20, 4)
        [10, 12, 15, 17]
    """
    count = hi - lo
    k = min(count, max_occurrences)
    return [lo + (i * count) // k for i in range(k)] if k > 0 else []


def continuation(tokens: Sequence[int], start: int, depth: int) -> list[int]:
    """Up to depth tokens from start, stopping before a separator or the end."""
    out = []
    for tok in tokens[start:start + depth]:
        if int(tok) == SEP:
            break
        out.append(int(tok))
    return out


def _count_paths(paths: dict, tokens, sa, lo, hi, match_len, max_occurrences, depth) -> int:
    entries = sample_entries(lo, hi, max_occurrences)
    for j in entries:
        cont = continuation(tokens, int(sa[j]) + match_len, depth)
        for d in range(1, len(cont) + 1):
            key = tuple(cont[:d])
            paths[key] = paths.get(key, 0) + 1
    return len(entries)


def top_nodes_reference(paths: dict, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The budget best trie nodes, as (tokens, parents, counts) in rank order.

    Rank: count descending, then depth ascending, then the token path in
    lexicographic order. A parent's count is at least its child's and its
    depth smaller, so it always ranks first: parents[i] < i.

    Args:
        paths: {token path tuple: count} for every node of the trie.
        budget: most nodes kept.
    """
    ranked = sorted(paths, key=lambda p: (-paths[p], len(p), p))[:max(budget, 0)]
    index = {p: i for i, p in enumerate(ranked)}
    tokens = np.array([p[-1] for p in ranked], dtype=np.int64)
    parents = np.array([index[p[:-1]] if len(p) > 1 else -1 for p in ranked], dtype=np.int32)
    counts = np.array([paths[p] for p in ranked], dtype=np.int64)
    return tokens, parents, counts


def lookup_reference(tokens, sa, context, max_n: int, min_n: int, max_occurrences: int,
                     depth: int, budget: int) -> ReferenceLookup:
    """One lookup on one shard: match, sample, count continuations, rank.

    Args:
        tokens, sa: a token array and its suffix array.
        context: query tokens, most recent last.
        max_n, min_n: suffix lengths tried (see match_reference).
        max_occurrences: most occurrences sampled (see sample_entries).
        depth: most continuation tokens read per occurrence.
        budget: most trie nodes returned.

    Returns:
        ReferenceLookup; an empty tree when nothing matches.

    Example:
        >>> t = [1, 2, 3, 1, 2, 4]
        >>> r = lookup_reference(t, suffix_array_reference(t), [1, 2], 2, 1, 10, 2, 4)
        >>> r.match_len, r.occurrences, r.tokens.tolist(), r.parents.tolist()
        (2, 2, [3, 4, 1], [-1, -1, 0])
    """
    return lookup_shards_reference([(tokens, sa)], context, max_n, min_n, max_occurrences,
                                   depth, budget)


def lookup_shards_reference(shards, context, max_n: int, min_n: int, max_occurrences: int,
                            depth: int, budget: int) -> ReferenceLookup:
    """One lookup over several shards with merged counts.

    Rule: the global match length is the longest match over all shards; only
    shards that match at that length contribute; max_occurrences is split over
    them by split_occurrences (in shard order); each contributing shard's
    sampled continuations are counted into one shared trie; the top budget
    nodes of that trie are returned.

    Args:
        shards: sequence of (tokens, sa) pairs.
        context, max_n, min_n, max_occurrences, depth, budget: as lookup_reference.

    Returns:
        ReferenceLookup with occurrences summed over contributing shards.

    Example:
        >>> a, b = [1, 2, 3], [1, 2, 4, 1, 2, 3]
        >>> shards = [(a, suffix_array_reference(a)), (b, suffix_array_reference(b))]
        >>> r = lookup_shards_reference(shards, [1, 2], 2, 1, 10, 1, 4)
        >>> r.occurrences, r.tokens.tolist(), r.counts.tolist()
        (3, [3, 4], [2, 1])
    """
    matches = [match_reference(t, sa, context, max_n, min_n) for t, sa in shards]
    best = max((m[0] for m in matches), default=0)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64))
    if best == 0:
        return ReferenceLookup(0, 0, 0, *empty)
    live = [s for s, m in enumerate(matches) if m[0] == best]
    counts = [matches[s][2] - matches[s][1] for s in live]
    quotas = split_occurrences(counts, max_occurrences)
    paths: dict = {}
    sampled = 0
    for s, quota in zip(live, quotas):
        tokens, sa = shards[s]
        _, lo, hi = matches[s]
        sampled += _count_paths(paths, tokens, sa, lo, hi, best, quota, depth)
    return ReferenceLookup(best, sum(counts), sampled, *top_nodes_reference(paths, budget))
