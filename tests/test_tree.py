"""DraftTree: construction, merge, prune, masks, paths, checker."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.tree import DraftTree


def test_from_sequences_builds_a_trie_with_summed_counts():
    t = DraftTree.from_sequences([[5, 6, 7], [5, 8], [9]], counts=[2, 1, 4])
    assert t.tokens.tolist() == [5, 6, 7, 8, 9]
    assert t.parents.tolist() == [-1, 0, 1, 0, -1]
    assert t.counts.tolist() == [3, 2, 2, 1, 4]
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
        t = DraftTree(np.zeros(n, np.int64), parents, np.ones(n, np.int64))
        m = t.attention_mask()
        for i in range(n):
            assert set(np.flatnonzero(m[i]).tolist()) == set(t.path(i))


def test_merge_adds_counts_of_shared_paths():
    a = DraftTree.from_sequences([[1, 2]])
    b = DraftTree.from_sequences([[1, 3], [1, 2]])
    m = DraftTree.merge([a, b])
    assert m.tokens.tolist() == [1, 2, 3] and m.parents.tolist() == [-1, 0, 0] and m.counts.tolist() == [3, 2, 1]
    assert len(DraftTree.merge([])) == 0


def test_prune_keeps_a_valid_tree_of_the_best_nodes():
    t = DraftTree.from_sequences([[1, 2, 3], [4]], counts=[5, 1])
    p = t.prune(2)
    assert p.tokens.tolist() == [1, 2] and p.parents.tolist() == [-1, 0]
    assert t.prune(10) is t and len(t.prune(0)) == 0
    with pytest.raises(ValueError):
        t.prune(-1)
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = 25
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        tree = DraftTree(rng.integers(0, 50, n), parents, rng.integers(1, 9, n))
        for b in (1, 5, 12):
            assert tree.prune(b).check() == "" and len(tree.prune(b)) == b


def test_check_rejects_bad_arrays():
    with pytest.raises(ValueError, match="parents"):
        DraftTree(np.array([1, 2]), np.array([-1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="negative"):
        DraftTree(np.array([-3]), np.array([-1]), np.array([1]))
    with pytest.raises(ValueError, match="shapes"):
        DraftTree(np.array([1, 2]), np.array([-1]), np.array([1, 1]))
