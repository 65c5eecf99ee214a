"""Tree attention, acceptance rules and KV-row commits, against slow references."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from lookupdec.kvcache import keep_rows, new_cache, with_cache
from lookupdec.tree import DraftTree
from lookupdec.verify import (
    LazyLogits,
    TreeVerifier,
    clip_depth,
    greedy_accept,
    longest_path,
    main_path,
    sample_accept,
    subtree,
    tree_attention_bias,
)
from tests.conftest import TINY_VOCAB, batch_of, tiny_model
from tests.oracles.tree_mask import reference_tree_attention_bias


def _random_tree(rng, n):
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    return DraftTree(rng.integers(3, TINY_VOCAB, n), parents, np.ones(n, np.int64))


def test_bias_equals_reference():
    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 17):
        tree = _random_tree(rng, n)
        for past in (0, 3):
            width = 1 + n + int(rng.integers(0, 4))
            bias = tree_attention_bias(tree, past, width, torch.float32, "cpu")[0, 0]
            assert ((bias == 0).numpy() == reference_tree_attention_bias(tree, past, width)).all()
            assert (bias[bias != 0] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_every_node_sees_exactly_its_chain(attn):
    """Each node's logits equal its root-to-node chain run causally on the same past."""
    model = tiny_model(1, attn=attn)
    rng = np.random.default_rng(1)
    verifier = TreeVerifier(model, tree_masks=True)
    prompt = rng.integers(3, TINY_VOCAB, 11).tolist()
    root = int(rng.integers(3, TINY_VOCAB))
    for n in (1, 6, 13):
        tree = _random_tree(rng, n)
        cache = new_cache(model.config, 64)
        verifier.prefill(cache, prompt)
        res = verifier.forward(cache, len(prompt), root, tree)
        assert res.logits.shape == (1 + n, TINY_VOCAB)
        with torch.no_grad():
            ref_root = model(batch_of(model, prompt + [root])).logits[0, -1]
            torch.testing.assert_close(res.logits[0], ref_root, atol=1e-5, rtol=1e-5)
            for i in range(n):
                chain = prompt + [root] + tree.path_tokens(i)
                ref = model(batch_of(model, chain)).logits[0, -1]
                torch.testing.assert_close(res.logits[1 + i], ref, atol=1e-5, rtol=1e-5)


def test_commit_keeps_the_accepted_rows_in_place():
    """After a commit the cache equals the cache of the accepted chain run causally."""
    model = tiny_model(2)
    verifier = TreeVerifier(model, tree_masks=True)
    prompt = [5, 6, 7, 8, 9]
    tree = DraftTree.from_sequences([[10, 11, 12], [10, 13], [14, 15, 16, 17]])  # nodes: 10 11 12 13 14 15 16 17
    for nodes in [(), (0,), (0, 3), (4, 5, 6, 7), (0, 1, 2)]:
        for cache in (new_cache(model.config, 8), DynamicCache()):  # buffered (grows past 8) and transformers' own
            verifier.prefill(cache, prompt)
            verifier.forward(cache, len(prompt), 4, tree)
            verifier.commit(cache, len(prompt), nodes)
            chain = prompt + [4] + [int(tree.tokens[i]) for i in nodes]
            assert cache.get_seq_length() == len(chain)
            ref = DynamicCache()
            with torch.no_grad():
                model(batch_of(model, chain), **with_cache(model, ref), use_cache=True)
            for got, want in zip(cache.layers, ref.layers):
                torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)


def test_keep_rows_moves_only_listed_rows():
    cache = new_cache_with_rows(10)
    keep_rows(cache, 4, [4, 7, 9])
    k = cache.layers[0].keys[0, 0, :, 0].tolist()
    assert k == [0, 1, 2, 3, 4, 7, 9]
    keep_rows(cache, 5, [5])  # nothing moves, only the tail is cropped
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 7]


def new_cache_with_rows(n):
    from lookupdec.kvcache import BufferedCache, BufferedLayer

    cache = BufferedCache([BufferedLayer(4)])  # capacity 4 < n: exercises growth
    rows = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    cache.layers[0].update(rows[:, :, :3], rows[:, :, :3])
    cache.layers[0].update(rows[:, :, 3:], rows[:, :, 3:])
    return cache


def test_greedy_accept_rules():
    tree = DraftTree.from_sequences([[5, 6, 7], [5, 8], [9]])  # nodes: 0:5 1:6 2:7 3:8 4:9
    # argmax rows: root, then nodes 0..4
    assert greedy_accept(tree, [1, 0, 0, 0, 0, 0]).tokens == (1,)                       # no child matches: bonus only
    acc = greedy_accept(tree, [5, 8, 0, 0, 4, 0])
    assert acc.nodes == (0, 3) and acc.tokens == (5, 8, 4)                                # second branch, bonus 4
    acc = greedy_accept(tree, [5, 6, 7, 2, 0, 0])
    assert acc.nodes == (0, 1, 2) and acc.tokens == (5, 6, 7, 2)                          # whole path + bonus
    assert greedy_accept(DraftTree.empty(), [3]).tokens == (3,)


