"""The interleaved multi-shard search inside ``_native.Shards.lookup``
(ext/csrc/multisearch.h) against the oracles: the slow rules of
tests/oracles/index.py on valid shards, and the per-shard kernels composed in
Python (tests/oracles/suffix_lookup.py) on damaged ones, where only "the same
probes as lk_match" can give the same answer. The shapes here are the ones
the interleaving must get right: many shards, empty shards, shards with no
match, searches that end at different rounds, wide and narrow suffix arrays
side by side, token ids near 2^31; with and without the in-memory copy of the
top bisection levels (``top_levels``), which must change no result."""
import numpy as np
import pytest

from lookupdec import _native as N
from tests.oracles.index import lookup_shards_reference
from tests.oracles.suffix_lookup import composed_lookup

BIG = 2**31 - 2  # the largest token id a shard can hold (2^31 - 1 is reserved as an end bound)


def shard_of(tokens, wide=False):
    tokens = np.asarray(tokens, dtype=np.int32)
    return tokens, (N._suffix_array64(tokens) if wide else N.suffix_array(tokens))


def random_docs(rng, alphabet, docs):
    out = []
    for _ in range(docs):
        out += rng.choice(alphabet, int(rng.integers(1, 25))).tolist() + [-1]
    return out


def many_shards(rng, alphabet):
    """2-40 shards: ordinary, empty, with no token a context uses, wide, repeated."""
    shards = []
    for _ in range(int(rng.integers(2, 41))):
        r = rng.random()
        if r < 0.1:
            shards.append(shard_of([]))
        elif r < 0.2:
            shards.append(shard_of(random_docs(rng, [7, 8], 3)))  # ids absent from every context
        elif r < 0.3 and shards:
            shards.append(shards[int(rng.integers(0, len(shards)))])
        else:
            shards.append(shard_of(random_docs(rng, alphabet, int(rng.integers(1, 30))), wide=rng.random() < 0.3))
    return shards


def context_from(rng, shards, alphabet):
    nonempty = [t for t, _ in shards if t.size]
    tokens = nonempty[int(rng.integers(0, len(nonempty)))] if nonempty else np.zeros(0, np.int32)
    if tokens.size and rng.random() < 0.7:
        start = int(rng.integers(0, tokens.size))
        piece = [t for t in tokens[start:start + int(rng.integers(1, 14))].tolist() if t >= 0]
        return rng.choice(alphabet, int(rng.integers(0, 3))).tolist() + piece
    return rng.choice(alphabet + [-1], int(rng.integers(0, 12))).tolist()


def native(shards, ctx, max_n, min_n, max_occ, depth, budget, top_levels=N.TOP_LEVELS):
    return N.Shards(shards, top_levels=top_levels).lookup(np.asarray(ctx, dtype=np.int32), max_n, min_n, max_occ, depth, budget)


def assert_equals_rules(shards, ctx, max_n, min_n, max_occ, depth, budget, top_levels=N.TOP_LEVELS):
    n, occ, sampled, tok, par, cnt, _ = native(shards, ctx, max_n, min_n, max_occ, depth, budget, top_levels)
    ref = lookup_shards_reference(shards, ctx, max_n, min_n, max_occ, depth, budget)
    assert (n, occ, sampled) == (ref.match_len, ref.occurrences, ref.sampled)
    assert tok.tolist() == ref.tokens.tolist()
    assert par.tolist() == ref.parents.tolist()
    assert cnt.tolist() == ref.counts.tolist()
    return n


@pytest.mark.parametrize("top_levels", [0, 1, 3, 20])
def test_many_shards_with_empty_and_unmatched_ones_equal_the_rules(top_levels):
    rng = np.random.default_rng(1 + top_levels)
    matched = 0
    for _ in range(25):
        alphabet = list(range(int(rng.integers(2, 5))))
        shards = many_shards(rng, alphabet)
        for _ in range(6):
            max_n = int(rng.integers(1, 12))
            min_n = int(rng.integers(1, max_n + 1))
            matched += assert_equals_rules(shards, context_from(rng, shards, alphabet), max_n, min_n,
                                           int(rng.choice([1, 3, 17, 5000])), int(rng.integers(1, 6)),
                                           int(rng.choice([0, 1, 5, 64])), top_levels) > 0
    assert matched > 40  # the cases exercise real matches, not only empty results


