"""``auto``'s choice of a step's nodes in one native call (``auto_choose``) against its Python route.

The reference is the route it replaces, one routine after another (``tests/oracles/choose.py``):
``merge_trees``, ``MergedCalibration.apply``, ``select_nodes``, ``DraftTree.subset`` and
``step_shares``. Equality is exact: the same trie, the same doubles, the same nodes and shares.
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec._native import auto_choose, split_outcome
from lookupdec.costs import CostCurve
from lookupdec.drafters.auto import AutoDrafter, context_source
from lookupdec.drafters.base import DraftRequest, StepOutcome
from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.llma import LLMADrafter
from lookupdec.drafters.lookahead import LookaheadDrafter
from lookupdec.drafters.recycle import RecycleDrafter
from lookupdec.drafters.state import DrafterState
from lookupdec.tree import DraftTree, merge_trees
from tests.oracles.choose import choose_reference, split_reference


def _trained(rng, with_band: bool) -> Calibration:
    """A Calibration (or its band at 0.7) with outcomes on many of the merged keys."""
    cal = Calibration(prior_weight=3.0)
    out = cal.band(0.7) if with_band else cal
    for c in (cal, out):
        for _ in range(300):
            key = ("auto", int(rng.integers(0, 20)), int(rng.integers(0, 4)), int(rng.integers(0, 7)))
            c.observe(key, bool(rng.random() < 0.6))
    return out


def _trees(rng) -> list[DraftTree]:
    trees = []
    for s in range(int(rng.integers(1, 5))):
        n = int(rng.integers(0, 25)) if rng.random() < 0.85 else 0
        # A small alphabet: sources share paths; a tree may repeat a token among siblings.
        parents = [int(rng.integers(-1, i)) for i in range(n)]
        scores = rng.choice([0.25, 0.5, 0.999, 1.0, float(rng.random())], n)  # ties, the top score bin
        trees.append(DraftTree(rng.integers(0, 4, n), np.array(parents, np.int32), scores,
                               np.full(n, s + 1, np.int16)))
    return trees


def _costs(rng, top: int) -> np.ndarray:
    """A non-decreasing cost table of ``top`` widths: flat (every node pays), steep, or in between."""
    slope = float(rng.choice([0.0, 0.05, 0.5, 3.0, 30.0]))
    return np.concatenate([[np.inf], 10.0 + np.cumsum(rng.uniform(0, slope, top))])


def test_native_choice_equals_merge_rate_select_cut_and_share_in_python():
    rng = np.random.default_rng(21)
    cut_some = chose_all = chose_none = empty = 0
    for trial in range(400):
        trees = _trees(rng)
        cal = _trained(rng, with_band=trial % 3 == 0)
        cost = _costs(rng, int(rng.integers(2, 60)))  # sometimes shorter than the budget
        budget, max_depth = int(rng.integers(0, 40)), int(rng.integers(1, 12))
        margin = float(rng.choice([0.0, 0.05, 0.3, 2.0]))
        spent = rng.choice([0.1, 0.2, float(rng.random())], len(trees)).tolist()  # equal costs: source order
        window_costs = [cost - rng.uniform(0, 2) if rng.random() < 0.3 else None for _ in trees]
        out = auto_choose(trees, cal.levels(), cost, budget, max_depth, margin, spent, window_costs)
        ref_merged, ref_rated, ref_record, ref_nodes, ref_cut, ref_shares = choose_reference(
            trees, cal, cost, budget, max_depth, margin, spent, window_costs)
        if not len(ref_merged.tree):  # nothing proposed: no call's worth of work
            assert out is None
            empty += 1
            continue
        merged, rated, record, nodes, cut, shares = out
        toks, pars, scs, srcs, depth, maps, agree = merged
        t = ref_merged.tree
        assert record == ref_record
        assert toks.tolist() == t.tokens.tolist() and pars.tolist() == t.parents.tolist()
        assert scs.tolist() == t.scores.tolist() and srcs.tolist() == t.sources.tolist()
        assert depth == t.depth.tolist() and agree == ref_merged.agree
        assert [m.tolist() for m in maps] == [m.tolist() for m in ref_merged.maps]
        assert rated.tolist() == ref_rated.scores.tolist()
        assert nodes.tolist() == ref_nodes.tolist()
        if ref_cut is None:
            assert cut is None
        else:
            ct, cp, csc, csr, cids = cut
            assert ct.tolist() == ref_cut.tokens.tolist() and cp.tolist() == ref_cut.parents.tolist()
            assert csc.tolist() == ref_cut.scores.tolist() and csr.tolist() == ref_cut.sources.tolist()
            assert cids.tolist() == ref_cut.node_ids().tolist()
        rows_ms, forward, owner = shares
        assert rows_ms == ref_shares.rows_ms and forward == ref_shares.forward_ms and owner == ref_shares.owner
        cut_some += 0 < len(nodes) < len(t)
        chose_all += 0 < len(nodes) == len(t)
        chose_none += len(t) > 0 and not len(nodes)
    assert min(cut_some, chose_all, chose_none, empty) > 10, (cut_some, chose_all, chose_none, empty)


def test_native_choice_refuses_what_the_python_route_refuses():
    def tree(parents, scores):  # trusted: past the constructor's checks, as a broken source's could be
        n = len(parents)
        return DraftTree.trusted(np.arange(5, 5 + n, dtype=np.int64), np.array(parents, np.int32),
                                 np.array(scores, np.float64), np.ones(n, np.int16))

    cost, levels = np.array([np.inf, 10.0, 11.0]), Calibration().levels()
    with pytest.raises(ValueError, match="NaN"):
        auto_choose([tree([-1], [np.nan])], levels, cost, 4, 4, 0.0, [0.0], [None])
    with pytest.raises(ValueError, match="one entry per tree"):
        auto_choose([tree([-1], [0.5])], levels, cost, 4, 4, 0.0, [0.0, 1.0], [None])
    with pytest.raises(ValueError, match="parent after its child"):
        auto_choose([tree([1, -1], [0.5, 0.5])], levels, cost, 4, 4, 0.0, [0.0], [None])


def test_native_split_tells_each_source_what_the_python_loop_told_it():
    """Each source's accepted nodes and verified nodes in its own ids: shared paths, a source's
    repeated merged node (its first node kept), nodes not auto's (-1), nothing chosen."""
    rng = np.random.default_rng(23)
    seen_partial = 0
    for trial in range(400):
        trees = [t for t in _trees(rng)]
        merged = merge_trees(trees)
        n = len(merged.tree)
        chosen = sorted(rng.choice(n, int(rng.integers(0, n + 1)), replace=False).tolist()) if n else []
        # An accepted path: a root-to-leaf walk down the chosen nodes (their parents are chosen first).
        kids: dict[int, list[int]] = {}
        for a, m in enumerate(chosen):
            p = int(merged.tree.parents[m])
            kids.setdefault(chosen.index(p) if p in chosen else -1, []).append(a)
        node, accepted = -1, []
        while kids.get(node) and rng.random() < 0.8:
            node = int(rng.choice(kids[node]))
            accepted.append(node)
        n_tree = len(chosen) + int(rng.integers(0, 3))  # a grammar may add nodes that are not auto's
        origin = np.array([v if v < len(chosen) else -1 for v in range(n_tree)], np.int64)
        if rng.random() < 0.3:
            origin = np.zeros(0, np.int64) if n_tree == len(chosen) else origin  # the proposal itself
        got = split_outcome(merged.maps, chosen, tuple(accepted), origin, n_tree, n)
        want = split_reference(merged.maps, chosen, tuple(accepted), origin, n_tree)
        assert got[0] == want[0]
        for g, w in zip(got[1], want[1], strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                assert g[0] == w[0] and g[1].tolist() == w[1].tolist()
                seen_partial += 0 < len(g[0]) < len(accepted)
    assert seen_partial > 10
    with pytest.raises(IndexError):
        split_outcome((np.array([0], np.int64),), [0], (0,), np.array([3], np.int64), 1, 1)


rng = np.random.default_rng(9)
TEXT = rng.integers(3, 12, 500).tolist()  # repetitive over a small vocabulary: every source drafts
# Each further row costs 3% of a one-row step: the choice keeps some nodes and cuts others.
SLOPED = CostCurve((1, 8, 64), (10.0, 12.0, 30.0), 0, (0.0, 0.0, 0.0), "test", "sloped")


def _auto(native: bool) -> AutoDrafter:
    cal = Calibration()
    sources = [context_source(cal), LLMADrafter([TEXT[100:400]], calibration=cal),
               LookaheadDrafter(calibration=cal, cost=SLOPED),
               RecycleDrafter(calibration=cal, state=DrafterState(cal))]
    d = AutoDrafter(sources=sources, calibration=cal, cost=SLOPED, gate=False)
    d.native_choice = native
    return d


def test_auto_proposes_the_same_trees_on_either_route_step_after_step():
    """Two ``auto`` drafters, one on each route, told the same outcomes: the same proposals every
    step (scores to the bit), the lookahead window priced alike, the same calibration after."""
    fast, slow = _auto(True), _auto(False)
    pos = 200
    for d in (fast, slow):
        d.begin(TEXT[:pos])
    cuts = windows = 0
    for step in range(60):
        req = DraftRequest(32, 16)
        a, b = fast.propose(req), slow.propose(req)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        assert a.scores.tolist() == b.scores.tolist() and a.node_ids().tolist() == b.node_ids().tolist()
        wa, wb = fast.window(req), slow.window(req)
        assert (wa is None) == (wb is None)
        windows += wa is not None
        merged_len = len(fast._last[0].tree)
        cuts += 0 < len(a) < merged_len
        # The target continues TEXT: the walk accepts the matching path, then one token more.
        children: dict[int, list[int]] = {}
        for i, p in enumerate(a.parents.tolist()):
            children.setdefault(p, []).append(i)
        node, accepted = -1, []
        while True:
            want = TEXT[(pos + len(accepted)) % len(TEXT)]
            nxt = next((c for c in children.get(node, []) if int(a.tokens[c]) == want), None)
            if nxt is None:
                break
            accepted.append(nxt)
            node = nxt
        new = tuple(TEXT[(pos + i) % len(TEXT)] for i in range(len(accepted) + 1))
        rows = np.array([new[0]] + [int(a.tokens[i]) for i in accepted], np.int64)
        k = max(int(fast.topk), 1)
        ids = np.array([[(t * 5 + j) % 9 + 3 for j in range(k)] for t in rows], np.int64)
        probs = np.tile(np.linspace(0.5, 0.1, k, dtype=np.float32), (len(rows), 1))
        extra = np.array([TEXT[(pos + int(x)) % len(TEXT)] for x in wa.depth], np.int64) if wa is not None \
            else np.zeros(0, np.int64)
        for d in (fast, slow):
            d.commit(StepOutcome(tuple(accepted), new, a, np.arange(len(a), dtype=np.int64), row_tokens=rows,
                                 topk_ids=ids, topk_probs=probs, extra_argmax=extra))
        pos += len(new)
    assert cuts > 5 and windows > 5, (cuts, windows)  # the fixture reaches the cut and the window
    assert fast.calibration._fine == slow.calibration._fine
