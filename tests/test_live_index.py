"""The native LiveIndex agrees with the slow oracles (tests/oracles/live.py), step by step, and pins the edge cases."""
import subprocess
import sys

import numpy as np
import pytest

from lookupdec.drafters.calibrate import conditional
from lookupdec.drafters.pld import lookup_tree
from lookupdec.index.live import LiveIndex, LiveMatch
from lookupdec.tree import DraftTree
from tests.oracles.live import PyLiveIndex, continuation_reference, match_reference


@pytest.mark.parametrize("seed", range(12))
def test_incremental_matches_reference_on_random_sequences(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(1, 5))  # small vocabularies force many, overlapping matches
    min_n = int(rng.integers(1, 4))
    max_n = min_n + int(rng.integers(0, 6))
    k = int(rng.integers(1, 6))
    seq = rng.integers(0, vocab, size=int(rng.integers(0, 120))).tolist()
    idx = LiveIndex(max_n=max_n, min_n=min_n)
    py = PyLiveIndex(max_n=max_n, min_n=min_n)
    pos = 0
    while pos < len(seq):  # append in chunks of varying size, as commits do
        step = int(rng.integers(1, 5))
        idx.extend(seq[pos:pos + step])
        py.extend(seq[pos:pos + step])
        pos = min(pos + step, len(seq))
        assert idx.match(k) == match_reference(seq[:pos], max_n, min_n, k), (seed, pos)
        m = idx.match(k)
        assert m == py.match(k)
        for s in m.starts:
            for depth in (1, 4, 9):
                assert idx.continuation(s, depth) == continuation_reference(seq[:pos], s, depth)


def draft_reference(py: PyLiveIndex, k: int, depth: int, width: int, **bounds):
    """What LiveIndex.draft computes, from the oracle: the continuations merged into a trie, then pruned."""
    m = py.match(k, **bounds)
    if not m.starts:
        return 0, [], [], []
    t = DraftTree.from_sequences([py.continuation(s, depth) for s in m.starts]).prune(width)
    return m.length, t.tokens.tolist(), t.parents.tolist(), np.rint(t.scores * len(m.starts)).astype(int).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_draft_trie_equals_merging_and_pruning_the_oracles_continuations(seed):
    rng = np.random.default_rng(100 + seed)
    vocab = int(rng.integers(1, 6))
    min_n = int(rng.integers(1, 3))
    max_n = min_n + int(rng.integers(0, 6))
    seq = rng.integers(0, vocab, size=int(rng.integers(2, 300))).tolist()
    if seed % 5 == 0:
        seq = (seq[:7] * 60)[:len(seq)]  # periodic: continuations run into the suffix
    idx, py = LiveIndex(max_n, min_n), PyLiveIndex(max_n, min_n)
    idx.extend(seq)
    py.extend(seq)
    for k, depth, width in [(1, 1, 1), (8, 4, 12), (3, 12, 5), (16, 16, 64), (8, 1, 3)]:
        d = idx.draft(k, depth, width)
        got = (d.length, d.tokens.tolist(), d.parents.tolist(), d.counts.tolist())
        assert got == draft_reference(py, k, depth, width), (seed, k, depth, width)
        # The shares and conditionals filled natively are the same doubles as numpy's division and
        # calibrate.conditional (PLD scores with them).
        if d.length:
            assert d.shares.tolist() == (d.counts.astype(np.float64) / d.occurrences).tolist()
            want = conditional(DraftTree(d.tokens, d.parents, d.shares)).tolist()
            assert d.conditionals.tolist() == want, (seed, k, depth, width)
        # PLD wraps the native trie without the constructor's checks: it must pass them.
        ctx = lookup_tree(idx, depth, width, k)
        tree = ctx.tree
        assert tree.check() == "" and (tree.tokens.dtype, tree.parents.dtype, tree.scores.dtype) == \
            (np.int64, np.int32, np.float64)
        assert ctx.conditional.tolist() == conditional(tree).tolist()
        if max_n > min_n:  # a narrower query (the PLD fallback's)
            lo = hi = min_n
            d = idx.draft(k, depth, width, max_n=hi, min_n=lo)
            got = (d.length, d.tokens.tolist(), d.parents.tolist(), d.counts.tolist())
            assert got == draft_reference(py, k, depth, width, max_n=hi, min_n=lo)


def test_long_sequences_and_adversarial_ones_match_the_oracle():
    rng = np.random.default_rng(7)
    natural = rng.zipf(1.3, 5000) % 3000
    for seq in (natural.tolist(), [4] * 3000, ([1, 2, 3] * 1000), rng.integers(0, 2, 3000).tolist()):
        idx, py = LiveIndex(8, 1), PyLiveIndex(8, 1)
        idx.extend(seq[:-50])
        py.extend(seq[:-50])
        for t in seq[-50:]:  # one token at a time, as decoding appends
            idx.append(t)
            py.append(t)
            assert idx.match(8) == py.match(8)
            assert idx.match(8, max_n=3, min_n=2) == py.match(8, max_n=3, min_n=2)


def test_memory_is_at_most_16_bytes_per_token():
    idx = LiveIndex(8, 1)
    idx.extend(np.random.default_rng(0).integers(0, 49152, 32000))
    assert idx.nbytes <= 16 * 32000