def test_longest_path_and_clip_depth():
    tree = DraftTree.from_sequences([[5, 6], [7, 8, 9], [7, 1]])
    assert longest_path(tree).tokens.tolist() == [7, 8, 9]
    assert longest_path(tree).parents.tolist() == [-1, 0, 1]
    assert clip_depth(tree, 1).tokens.tolist() == [5, 7]
    clipped = clip_depth(tree, 2)
    assert sorted(map(tuple, (clipped.path_tokens(int(i)) for i in clipped.leaves()))) == [(5, 6), (7, 1), (7, 8)]
    assert len(clip_depth(tree, 0)) == 0 and clip_depth(tree, 5) is tree


def test_padding_rows_do_not_change_logits():
    """Widths are padded to a multiple of 4; padding must not leak into real rows."""
    model = tiny_model(3)
    prompt = [5, 6, 7]
    tree = DraftTree.chain([8, 9])  # width 3 -> padded to 4
    outs = []
    for pad in (1, 4, 8):
        v = TreeVerifier(model, tree_masks=True, pad_multiple=pad)
        cache = new_cache(model.config, 16)
        v.prefill(cache, prompt)
        outs.append(v.forward(cache, 3, 4, tree).logits)
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


def _slow_main_path(tree):
    path, node = [], -1
    while True:
        kids = [i for i in range(len(tree)) if int(tree.parents[i]) == node]
        if not kids:
            return path
        best = max(float(tree.scores[i]) for i in kids)
        node = next(i for i in kids if float(tree.scores[i]) == best)
        path.append(node)


def test_main_path_and_subtree_equal_slow_references():
    rng = np.random.default_rng(11)
    for n in (0, 1, 5, 17, 40):
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        # Scores from a few values, so sibling ties (first one wins) occur.
        tree = DraftTree(rng.integers(3, TINY_VOCAB, n), parents, rng.integers(1, 4, n) / 4)
        assert main_path(tree) == _slow_main_path(tree)
        for u in range(n):
            assert subtree(tree, u) == [i for i in range(n) if u in tree.path(i)]


def _walkable_case(rng, n):
    """A random tree and logits whose argmax often follows a child, so greedy walks go deep."""
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    tree = DraftTree(rng.integers(3, TINY_VOCAB, n), parents, rng.integers(1, 4, n))
    logits = torch.randn(1 + n, TINY_VOCAB, dtype=torch.float64).float()
    for r in range(1 + n):
        kids = [i for i in range(n) if int(parents[i]) == r - 1]
        if kids and rng.random() < 0.8:
            logits[r, int(tree.tokens[kids[int(rng.integers(len(kids)))]])] += 10.0
    return tree, logits


def _lazy(tree, logits, calls):
    def compute(idx):
        calls.append(idx.tolist())
        return logits[idx]
    return LazyLogits(1 + len(tree), tree, compute)


def test_lazy_rows_give_the_same_greedy_acceptance_as_full_logits():
    rng = np.random.default_rng(5)
    deep = 0
    for trial in range(200):
        tree, logits = _walkable_case(rng, int(rng.integers(1, 25)))
        want = greedy_accept(tree, logits.argmax(-1).tolist())
        calls = []
        lz = _lazy(tree, logits, calls)
        lz.prefetch([0] + [1 + i for i in main_path(tree)])
        got = greedy_accept(tree, lambda r: int(lz.row(r).argmax()))
        assert got == want
        # Every visited row was computed, each row at most once, and rows equal the full product.
        rows = [r for c in calls for r in c]
        assert len(rows) == len(set(rows)) == lz.computed
        assert {0} | {1 + i for i in got.nodes} <= set(rows)
        torch.testing.assert_close(lz.full(), logits)
        deep += got.accepted >= 2
    assert deep > 20  # the walks did leave the root


def test_lazy_rows_give_the_same_sampling_acceptance_as_full_logits():
    rng = np.random.default_rng(6)
    for trial in range(100):
        tree, logits = _walkable_case(rng, int(rng.integers(1, 20)))
        probs = torch.softmax(logits, -1)
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        want = sample_accept(tree, lambda r: probs[r], g1)
        lz = _lazy(tree, logits, [])
        got = sample_accept(tree, lambda r: torch.softmax(lz.row(r), -1), g2)
        assert got == want


def test_lazy_logits_of_a_full_tensor_and_bad_rows():
    lz = LazyLogits.of(torch.arange(6.0).view(3, 2))
    assert lz.computed == 3 and lz.row(2).tolist() == [4.0, 5.0]
    with pytest.raises(IndexError):
        _lazy(DraftTree.chain([4]), torch.zeros(2, 3), []).prefetch([2])
