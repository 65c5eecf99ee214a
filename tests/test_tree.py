"""DraftTree: construction, merge, prune, masks, paths, checker."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.tree import DraftTree, merge_trees


def test_from_sequences_scores_each_node_with_its_share_of_the_weight():
    t = DraftTree.from_sequences([[5, 6, 7], [5, 8], [9]], weights=[2, 1, 5], source=3)
    assert t.tokens.tolist() == [5, 6, 7, 8, 9]
    assert t.parents.tolist() == [-1, 0, 1, 0, -1]
    # Weight 8 in all: [5] carries 3 of it, [5, 6] and [5, 6, 7] 2, [5, 8] 1, [9] 5.
    assert t.scores.tolist() == [3 / 8, 2 / 8, 2 / 8, 1 / 8, 5 / 8]
    assert t.sources.tolist() == [3] * 5
    assert t.depth.tolist() == [1, 2, 3, 2, 1]


def test_empty_chain_and_paths():
    assert len(DraftTree.empty()) == 0 and DraftTree.empty().paths() == []
    c = DraftTree.chain([4, 4, 4])
    assert c.parents.tolist() == [-1, 0, 1] and c.paths() == [[0, 1, 2]]
    t = DraftTree.from_sequences([[1, 2], [1, 3], [4]])
    assert t.paths() == [[0, 1], [0, 2], [3]]
    assert t.path_tokens(2) == [1, 3]


def test_attention_mask_is_ancestors_and_self():
    rng = np.random.default_rng(0)
    for n in (1, 7, 30):
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        t = DraftTree(np.zeros(n, np.int64), parents)
        m = t.attention_mask()
        for i in range(n):
            assert set(np.flatnonzero(m[i]).tolist()) == set(t.path(i))


def test_merge_keeps_the_best_score_of_a_shared_path_and_its_source():
    a = DraftTree.chain([1, 2], scores=[0.5, 0.4], source=1)
    b = DraftTree.from_sequences([[1, 3], [1, 2], [1, 2]], source=2)  # [1]: 1.0, [1, 3]: 1/3, [1, 2]: 2/3
    m = merge_trees([a, b])
    assert m.tree.tokens.tolist() == [1, 2, 3] and m.tree.parents.tolist() == [-1, 0, 0]
    assert m.tree.scores.tolist() == [1.0, 2 / 3, 1 / 3]
    assert m.tree.sources.tolist() == [2, 2, 2]
    # Each input node's merged node: a's [1, 2] and b's [1, 2] are the same path.
    assert m.maps[0].tolist() == [0, 1] and m.maps[1].tolist() == [0, 2, 1]
    c = DraftTree.chain([1, 2], scores=[0.9, 0.9], source=4)
    # [1] stays b's (1.0 > 0.9); [1, 2] goes to c (0.9 > 2/3). Merged order: b's nodes 1, 3, 2.
    assert merge_trees([b, c]).tree.sources.tolist() == [2, 2, 4]
    assert len(DraftTree.merge([])) == 0


def test_prune_keeps_a_valid_tree_of_the_best_nodes():
    t = DraftTree.from_sequences([[1, 2, 3], [4]], weights=[5, 1])
    p = t.prune(2)
    assert p.tokens.tolist() == [1, 2] and p.parents.tolist() == [-1, 0]
    assert t.prune(10) is t and len(t.prune(0)) == 0
    with pytest.raises(ValueError):
        t.prune(-1)
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = 25
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        tree = DraftTree(rng.integers(0, 50, n), parents, rng.random(n))
        for b in (1, 5, 12):
            kept = tree.best(b)
            assert tree.prune(b).check() == "" and len(tree.prune(b)) == b == len(kept)
            # Ancestor-closed, and no dropped node outranks a kept one on path score.
            assert all(int(tree.parents[i]) < 0 or int(tree.parents[i]) in set(kept.tolist()) for i in kept)
            ps = tree.path_scores()
            dropped = np.setdiff1d(np.arange(n), kept)
            assert ps[dropped].max() <= ps[kept].min()


def _valid_as_constructed(t: DraftTree) -> bool:
    """What the constructor would have checked and converted, for trees built without it."""
    fresh = DraftTree(t.tokens, t.parents)  # depths handed over by the producer must be the computed ones
    return (t.check() == "" and t.tokens.dtype == np.int64 and t.parents.dtype == np.int32
            and t.scores.dtype == np.float64 and t.sources.dtype == np.int16
            and t.depth.tolist() == fresh.depth.tolist())


def test_merges_and_cuts_built_without_the_constructors_checks_are_valid_trees():
    """merge_trees and subset skip the constructor's checks on a hot path: what they build must pass them."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        trees = []
        for s in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 20))
            parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
            trees.append(DraftTree(rng.integers(0, 6, n), parents, rng.random(n), np.full(n, s, np.int16)))
        m = merge_trees(trees).tree
        assert _valid_as_constructed(m)
        # Every input path is a merged path with the same tokens.
        for tree, where in zip(trees, merge_trees(trees).maps):
            for i in range(len(tree)):
                assert m.tokens[m.path(int(where[i]))].tolist() == tree.tokens[tree.path(i)].tolist()
        if len(m):
            cut = m.subset(m.best(int(rng.integers(1, len(m) + 1))))
            assert _valid_as_constructed(cut) and cut.ids is not None and cut.ids.dtype == np.int64
            assert _valid_as_constructed(cut.subset(np.arange(len(cut) // 2)))


def test_best_respects_max_depth_and_path_scores_never_exceed_the_parent():
    # A child scored above its parent is capped at the parent's score.
    t = DraftTree(np.array([1, 2, 3]), np.array([-1, 0, 1]), np.array([0.5, 0.9, 0.1]))
    assert t.path_scores().tolist() == [0.5, 0.5, 0.1]
    assert t.best(3, max_depth=2).tolist() == [0, 1]
    assert t.best(3, max_depth=0).tolist() == []


def test_check_rejects_bad_arrays():
    with pytest.raises(ValueError, match="parents"):
        DraftTree(np.array([1, 2]), np.array([-1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="negative"):
        DraftTree(np.array([-3]), np.array([-1]), np.array([1]))
    with pytest.raises(ValueError, match="shapes"):
        DraftTree(np.array([1, 2]), np.array([-1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="non-finite"):
        DraftTree(np.array([1]), np.array([-1]), np.array([np.nan]))


def test_from_sequences_builds_valid_tries_unchecked_and_still_refuses_bad_input():
    """The trie skips the constructor's checks (valid by construction): on random sequences it
    passes them anyway, every sequence is a path of it and no path appears twice, and a negative
    id or a non-finite weight is still refused by name."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        seqs = [rng.integers(0, 4, int(rng.integers(0, 6))).tolist() for _ in range(int(rng.integers(0, 6)))]
        t = DraftTree.from_sequences(seqs, weights=rng.random(len(seqs)) + 0.1)
        assert t.check() == ""
        paths = {tuple(t.tokens[t.path(i)].tolist()) for i in range(len(t))}  # every node's token path
        assert all(tuple(s) in paths for s in seqs if s)
        assert len(paths) == len(t)  # and no node twice: a trie
    with pytest.raises(ValueError, match="negative token id"):
        DraftTree.from_sequences([[3, -1]])
    with pytest.raises(ValueError, match="non-finite score"):
        DraftTree.from_sequences([[1], [2]], weights=[1.0, float("nan")])


def subset_reference(tree: DraftTree, nodes) -> tuple:
    """DraftTree.subset's arrays the numpy way: the slow reference of ``_native.subset_arrays``."""
    keep = np.sort(np.asarray(nodes, dtype=np.int64))
    remap = np.full(len(tree), -1, np.int64)
    remap[keep] = np.arange(len(keep))
    parents = tree.parents[keep]
    new_parents = np.where(parents >= 0, remap[np.maximum(parents, 0)], -1)
    ids = keep if tree.ids is None else tree.ids[keep]
    return tree.tokens[keep], new_parents, tree.scores[keep], tree.sources[keep], ids


@pytest.mark.parametrize("seed", range(6))
def test_native_subset_equals_the_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    for trial in range(60):
        n = int(rng.integers(1, 80))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        tree = DraftTree(rng.integers(0, 49152, n), parents, rng.random(n), rng.integers(0, 9, n).astype(np.int16))
        if trial % 2:  # a tree cut before: provenance composes
            tree = tree.subset(np.arange(n)[: max(1, n - 3)])
        keep = tree.best(int(rng.integers(0, len(tree) + 1)))
        order = rng.permutation(len(keep))  # any order in, index order out
        got = tree.subset(keep[order])
        want = subset_reference(tree, keep)
        for a, b in zip((got.tokens, got.parents, got.scores, got.sources, got.node_ids()), want):
            assert a.tolist() == b.tolist(), (seed, trial)
        assert got.check() == ""
    with pytest.raises(IndexError, match="out of range"):
        tree.subset([len(tree)])


def test_depths_a_scorer_hands_over_are_the_trees_depths():
    # NodeScorer.score passes the depths it computed to DraftTree.trusted (not computed again):
    # they must be what the tree's own depth computation gives, and read-only like it.
    from lookupdec.drafters.calibrate import NodeScorer, conditional

    rng = np.random.default_rng(3)
    for _ in range(20):
        seqs = [rng.integers(0, 4, int(rng.integers(1, 7))).tolist() for _ in range(int(rng.integers(1, 6)))]
        t = DraftTree.from_sequences(seqs)
        scored = NodeScorer("pld").score(t, conditional(t), 3, 1)
        fresh = DraftTree(scored.tokens, scored.parents, scored.scores)
        assert scored.depth.tolist() == fresh.depth.tolist() == t.depth.tolist()
        assert scored.depth.dtype == np.int32 and not scored.depth.flags.writeable


def test_a_cut_of_a_sampled_tree_keeps_the_kept_nodes_q_rows():
    q = np.arange(4 * 3, dtype=np.float64).reshape(4, 3) + 1.0
    q /= q.sum(axis=1, keepdims=True)
    t = DraftTree(np.array([0, 1, 2, 0]), np.array([-1, 0, -1, 2], np.int32), q=q)
    cut = t.subset([3, 0, 2])  # any order in, index order out
    assert cut.sampled and cut.tokens.tolist() == [0, 2, 0] and cut.parents.tolist() == [-1, -1, 1]
    assert np.array_equal(cut.q, q[[0, 2, 3]]) and cut.node_ids().tolist() == [0, 2, 3]


def test_native_merge_equals_the_dict_trie_with_shared_paths_ties_and_repeated_sources():
    from tests.oracles.merge import merge_reference

    rng = np.random.default_rng(11)
    for trial in range(300):
        trees = []
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(0, 25))
            # A small alphabet so that sources share paths; a tree may repeat a token among siblings.
            parents = [int(rng.integers(-1, i)) for i in range(n)]
            scores = rng.choice([0.25, 0.5, float(rng.random())], n)  # equal scores: the first kept
            trees.append(DraftTree(rng.integers(0, 4, n), np.array(parents, np.int32), scores,
                                   rng.integers(0, 9, n).astype(np.int16)))
        if sum(len(t) for t in trees) == 0:
            continue
        m = merge_trees(trees)
        toks, pars, scores, srcs, depth, maps, agree = merge_reference(trees)
        assert m.tree.tokens.tolist() == toks and m.tree.parents.tolist() == pars
        assert m.tree.scores.tolist() == scores and m.tree.sources.tolist() == srcs
        assert m.tree.depth.tolist() == depth and [w.tolist() for w in m.maps] == maps
        assert m.agree == agree and not m.tree.check()  # check() names a problem, or is empty
        path = list(scores)
        for i, p in enumerate(pars):
            if p >= 0 and path[i] > path[p]:
                path[i] = path[p]
        assert m.tree.path_scores().tolist() == path
