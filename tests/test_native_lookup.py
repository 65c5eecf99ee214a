"""match() and ContinuationTrie in lookupdec._native against the slow
references in tests/oracles/index.py, and tiny hand-computed cases that
pin each lookup rule."""
import numpy as np
import pytest

from lookupdec import _native as N
from tests.oracles.index import lookup_reference, lookup_shards_reference, match_reference, split_occurrences


def arr(values):
    return np.asarray(values, dtype=np.int32)


def shard(values, wide=False):
    tokens = arr(values)
    return tokens, (N._suffix_array64(tokens) if wide else N.suffix_array(tokens))


def native_lookup(shards, context, max_n, min_n, max_occurrences, depth, budget, trie=None):
    """The native pipeline, with the same cross-shard rule as the reference."""
    context = arr(context)
    matches = [N.match(t, sa, context, max_n, min_n) for t, sa in shards]
    best = max(m[0] for m in matches)
    trie = trie or N.ContinuationTrie(max(1, max_occurrences * depth))
    trie.reset()
    if best == 0:
        return 0, 0, 0, trie.top(budget)
    live = [s for s, m in enumerate(matches) if m[0] == best]
    counts = [matches[s][2] - matches[s][1] for s in live]
    sampled = 0
    for s, quota in zip(live, split_occurrences(counts, max_occurrences)):
        tokens, sa = shards[s]
        sampled += trie.add(tokens, sa, matches[s][1], matches[s][2], best, quota, depth)
    return best, sum(counts), sampled, trie.top(budget)


def assert_same(shards, context, max_n, min_n, max_occurrences, depth, budget, trie=None):
    ref = lookup_shards_reference(shards, context, max_n, min_n, max_occurrences, depth, budget)
    best, occ, sampled, (tok, par, cnt) = native_lookup(
        shards, context, max_n, min_n, max_occurrences, depth, budget, trie)
    assert (best, occ, sampled) == (ref.match_len, ref.occurrences, ref.sampled)
    assert tok.dtype == np.int64 and par.dtype == np.int32 and cnt.dtype == np.int64
    assert tok.tolist() == ref.tokens.tolist()
    assert par.tolist() == ref.parents.tolist()
    assert cnt.tolist() == ref.counts.tolist()
    assert all(p < i for i, p in enumerate(par.tolist()))


# ---- equivalence on random inputs ------------------------------------------

def random_context(rng, tokens, k):
    """Half the time a corpus slice (long matches), else random tokens."""
    length = int(rng.integers(0, 10))
    if tokens.size and rng.random() < 0.5:
        start = int(rng.integers(0, tokens.size))
        ctx = list(rng.integers(0, k, size=int(rng.integers(0, 3)))) + tokens[start:start + length].tolist()
    else:
        ctx = rng.integers(-1 if rng.random() < 0.2 else 0, k, size=length).tolist()
    return ctx


def test_match_equals_reference_on_random_inputs():
    rng = np.random.default_rng(0)
    for _ in range(400):
        k = int(rng.choice([1, 2, 3, 5, 20]))
        tokens, sa = shard(rng.integers(-1, k, size=int(rng.integers(1, 80))), wide=rng.random() < 0.3)
        ctx = random_context(rng, tokens, k)
        max_n = int(rng.integers(1, 10))
        min_n = int(rng.integers(1, max_n + 1))
        assert N.match(tokens, sa, arr(ctx), max_n, min_n) == match_reference(tokens, sa, ctx, max_n, min_n)


def test_lookup_equals_reference_on_random_inputs_one_shard():
    rng = np.random.default_rng(1)
    trie = N.ContinuationTrie(8 * 6)  # reused across lookups: reset must forget everything
    for _ in range(400):
        k = int(rng.choice([1, 2, 3, 4, 8]))
        tokens, sa = shard(rng.integers(-1, k, size=int(rng.integers(1, 100))), wide=rng.random() < 0.3)
        ctx = random_context(rng, tokens, k)
        max_n = int(rng.integers(1, 8))
        min_n = int(rng.integers(1, max_n + 1))
        assert_same([(tokens, sa)], ctx, max_n, min_n, int(rng.integers(1, 9)),
                    int(rng.integers(0, 7)), int(rng.integers(0, 25)), trie)


