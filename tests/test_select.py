"""select_nodes: the subtree with the best expected tokens per ms, against brute force."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from lookupdec.drafters.select import select_nodes
from lookupdec.tree import DraftTree


def brute_force(tree: DraftTree, cost: np.ndarray, budget: int, max_depth: int, margin: float) -> float:
    """The best rate over every ancestor-closed subset (2^n subsets; small trees only)."""
    n = len(tree)
    scores = tree.path_scores()
    depth = tree.depth
    best = 1.0 / cost[1]
    for k in range(1, min(n, budget, len(cost) - 2) + 1):
        for subset in itertools.combinations(range(n), k):
            chosen = set(subset)
            if any(int(tree.parents[i]) >= 0 and int(tree.parents[i]) not in chosen for i in subset):
                continue
            if any(depth[i] > max_depth for i in subset):
                continue
            best = max(best, (1 + scores[list(subset)].sum()) / cost[1 + k])
    return best


def rate(tree, sel, cost):
    return (1 + tree.path_scores()[sel.nodes].sum()) / cost[1 + len(sel.nodes)]


def test_choice_is_the_best_ancestor_closed_subset():
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 9))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        tree = DraftTree(rng.integers(0, 9, n), parents, rng.random(n) ** 2)
        # Cost curves from flat (drafting nearly free) to steep (never pays).
        slope = float(rng.choice([0.0, 0.02, 0.2, 1.0]))
        cost = np.concatenate([[np.inf], 1.0 + slope * np.arange(12) + rng.random(12) * 0.01])
        budget, max_depth = int(rng.integers(0, 9)), int(rng.integers(0, 5))
        sel = select_nodes(tree, cost, budget, max_depth, margin=0.0)
        got = rate(tree, sel, cost) if len(sel.nodes) else 1.0 / cost[1]
        assert np.isclose(got, brute_force(tree, cost, budget, max_depth, 0.0)), trial
        kept = set(sel.nodes.tolist())
        assert all(int(tree.parents[i]) < 0 or int(tree.parents[i]) in kept for i in kept)
        assert len(kept) <= budget and all(tree.depth[i] <= max_depth for i in kept)


def test_nothing_is_drafted_when_no_tree_pays():
    tree = DraftTree.chain([5, 6, 7], scores=[0.3, 0.1, 0.05])
    # Each extra row costs 50% of a plain step: 1.3 expected tokens cannot pay for 1.5x time.
    steep = np.array([np.inf, 1.0, 1.5, 2.0, 2.5])
    sel = select_nodes(tree, steep, budget=8)
    assert len(sel.nodes) == 0 and sel.gain == 1.0
    # The margin: a tree 1% better than a plain step is not drafted with a 2% margin, is with 0.
    flat = np.array([np.inf, 1.0, 1.0 + 0.3 / 1.01, 2.0, 2.0])
    assert len(select_nodes(tree, flat, budget=1, margin=0.02).nodes) == 0
    assert select_nodes(tree, flat, budget=1, margin=0.0).nodes.tolist() == [0]


def test_empty_tree_and_zero_budget():
    cost = np.array([np.inf, 1.0, 1.0, 1.0])
    assert len(select_nodes(DraftTree.empty(), cost, 8).nodes) == 0
    assert len(select_nodes(DraftTree.chain([1], scores=[0.9]), cost, 0).nodes) == 0


def test_native_scan_equals_the_slow_reference():
    # select_nodes runs one native call (_native.select_scan); tests/oracles/select.py does the
    # same with numpy's lexsort, cumsum and argmax. Scores on a coarse grid force ties in path
    # score (broken by depth, then index), and deep trees meet the depth limit.
    from tests.oracles.select import select_reference

    rng = np.random.default_rng(1)
    for trial in range(400):
        n = int(rng.integers(0, 60))
        parents = np.array([int(rng.integers(-1, i)) if rng.random() < 0.8 else i - 1 for i in range(n)], np.int32)
        scores = np.round(rng.random(n), 1) if trial % 2 else rng.random(n) ** 3
        tree = DraftTree(rng.integers(0, 50, n), parents, scores)
        slope = float(rng.choice([0.0, 0.005, 0.05, 0.5]))
        cost = np.concatenate([[np.inf], 1.0 + slope * np.arange(int(rng.integers(1, 70)))])
        budget = int(rng.integers(0, 70))
        max_depth = None if trial % 3 == 0 else int(rng.integers(0, 8))
        margin = float(rng.choice([0.0, 0.02, 0.5]))
        sel = select_nodes(tree, cost, budget, max_depth, margin)
        nodes, accepted, gain = select_reference(tree, cost, budget, max_depth, margin)
        assert sel.nodes.tolist() == nodes, trial
        assert sel.gain == gain, trial  # the same sums in the same order: the same doubles
        assert np.isclose(sel.expected_tokens, 1.0 + accepted), trial
        assert sel.ms == (float(cost[1 + len(nodes)]) if nodes else float(cost[1])), trial


def test_native_scan_refuses_a_parent_after_its_child():
    from lookupdec._native import select_scan

    with pytest.raises(ValueError, match="parent"):
        select_scan(np.array([-1, 2, 0], np.int32), np.ones(3), np.ones(6), 3, 5, 0.0)
