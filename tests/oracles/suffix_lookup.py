"""SuffixIndex.lookup composed in Python from the per-shard native kernels.

This is how ``lookupdec.index.suffix`` looked an index up before the whole
lookup moved into one native call (``_native.Shards.lookup``): a Python loop
over the shards calling ``_native.match``, the largest-remainder split of
``split_occurrences``, ``ContinuationTrie.add`` per shard, ``top``, then the
out-of-vocabulary filter in numpy. It is the oracle the native call must equal
exactly (tests/test_index_lookup.py); slower, not simpler than the rules in
tests/oracles/index.py, but built from independently tested pieces.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lookupdec import _native
from lookupdec.index.suffix import Lookup, _check_params, _context_tail
from lookupdec.tree import DraftTree
from tests.oracles.index import split_occurrences

_NO_MATCH = Lookup(0, 0, 0, DraftTree.empty())


def composed_lookup(shards: Sequence[tuple[np.ndarray, np.ndarray]], context, max_n: int = 16, min_n: int = 2,
                    max_occurrences: int = 5000, depth: int = 10, budget: int = 64,
                    token_limit: int = 2**31) -> Lookup:
    """One lookup over shards, composed in Python (the arguments of SuffixIndex.lookup).

    Args:
        shards: (tokens, sa) pairs, as the index's ``_shards`` hold them.
        context, max_n, min_n, max_occurrences, depth, budget: as SuffixIndex.lookup.
        token_limit: ids at or above it are dropped with their subtrees (the
            index's vocabulary size; 2^31 drops nothing).

    Returns:
        The Lookup the index must return.
    """
    _check_params(max_n, min_n, max_occurrences, depth, budget)
    ctx = _context_tail(context, max_n)
    if ctx.size < min_n:
        return _NO_MATCH
    # 1-2. Each shard's own longest match; the longest of them, and the shards whose match has that length.
    found = [_native.match(tokens, sa, ctx, max_n, min_n) for tokens, sa in shards]
    best = max((length for length, _, _ in found), default=0)
    ranges = [(s, lo, hi) for s, (length, lo, hi) in enumerate(found) if length and length == best]
    if best == 0:
        return _NO_MATCH
    counts = [hi - lo for _, lo, hi in ranges]
    # 3. Share the samples among shards and count continuations into one trie.
    trie = _native.ContinuationTrie(max(max_occurrences * depth, 1024))
    sampled = 0
    for (s, lo, hi), quota in zip(ranges, split_occurrences(counts, max_occurrences)):
        if quota:
            tokens, sa = shards[s]
            sampled += trie.add(tokens, sa, lo, hi, best, quota, depth)
    # 4. The best nodes as a tree.
    tokens, parents, node_counts = trie.top(budget)
    if tokens.size and int(tokens.max()) >= token_limit:
        tokens, parents, node_counts = drop_out_of_vocabulary(tokens, parents, node_counts, token_limit)
    tree = DraftTree.trusted(tokens, parents, node_counts / float(max(sampled, 1)))
    return Lookup(best, int(sum(counts)), int(sampled), tree, node_counts)


def drop_out_of_vocabulary(tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray, limit: int):
    """The nodes whose path holds only ids below ``limit`` (a damaged index can hold others)."""
    keep = np.zeros(tokens.size, bool)
    for i in range(tokens.size):  # parents come first
        p = int(parents[i])
        keep[i] = tokens[i] < limit and (p < 0 or keep[p])
    idx = np.flatnonzero(keep)
    remap = np.full(tokens.size, -1, np.int32)
    remap[idx] = np.arange(idx.size, dtype=np.int32)
    new_parents = np.where(parents[idx] >= 0, remap[np.maximum(parents[idx], 0)], -1).astype(np.int32)
    return tokens[idx], new_parents, counts[idx]