def test_lookup_equals_reference_on_random_inputs_several_shards():
    rng = np.random.default_rng(2)
    for _ in range(300):
        k = int(rng.choice([2, 3, 5]))
        shards = [shard(rng.integers(-1, k, size=int(rng.integers(1, 60))), wide=rng.random() < 0.3)
                  for _ in range(int(rng.integers(1, 4)))]
        ctx = random_context(rng, shards[0][0], k)
        max_n = int(rng.integers(1, 6))
        min_n = int(rng.integers(1, max_n + 1))
        assert_same(shards, ctx, max_n, min_n, int(rng.integers(1, 12)), int(rng.integers(1, 5)),
                    int(rng.integers(0, 30)))


def test_lookup_reference_single_shard_is_the_shard_rule_with_one_shard():
    tokens, sa = shard([1, 2, 3, 1, 2, 4, 1, 2, 3])
    a = lookup_reference(tokens, sa, [1, 2], 4, 1, 2, 3, 10)
    b = lookup_shards_reference([(tokens, sa)], [1, 2], 4, 1, 2, 3, 10)
    assert (a.match_len, a.occurrences, a.sampled) == (b.match_len, b.occurrences, b.sampled)
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


# ---- rules pinned by hand ---------------------------------------------------

def test_no_match_is_zero_and_an_empty_tree():
    tokens, sa = shard([1, 2, 3])
    assert N.match(tokens, sa, arr([9]), 4, 1) == (0, 0, 0)
    best, occ, sampled, (tok, par, cnt) = native_lookup([(tokens, sa)], [9], 4, 1, 10, 3, 8)
    assert (best, occ, sampled, tok.size, par.size, cnt.size) == (0, 0, 0, 0, 0, 0)


def test_context_shorter_than_min_n_matches_nothing():
    tokens, sa = shard([1, 2, 3, 1, 2])
    assert N.match(tokens, sa, arr([2]), 4, 2) == (0, 0, 0)
    assert N.match(tokens, sa, arr([]), 4, 1) == (0, 0, 0)


def test_longest_suffix_wins_over_more_frequent_shorter_one():
    tokens, sa = shard([1, 2, 3, 9, 2, 3, 9, 7, 2, 3, 5])
    # "2 3" occurs 3 times, "1 2 3" once: the longest is chosen
    length, lo, hi = N.match(tokens, sa, arr([1, 2, 3]), 4, 1)
    assert (length, hi - lo) == (3, 1)


def test_match_never_crosses_a_separator():
    tokens, sa = shard([1, 2, -1, 3, 4])
    # "2 3" exists only across the separator, so only "3" matches
    length, lo, hi = N.match(tokens, sa, arr([2, 3]), 4, 1)
    assert (length, hi - lo) == (1, 1)
    # a separator in the context bounds the suffix: "1 -1 3" can only match "3"
    assert N.match(tokens, sa, arr([2, -1, 3]), 4, 1)[0] == 1
    assert N.match(tokens, sa, arr([2, -1]), 4, 1) == (0, 0, 0)


def test_continuation_stops_at_separator_and_at_array_end():
    tokens, sa = shard([5, 6, 7, -1, 8])
    _, (tok, par, cnt) = native_lookup([(tokens, sa)], [5, 6], 2, 1, 10, 5, 10)[2:]
    assert tok.tolist() == [7]  # 5 6 -> 7, then the separator ends the draft
    tokens, sa = shard([5, 6, 7])
    assert native_lookup([(tokens, sa)], [6], 1, 1, 10, 10, 10)[3][0].tolist() == [7]


def test_even_spread_sampling_when_occurrences_exceed_the_cap():
    # "20 x" for x = 0..9: the SA range of "20" is sorted by x; with 4 samples of
    # 10 the entries taken are lo + (i * 10) // 4 = +0, +2, +5, +7
    tokens, sa = shard([v for x in range(10) for v in (20, x)])
    trie = N.ContinuationTrie(16)
    length, lo, hi = N.match(tokens, sa, arr([20]), 1, 1)
    assert (length, hi - lo) == (1, 10)
    assert trie.add(tokens, sa, lo, hi, length, 4, 1) == 4
    tok, par, cnt = trie.top(10)
    assert tok.tolist() == [0, 2, 5, 7] and cnt.tolist() == [1, 1, 1, 1]