def test_token_ids_out_of_range_are_refused():
    idx = LiveIndex(4, 1)
    for bad in ([-1], [2**31], [1, -5], (3, 2**31 + 7), [2**100], [4, -2**100]):
        with pytest.raises(ValueError, match="outside|integer ids"):
            idx.extend(bad)
    for bad in ([1.0], [True], [2, "3"], [[1, 2]]):  # not plain ints: the checked numpy route's error
        with pytest.raises(ValueError, match="integer ids"):
            idx.extend(bad)
    assert len(idx) == 0


@pytest.mark.parametrize("seed", range(4))
def test_plain_int_lists_index_as_arrays_do(seed):
    # Lists and tuples of ints take a native path (no numpy); arrays, numpy ints and generators
    # the checked numpy one. Both must index the same sequence, in chunks of any size (a chunk
    # over the native path's 64-token buffer included).
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 6, size=400).tolist()
    fast, slow = LiveIndex(6, 1), LiveIndex(6, 1)
    pos = 0
    while pos < len(seq):
        step = int(rng.choice([1, 2, 5, 70, 150]))
        chunk = seq[pos:pos + step]
        fast.extend(chunk if step % 2 else tuple(chunk))
        slow.extend(np.array(chunk, np.int64) if step % 2 else (np.int64(t) for t in chunk))
        pos += step
        assert fast.match(4) == slow.match(4)
    assert fast.tokens.tolist() == slow.tokens.tolist() == seq


def test_narrower_query_bounds_match_reference():
    rng = np.random.default_rng(5)
    seq = rng.integers(0, 3, size=200).tolist()
    idx = LiveIndex(max_n=8, min_n=1)
    idx.extend(seq)
    for lo, hi in [(1, 1), (2, 5), (3, 8), (8, 8)]:
        assert idx.match(4, max_n=hi, min_n=lo) == match_reference(seq, hi, lo, 4)


def test_empty_and_too_short():
    idx = LiveIndex(max_n=4, min_n=2)
    # Nothing indexed: no match.
    assert idx.match() == LiveMatch.none()
    idx.extend([5, 5])
    # [5, 5] is the suffix itself; no earlier occurrence has a known continuation.
    assert idx.match() == LiveMatch.none()
    idx.append(5)
    # [5, 5] now also ends at position 1 and continued with token 5 at position 2.
    assert idx.match() == LiveMatch(2, (2,), 1)


def test_all_equal_tokens_overlap_the_suffix():
    idx = LiveIndex(max_n=3, min_n=1)
    idx.extend([9] * 6)
    m = idx.match(max_occurrences=2)
    # Longest length wins (3), most recent occurrences first; there are 3 of them (starts 3, 4, 5).
    assert m == LiveMatch(3, (5, 4), 3)
    # The most recent occurrence runs into the suffix: it repeats with period 1.
    assert idx.continuation(5, 4) == [9, 9, 9, 9]


def test_longest_not_first_match():
    idx = LiveIndex(max_n=4, min_n=1)
    idx.extend([1, 2, 3, 7, 2, 3, 8, 1, 2, 3])
    m = idx.match(max_occurrences=5)
    # [1, 2, 3] occurs at 0..2 (continues with 7); the shorter [2, 3] also at 4..5 (continues with 8).
    assert (m.length, m.starts) == (3, (3,))
    assert idx.continuation(3, 2) == [7, 2]


def test_periodic_continuation():
    idx = LiveIndex(max_n=4, min_n=1)
    idx.extend([4, 1, 2, 1, 2])
    # [1, 2] occurred at 1..2 and continued from position 3; [2, 1, 2] never occurred before.
    assert idx.match() == LiveMatch(2, (3,), 1)
    # Only [1, 2] is known after position 3; the rest repeats with period 5 - 3 = 2.
    assert idx.continuation(3, 5) == [1, 2, 1, 2, 1]
    # Without the periodic extension the continuation stops at the end of the sequence.
    assert idx.continuation(3, 5, periodic=False) == [1, 2]


def test_huge_token_ids():
    big = 2**31 - 1
    idx = LiveIndex(max_n=2, min_n=1)
    idx.extend([big, 0, big])
    assert idx.match() == LiveMatch(1, (1,), 1)
    assert idx.tokens.dtype == np.int64 and idx.tokens.tolist() == [big, 0, big]


def test_bad_arguments():
    with pytest.raises(ValueError, match="min_n"):
        LiveIndex(max_n=4, min_n=0)
    with pytest.raises(ValueError, match="max_n"):
        LiveIndex(max_n=1, min_n=2)
    idx = LiveIndex(max_n=4, min_n=2)
    idx.extend([1, 2, 1, 2])
    with pytest.raises(ValueError, match="inside"):
        idx.match(max_n=5)
    with pytest.raises(ValueError, match="start"):
        idx.continuation(4, 2)


def test_reset_forgets():
    idx = LiveIndex(max_n=3, min_n=1)
    idx.extend([1, 2, 1])
    idx.reset([3, 4])
    assert len(idx) == 2 and idx.match() == LiveMatch.none()


def test_index_does_not_import_torch():
    code = "import sys, lookupdec.index.live; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
