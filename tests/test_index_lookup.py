"""SuffixIndex.lookup (one native call over all shards) equals the lookup composed
in Python from the per-shard kernels (tests/oracles/suffix_lookup.py): the same
match, counts, tree and scores, bit for bit."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from lookupdec import _native as N
from lookupdec.index import build_index_from_tokens, open_index
from lookupdec.index.manifest import ArrayFile, Manifest, ShardEntry, TokenizerRecord
from lookupdec.index.suffix import SuffixIndex, _Shard
from tests.oracles.index import lookup_shards_reference
from tests.oracles.suffix_lookup import composed_lookup


def index_of(shards, vocab: int = 0) -> SuffixIndex:
    """A SuffixIndex over (tokens, sa) pairs as given (any content, damaged included)."""
    entries = tuple(
        ShardEntry(ArrayFile("<memory>", "int32", int(t.size), int(t.nbytes), ""),
                   ArrayFile("<memory>", str(sa.dtype), int(sa.size), int(sa.nbytes), ""),
                   int(np.count_nonzero(t == -1)), int(np.count_nonzero(t >= 0)))
        for t, sa in shards)
    record = TokenizerRecord("test", "0" * 64, vocab) if vocab else None
    manifest = Manifest(tokenizer=record, documents=sum(e.documents for e in entries),
                        tokens=sum(e.n_tokens for e in entries), skipped=0, shards=entries)
    return SuffixIndex(Path("<memory>"), manifest, [_Shard(t, sa) for t, sa in shards])


def make_shard(rng, vocab, phrases, offset=0, wide=False):
    """Short documents (so continuations run into separators) built from shared phrases."""
    parts = []
    for _ in range(int(rng.integers(1, 12))):
        doc = [p for _ in range(int(rng.integers(1, 5)))
               for p in (phrases[int(rng.integers(0, len(phrases)))] if rng.random() < 0.7
                         else rng.integers(0, vocab, int(rng.integers(1, 3))).tolist())]
        parts += [t + offset for t in doc] + [-1]
    tokens = np.asarray(parts, dtype=np.int32)
    return tokens, (N._suffix_array64(tokens) if wide else N.suffix_array(tokens))


def random_shards(rng):
    vocab = int(rng.choice([2, 3, 5, 8]))
    phrases = [rng.integers(0, vocab, int(rng.integers(2, 6))).tolist() for _ in range(5)]
    shards = []
    for _ in range(int(rng.integers(1, 7))):
        r = rng.random()
        if shards and r < 0.2:  # an identical copy: ties across shards
            shards.append(shards[int(rng.integers(0, len(shards)))])
        elif r < 0.35:  # ids no context uses: a shard with no match
            shards.append(make_shard(rng, vocab, phrases, offset=1000, wide=rng.random() < 0.3))
        else:
            shards.append(make_shard(rng, vocab, phrases, wide=rng.random() < 0.3))
    return shards, vocab


def random_context(rng, shards, vocab):
    tokens = shards[int(rng.integers(0, len(shards)))][0]
    start = int(rng.integers(0, tokens.size))
    piece = [t for t in tokens[start:start + int(rng.integers(1, 10))].tolist() if t >= 0]
    noise = rng.integers(0, vocab, int(rng.integers(0, 3))).tolist()
    return noise + piece if rng.random() < 0.8 else rng.integers(0, vocab, int(rng.integers(0, 9))).tolist()


def random_params(rng):
    max_n = int(rng.integers(1, 9))
    return dict(max_n=max_n, min_n=int(rng.integers(1, max_n + 1)),
                max_occurrences=int(rng.choice([1, 2, 3, 5, 8, 13, 50, 5000])),
                depth=int(rng.integers(1, 9)), budget=int(rng.choice([0, 1, 2, 3, 7, 64])))


def assert_identical(got, want):
    assert (got.match_len, got.occurrences, got.sampled) == (want.match_len, want.occurrences, want.sampled)
    for name in ("tokens", "parents", "scores", "sources"):
        a, b = getattr(got.tree, name), getattr(want.tree, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert got.counts.dtype == want.counts.dtype and np.array_equal(got.counts, want.counts)


def check_many(index, shards, rng, cases, vocab, token_limit=2**31):
    matched = 0
    for _ in range(cases):
        ctx, kw = random_context(rng, shards, vocab), random_params(rng)
        got = index.lookup(ctx, **kw)
        assert_identical(got, composed_lookup(shards, ctx, token_limit=token_limit, **kw))
        assert got.tree.check() == ""
        matched += got.match_len > 0
    return matched


# ------------------------------------------------------------------ equivalence
def test_native_lookup_equals_the_python_composition_on_random_shards():
    rng = np.random.default_rng(0)
    matched = 0
    for _ in range(150):
        shards, vocab = random_shards(rng)
        matched += check_many(index_of(shards), shards, rng, 8, vocab)
    assert matched > 400  # many contexts found something


def test_native_lookup_equals_the_reference_rules():
    # the plain rules (tests/oracles/index.py), not only the earlier composition
    rng = np.random.default_rng(1)
    for _ in range(60):
        shards, vocab = random_shards(rng)
        index = index_of(shards)
        for _ in range(5):
            ctx, kw = random_context(rng, shards, vocab), random_params(rng)
            got = index.lookup(ctx, **kw)
            if len(ctx) < kw["min_n"]:
                assert got.match_len == 0
                continue
            ref = lookup_shards_reference(shards, ctx[-kw["max_n"]:], kw["max_n"], kw["min_n"],
                                          kw["max_occurrences"], kw["depth"], kw["budget"])
            assert (got.match_len, got.occurrences, got.sampled) == (ref.match_len, ref.occurrences, ref.sampled)
            assert got.tree.tokens.tolist() == ref.tokens.tolist()
            assert got.tree.parents.tolist() == ref.parents.tolist()
            assert got.counts.tolist() == ref.counts.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_native_lookup_equals_the_composition_on_built_indexes(tmp_path, seed):
    rng = np.random.default_rng(10 + seed)
    vocab = 6
    phrases = [rng.integers(0, vocab, int(rng.integers(2, 6))).tolist() for _ in range(6)]
    docs = [make_shard(rng, vocab, phrases)[0] for _ in range(30)]
    docs = [d[d >= 0] for d in docs]
    build_index_from_tokens(docs, tmp_path / "i", shard_tokens=int(rng.choice([40, 90, 400])))
    index = open_index(tmp_path / "i")
    shards = [(s.tokens, s.sa) for s in index._shards]
    assert check_many(index, shards, rng, 200, vocab) > 100


def test_damaged_shards_give_the_same_harmless_result(tmp_path):
    # Suffix-array values outside [0, n), negative tokens and ids past the vocabulary:
    # the native lookup reads nothing outside its arrays and agrees with the composition.
    rng = np.random.default_rng(2)
    for _ in range(80):
        shards, vocab = random_shards(rng)
        damaged = []
        for tokens, sa in shards:
            tokens, sa = tokens.copy(), sa.copy()
            kind = int(rng.integers(0, 4))
            m = rng.random(sa.size) < 0.2
            if kind == 0:
                sa[m] = rng.integers(-2**31, 2**31 - 1, int(m.sum())).astype(sa.dtype)
            elif kind == 1:
                tokens[m] = rng.integers(-2**31, -1, int(m.sum()))
            elif kind == 2:
                tokens[m] = vocab + rng.integers(0, 3, int(m.sum()))  # past the vocabulary
            damaged.append((tokens, sa))
        index = index_of(damaged, vocab=vocab)
        check_many(index, damaged, rng, 6, vocab, token_limit=vocab)
        for _ in range(3):
            r = index.lookup(random_context(rng, damaged, vocab), max_n=6, min_n=1, depth=6)
            assert r.tree.check() == "" and (len(r.tree) == 0 or int(r.tree.tokens.max()) < vocab)


# ------------------------------------------------------------------ rules pinned by hand
def shard(values):
    t = np.asarray(values, dtype=np.int32)
    return t, N.suffix_array(t)


def test_ties_in_the_split_go_to_the_lower_shard():
    # "1 2" once in each of four shards, followed by 10 + s: with 2 samples the
    # remainders tie, so shards 0 and 1 are read.
    shards = [shard([1, 2, 10 + s, -1]) for s in range(4)]
    index = index_of(shards)
    r = index.lookup([1, 2], max_n=2, min_n=1, max_occurrences=2, depth=1)
    assert (r.match_len, r.occurrences, r.sampled) == (2, 4, 2)
    assert r.tree.tokens.tolist() == [10, 11] and r.counts.tolist() == [1, 1]
    assert r.tree.scores.tolist() == [0.5, 0.5]


def test_only_shards_with_the_longest_match_take_part():
    shards = [shard([2, 3, 7, -1]), shard([5, 1, 2, 9, -1]), shard([8, -1]), shard([1, 2, 4, -1])]
    r = index_of(shards).lookup([1, 2], max_n=2, min_n=1, depth=1)
    assert (r.match_len, r.occurrences) == (2, 2)  # shards 1 and 3; shard 0 holds only "2"
    assert r.tree.tokens.tolist() == [4, 9]


def test_split_is_proportional_with_largest_remainders():
    # counts 6, 3, 1 and 5 samples: quotas 3, 2, 0 (oracle example)
    shards = [shard([1, 20 + s, -1] * c) for s, c in enumerate((6, 3, 1))]
    r = index_of(shards).lookup([1], max_n=1, min_n=1, max_occurrences=5, depth=1)
    assert r.occurrences == 10 and r.sampled == 5
    assert r.tree.tokens.tolist() == [20, 21] and r.counts.tolist() == [3, 2]


def test_native_split_equals_the_oracle_rule():
    from tests.oracles.index import split_occurrences

    rng = np.random.default_rng(3)
    for _ in range(2000):
        counts = rng.integers(0, int(rng.choice([2, 10, 1000])), size=int(rng.integers(0, 9))).tolist()
        cap = int(rng.integers(0, 2 * sum(counts) + 2))
        assert N._split_occurrences(np.array(counts, np.int64), cap).tolist() == split_occurrences(counts, cap)
    big = [2**61, 2**61 + 7, 3, 2**60]  # products past 2^63
    for cap in (1, 7, 2**30 - 1):
        assert N._split_occurrences(np.array(big, np.int64), cap).tolist() == split_occurrences(big, cap)


def test_results_are_fresh_arrays_and_the_index_is_reusable():
    index = index_of([shard([1, 2, 3, -1, 1, 2, 4, -1])])
    a = index.lookup([1, 2], max_n=2, min_n=1)
    a.tree.tokens[:] = 99  # a caller's edit never reaches the next lookup
    b = index.lookup([1, 2], max_n=2, min_n=1)
    assert b.tree.tokens.tolist() == [3, 4]
    assert index.lookup([7, 7], max_n=2, min_n=1).match_len == 0


def test_threads_share_one_index():
    rng = np.random.default_rng(4)
    shards, vocab = random_shards(rng)
    shards = [make_shard(rng, vocab, [[0, 1], [1, 0, 1]]) for _ in range(3)] + shards
    index = index_of(shards)
    cases = [(random_context(rng, shards, vocab), random_params(rng)) for _ in range(300)]
    want = [index.lookup(c, **kw) for c, kw in cases]
    errors = []

    def work(order):
        try:
            for i in order:
                assert_identical(index.lookup(cases[i][0], **cases[i][1]), want[i])
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(np.random.default_rng(s).permutation(len(cases)),))
               for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_native_shards_argument_errors():
    t, sa = shard([1, 2, 3, -1])
    s = N.Shards([(t, sa)])
    assert s.n_shards == 1 and s.token_limit == 2**31
    ctx = np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match="min_n"):
        s.lookup(ctx, 2, 0, 10, 2, 4)
    with pytest.raises(ValueError, match="max_n"):
        s.lookup(ctx, 1, 2, 10, 2, 4)
    with pytest.raises(ValueError, match="depth"):
        s.lookup(ctx, 2, 1, 10, 0, 4)
    with pytest.raises(ValueError, match="trie nodes"):
        s.lookup(ctx, 2, 1, 2**20, 2**11, 4)
    with pytest.raises(TypeError, match="int32"):
        s.lookup(np.array([1, 2], np.int64), 2, 1, 10, 2, 4)
    with pytest.raises(ValueError, match=r"context\[0\] = -3"):
        s.lookup(np.array([-3, 1], np.int32), 2, 1, 10, 2, 4)
    with pytest.raises(ValueError, match="entries"):
        N.Shards([(t, sa[:2])])
    assert N.Shards([]).lookup(ctx, 2, 1, 10, 2, 4)[0] == 0  # no shard: no match