def test_only_some_shards_hold_the_longest_match_and_all_of_them_are_counted():
    # shard 0 holds [1 2 3] once; shards 1 and 3 hold [9 1 2 3] (the longest); shard 2 is empty;
    # shard 4 holds [2 3] only. The longest (4 tokens) comes from shards 1 and 3: 1 + 2 occurrences.
    shards = [shard_of([1, 2, 3, 5, -1]), shard_of([9, 1, 2, 3, 6, -1]), shard_of([]),
              shard_of([9, 1, 2, 3, 7, -1, 9, 1, 2, 3, 7, -1], wide=True), shard_of([2, 3, 8, -1])]
    n, occ, sampled, tok, par, cnt, _ = native(shards, [4, 9, 1, 2, 3], 8, 1, 100, 1, 8)
    assert (n, occ, sampled) == (4, 3, 3)
    assert tok.tolist() == [7, 6] and cnt.tolist() == [2, 1]  # 5 and 8 follow shorter matches only


def test_no_shard_matching_gives_an_empty_result():
    shards = [shard_of([1, 2, -1]), shard_of([]), shard_of([3, 4, -1], wide=True)]
    n, occ, sampled, tok, par, cnt, _ = native(shards, [5, 6], 4, 1, 10, 3, 8)
    assert (n, occ, sampled, tok.size) == (0, 0, 0, 0)


def test_all_shards_empty_and_no_shards_match_nothing():
    for shards in ([shard_of([]), shard_of([])], []):
        n, occ, _, tok, _, _, _ = native(shards, [1, 2], 4, 1, 10, 3, 8)
        assert (n, occ, tok.size) == (0, 0, 0)


def test_huge_token_ids_across_many_shards():
    rng = np.random.default_rng(2)
    alphabet = [BIG, BIG - 1, 0, 2**30]
    for _ in range(20):
        shards = [shard_of(random_docs(rng, alphabet, int(rng.integers(1, 10))), wide=rng.random() < 0.5)
                  for _ in range(int(rng.integers(2, 25)))]
        for _ in range(4):
            assert_equals_rules(shards, context_from(rng, shards, alphabet), 9, 1, 50, 4, 64)


@pytest.mark.parametrize("top_levels", [0, 2, 20])
def test_damaged_shards_give_the_per_shard_kernels_answer(top_levels):
    # Out-of-range, negative and shuffled suffix-array entries: the answer is "wrong" but must be
    # the one each shard's own match() gives, i.e. the interleaving makes the same probes.
    rng = np.random.default_rng(3)
    alphabet = [0, 1, 2]
    for _ in range(40):
        shards = []
        for _ in range(int(rng.integers(2, 12))):
            tokens, sa = shard_of(random_docs(rng, alphabet, int(rng.integers(1, 12))), wide=rng.random() < 0.3)
            sa = sa.copy()
            k = int(rng.integers(0, 4))
            if k == 1:
                sa[rng.integers(0, sa.size, 3)] = rng.integers(-2**30, 2**30, 3)
            elif k == 2:
                rng.shuffle(sa)
            elif k == 3:
                sa[rng.integers(0, sa.size, 2)] = tokens.size + 5
            shards.append((tokens, sa))
        for _ in range(5):
            ctx = context_from(rng, shards, alphabet)
            ctx = [t for t in ctx if t >= 0]
            max_n = int(rng.integers(1, 10))
            min_n = int(rng.integers(1, max_n + 1))
            n, occ, sampled, tok, par, cnt, _ = native(shards, ctx, max_n, min_n, 20, 3, 16, top_levels)
            want = composed_lookup(shards, ctx, max_n=max_n, min_n=min_n, max_occurrences=20, depth=3, budget=16)
            assert (n, occ, sampled) == (want.match_len, want.occurrences, want.sampled)
            assert tok.tolist() == want.tree.tokens.tolist() and cnt.tolist() == want.counts.tolist()


def test_one_large_shard_with_and_without_the_top_copy_agree_with_the_rules():
    # 5,000 entries: 12 cached levels (4,095 nodes) really lie on the search path, and one shard
    # takes the interleaved path only when it has the copy.
    rng = np.random.default_rng(4)
    shards = [shard_of(random_docs(rng, [0, 1, 2, 3, 4, 5], 400))]
    assert shards[0][0].size > 4095
    for _ in range(40):
        ctx = context_from(rng, shards, [0, 1, 2, 3, 4, 5])
        for levels in (0, 12):
            assert_equals_rules(shards, ctx, 12, 1, 50, 3, 16, levels)


def test_top_levels_out_of_range_is_refused():
    with pytest.raises(ValueError, match="top_levels"):
        N.Shards([shard_of([1, 2, -1])], top_levels=21)