def test_ranking_count_then_depth_then_token_path():
    # occurrences of 1: continuations (depth 2) [5, 1], [3, 1], [4, 1], [3]
    tokens, sa = shard([1, 5, 1, 3, 1, 4, 1, 3])
    _, _, sampled, (tok, par, cnt) = native_lookup([(tokens, sa)], [1], 1, 1, 10, 2, 10)
    assert sampled == 4
    assert tok.tolist() == [3, 4, 5, 1, 1, 1]        # 3 (count 2), then ties by depth, then path
    assert par.tolist() == [-1, -1, -1, 0, 1, 2]     # (3,1) < (4,1) < (5,1)
    assert cnt.tolist() == [2, 1, 1, 1, 1, 1]


def test_budget_smaller_than_the_trie_keeps_the_best_prefix():
    tokens, sa = shard([1, 5, 1, 3, 1, 4, 1, 3])
    _, _, _, (tok, par, cnt) = native_lookup([(tokens, sa)], [1], 1, 1, 10, 2, 2)
    assert tok.tolist() == [3, 4] and par.tolist() == [-1, -1] and cnt.tolist() == [2, 1]
    assert native_lookup([(tokens, sa)], [1], 1, 1, 10, 2, 0)[3][0].size == 0


def test_two_shards_accumulate_into_one_trie():
    a, b = shard([1, 2, 7]), shard([1, 2, 3, 1, 2, 3], wide=True)
    trie = N.ContinuationTrie(32)
    for tokens, sa in (a, b):
        length, lo, hi = N.match(tokens, sa, arr([1, 2]), 2, 1)
        trie.add(tokens, sa, lo, hi, length, 10, 1)
    tok, par, cnt = trie.top(10)
    assert tok.tolist() == [3, 7] and cnt.tolist() == [2, 1]  # 3 twice (shard b), 7 once


def test_ties_across_shards_rank_by_token_path_not_insertion_order():
    a, b = shard([1, 2, 7, 5]), shard([1, 2, 3, 4])
    trie = N.ContinuationTrie(32)
    for tokens, sa in (a, b):  # shard a's nodes are created first
        length, lo, hi = N.match(tokens, sa, arr([1, 2]), 2, 1)
        trie.add(tokens, sa, lo, hi, length, 10, 2)
    tok, par, cnt = trie.top(10)
    assert tok.tolist() == [3, 7, 4, 5]  # all count 1: depth 1 first, then (3,4) < (7,5)
    assert par.tolist() == [-1, -1, 0, 1]
    assert trie.top(10)[0].tolist() == [3, 7, 4, 5]  # top() is repeatable


def test_split_occurrences_is_proportional_and_exact():
    assert split_occurrences([6, 3, 1], 5) == [3, 2, 0]
    assert split_occurrences([1, 1, 1], 2) == [1, 1, 0]
    assert split_occurrences([2, 3], 10) == [2, 3]
    rng = np.random.default_rng(3)
    for _ in range(200):
        counts = rng.integers(1, 50, size=int(rng.integers(1, 6))).tolist()
        cap = int(rng.integers(1, 120))
        q = split_occurrences(counts, cap)
        assert sum(q) == min(cap, sum(counts)) and all(0 <= x <= c for x, c in zip(q, counts))


def test_capacity_overflow_is_refused_without_partial_insertion():
    tokens, sa = shard([1, 2, 3, 1, 2, 4])
    trie = N.ContinuationTrie(3)
    with pytest.raises(ValueError, match="capacity"):
        trie.add(tokens, sa, 0, 2, 2, 10, 2)  # 2 occurrences x depth 2 > 3 nodes
    assert trie.size == 0


def test_bad_arguments_are_rejected():
    tokens, sa = shard([1, 2, 3])
    with pytest.raises(ValueError, match="min_n"):
        N.match(tokens, sa, arr([1]), 2, 0)
    with pytest.raises(ValueError, match="max_n"):
        N.match(tokens, sa, arr([1]), 1, 2)
    with pytest.raises(ValueError, match=r"context\[0\] = -3"):
        N.match(tokens, sa, arr([-3, 1]), 2, 1)
    with pytest.raises(ValueError, match="entries"):
        N.match(tokens, sa[:2], arr([1]), 2, 1)
    with pytest.raises(TypeError, match="int32"):
        N.match(tokens, sa, np.array([1], dtype=np.int64), 2, 1)
    trie = N.ContinuationTrie(8)
    with pytest.raises(ValueError, match="lo"):
        trie.add(tokens, sa, 2, 5, 1, 1, 1)
    with pytest.raises(ValueError, match="capacity"):
        N.ContinuationTrie(0)
