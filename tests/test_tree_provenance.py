"""Node provenance carried through DraftTree cuts (``DraftTree.ids``).

Oracle: a subset of a subset names the same original nodes as the one direct
subset by the composed indices; end to end, the ids a drafter is told were
accepted are its own nodes whose tokens the step appended, whatever cut the
tree on its way (budget, chain fallback).
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.drafters.base import Drafter
from lookupdec.proposals import check_tree
from lookupdec.tree import DraftTree
from tests.conftest import tiny_loaded


def random_tree(rng: np.random.Generator, n: int) -> DraftTree:
    parents = np.array([rng.integers(-1, i) for i in range(n)], np.int32)
    return DraftTree(rng.integers(0, 50, n), parents, rng.random(n))


def ancestor_closed(tree: DraftTree, rng: np.random.Generator, p: float = 0.6) -> np.ndarray:
    """A random node set that holds every kept node's ancestors."""
    keep = np.zeros(len(tree), bool)
    for i, parent in enumerate(tree.parents.tolist()):
        keep[i] = (parent < 0 or keep[parent]) and rng.random() < p
    return np.flatnonzero(keep)


def test_a_subset_of_a_subset_names_the_same_nodes_as_the_direct_subset():
    rng = np.random.default_rng(0)
    for _ in range(200):
        tree = random_tree(rng, int(rng.integers(1, 30)))
        a = ancestor_closed(tree, rng, 0.8)
        inner = tree.subset(a)
        b = ancestor_closed(inner, rng, 0.7)
        twice = inner.subset(b)
        direct = tree.subset(a[b])
        np.testing.assert_array_equal(twice.node_ids(), a[b])
        np.testing.assert_array_equal(twice.node_ids(), direct.node_ids())
        np.testing.assert_array_equal(twice.tokens, tree.tokens[twice.node_ids()])
        np.testing.assert_array_equal(twice.parents, direct.parents)


def test_ids_survive_rescoring_and_a_rebased_tree_is_its_own_origin():
    tree = DraftTree.from_sequences([[5, 6, 7], [5, 8], [9]])
    cut = tree.subset([0, 1, 3])
    assert cut.with_scores(np.full(3, 0.5)).node_ids().tolist() == [0, 1, 3]
    assert cut.with_ids(None).node_ids().tolist() == [0, 1, 2]
    assert tree.ids is None and tree.node_ids().tolist() == list(range(len(tree)))
    with pytest.raises(ValueError, match="ids"):
        tree.with_ids(np.array([0, 1]))          # one id per node
    with pytest.raises(ValueError, match="ids"):
        tree.with_ids(np.full(len(tree), -2))    # -1 (added since) is the only negative id


def test_check_tree_counts_ids_from_the_proposal_even_when_it_is_itself_a_cut():
    big = DraftTree.chain([4, 5, 6, 7, 8], scores=[0.9, 0.8, 0.7, 0.6, 0.5])
    proposal = big.subset([0, 1, 2, 3])          # what a merging drafter returns: ids 0..3 of ``big``
    tree, kept = check_tree("d", proposal, 100, budget=2, max_depth=10, tree_masks=True)
    assert kept.tolist() == [0, 1] and tree.node_ids().tolist() == [0, 1]
    uncut, none = check_tree("d", proposal, 100, budget=8, max_depth=10, tree_masks=True)
    assert none is None and uncut.node_ids().tolist() == [0, 1, 2, 3]


class Branching(Drafter):
    """Proposes, under the root, a deep unlikely branch first and then the model's own greedy
    continuation (learned from the previous call's output), so cuts move node ids around."""

    name = "branching"

    def __init__(self, continuation: list[int]):
        self.continuation = continuation
        self.pending: DraftTree | None = None
        self.outcomes = []
        self.pos = 0

    def begin(self, prompt_ids):
        self.pos = 0

    def propose(self, request):
        right = self.continuation[self.pos:self.pos + 3]
        wrong = [(t + 1) % 50 for t in right] + [1, 2]
        tree = DraftTree.from_sequences([wrong, right], weights=[0.1, 0.9]) if right else DraftTree.empty()
        self.pending = tree
        return tree

    def commit(self, outcome):
        if self.pending is not None:  # the prefill's outcome answers no proposal
            self.outcomes.append((self.pending, outcome))
        self.pending = None
        self.pos += len(outcome.new_tokens)


@pytest.mark.parametrize("tree_masks, budget", [(True, 64), (True, 3), (False, 64)])
def test_the_drafter_is_told_its_own_node_ids_through_every_cut(tree_masks, budget):
    loaded = tiny_loaded(0)
    ar = Decoder(loaded).generate([5, 6, 7, 8], method="ar", max_new_tokens=16)
    dec = Decoder(loaded, tree_masks=tree_masks, draft_budget=budget)
    d = Branching(list(ar.token_ids))
    out = dec.generate([5, 6, 7, 8], max_new_tokens=16, drafter=d)
    assert out.token_ids == ar.token_ids
    # The right branch (proposed second, and shallower than the wrong one) was accepted at least
    # once: under chain verification too, where the verifier keeps the best-scored path.
    assert _told_own_ids(d.outcomes)


def _told_own_ids(outcomes) -> bool:
    """Check that each outcome names the drafter's own nodes; returns whether any draft was accepted."""
    accepted_any = False
    for proposed, o in outcomes:
        own = list(o.accepted)
        # The accepted ids are the drafter's nodes on one root path, whose tokens were appended.
        assert proposed.tokens[own].tolist() == list(o.new_tokens[:len(own)])
        assert own == (proposed.path(own[-1]) if own else [])
        # Each verified node's origin names the drafter's node with the same token.
        mine = o.origin >= 0
        assert proposed.tokens[o.origin[mine]].tolist() == o.tree.tokens[mine].tolist()
        assert mine.sum() >= len(own)
        accepted_any |= bool(own)
    return accepted_any


class Shifted(Branching):
    """Branching with its own wrong branch (tokens shifted by ``shift``) and the right one first."""

    def __init__(self, continuation: list[int], shift: int):
        super().__init__(continuation)
        self.shift = shift

    def propose(self, request):
        right = self.continuation[self.pos:self.pos + 3]
        wrong = [(t + self.shift) % 50 for t in right]
        tree = DraftTree.from_sequences([right, wrong], weights=[0.8, 0.2]) if right else DraftTree.empty()
        self.pending = tree
        return tree


def test_auto_tells_each_source_its_own_node_ids_of_the_merged_tree():
    """Through auto's merge (shared paths collapse into one node, each source's nodes are renumbered),
    every source is told the accepted nodes and the verified nodes' origins in its own ids."""
    from lookupdec.drafters.auto import AutoDrafter

    loaded = tiny_loaded(0)
    ar = Decoder(loaded).generate([5, 6, 7, 8], method="ar", max_new_tokens=24)
    sources = [Branching(list(ar.token_ids)), Shifted(list(ar.token_ids), 3), Shifted(list(ar.token_ids), 7)]
    auto = AutoDrafter(sources=sources, cost=None, gate=False)
    out = Decoder(loaded, draft_budget=64).generate([5, 6, 7, 8], max_new_tokens=24, drafter=auto)
    assert out.token_ids == ar.token_ids
    for d in sources:
        assert d.outcomes and _told_own_ids(d.outcomes)
