"""Token Recycling: the adjacency table, its expansion, and lossless decoding with it."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.drafters.base import DraftRequest, StepOutcome
from lookupdec.drafters.recycle import RecycleConfig, RecycleDrafter, RecycleTable
from tests.oracles.recycle import expand
from tests.conftest import FLAT, TINY_VOCAB, tiny_loaded



def _successors(table, token):
    """Oracle of ``RecycleTable.successors``: the token's row as arrays, cut at its first -1."""
    if token >= len(table.ids) or table.ids[token, 0] < 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    ids = table.ids[token]
    n = int((ids >= 0).sum())
    return ids[:n], table.probs[token, :n]


def _slow_table(updates, k):
    """Dict oracle: every row overwrites its token's entry, in order."""
    table = {}
    for rows, ids, probs in updates:
        for r in range(len(rows)):
            table[int(rows[r])] = (list(ids[r][:k]), list(probs[r][:k]))
    return table


@pytest.mark.parametrize("probs_dtype", [np.float32, np.float64])  # the native update, and numpy's route
def test_table_update_equals_a_dict_that_overwrites_row_by_row(probs_dtype):
    rng = np.random.default_rng(0)
    t = RecycleTable(4)
    updates = []
    for step in range(30):
        n = int(rng.integers(1, 12))
        rows = rng.integers(0, 40 if step < 10 else 300, n)  # repeated tokens within a step; the table grows
        k = 2 if step % 4 == 3 else 4  # fewer candidates than the table keeps: the rest are cleared
        ids = rng.integers(0, 500, (n, k))
        probs = rng.random((n, k)).astype(probs_dtype)
        t.update(rows, ids, probs)
        updates.append((rows, ids, probs))
    want = _slow_table(updates, 4)
    for tok in range(300):
        got_ids, got_probs = _successors(t, tok)
        if tok in want:
            assert got_ids.tolist() == want[tok][0]
            np.testing.assert_allclose(got_probs, want[tok][1])
        else:
            assert len(got_ids) == 0


def _slow_expansion(table, root, breadth, max_nodes, rate):
    """Every node the table allows (full expansion), then the max_nodes best by path score."""
    nodes = []  # (path tokens, score)

    def grow(token, path, score, depth):
        if depth > len(breadth):
            return
        ids, ps = _successors(table, token)
        for r in range(min(len(ids), breadth[depth - 1])):
            s = score * rate(r, float(ps[r]), depth)
            nodes.append((path + [int(ids[r])], s))
            grow(int(ids[r]), path + [int(ids[r])], s, depth + 1)

    grow(root, [], 1.0, 1)
    nodes.sort(key=lambda x: -x[1])
    return {tuple(p): s for p, s in nodes[:max_nodes]}


def _assert_expansion_is_the_oracles(table, root, breadth, max_nodes, rate):
    e = expand(table, root, breadth, max_nodes, rate)
    got = {tuple(e.tree.path_tokens(i)): float(e.tree.scores[i]) for i in range(len(e.tree))}
    want = _slow_expansion(table, root, breadth, max_nodes, rate)
    assert got.keys() == want.keys()
    for k in got:
        assert got[k] == pytest.approx(want[k])


def test_expansion_equals_the_slow_oracle():
    rng = np.random.default_rng(2)
    for trial in range(30):
        t = RecycleTable(3)
        t.update(np.arange(15), rng.integers(0, 15, (15, 3)), rng.random((15, 3)).astype(np.float32))
        rate_table = rng.random((3, 6)) * 0.9 + 0.05

        def rate(r, p, d):
            return float(rate_table[r, d]) * (0.5 + p / 2)

        root = int(rng.integers(0, 15))
        for max_nodes in (1, 4, 13, 80):
            _assert_expansion_is_the_oracles(t, root, (3, 2, 2, 1), max_nodes, rate)


def test_expansion_equals_the_slow_oracle_on_a_sparse_table_with_short_rows():
    """Tokens never seen as a row (no successors) and rows updated with fewer than k candidates
    (a -1 tail): the expansion and the list form of ``successors`` stop where the table does."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        t = RecycleTable(4)
        rows = rng.choice(30, size=12, replace=False)  # 18 of the 30 tokens are never a row
        t.update(rows, rng.integers(0, 30, (12, 4)), rng.random((12, 4)).astype(np.float32))
        short = rng.choice(rows, size=4, replace=False)  # then some rows shrink to 1-2 candidates
        kk = int(rng.integers(1, 3))
        t.update(short, rng.integers(0, 30, (4, kk)), rng.random((4, kk)).astype(np.float32))
        for tok in range(32):
            ids, ps = _successors(t, tok)
            for most in (1, 2, 4, 6):
                got_ids, got_ps = t.successors(tok, most)
                assert got_ids == ids[:most].tolist() and got_ps == ps[:most].tolist()

        def rate(r, p, d):
            return (0.9 - 0.1 * r) * (0.5 + p / 2) * 0.95 ** d

        for root in (int(rows[0]), int(short[0]), int(np.setdiff1d(np.arange(30), rows)[0])):
            for max_nodes in (3, 20, 200):
                _assert_expansion_is_the_oracles(t, root, (4, 3, 2, 2), max_nodes, rate)


def test_expansion_rules_by_hand():
    t = RecycleTable(2)
    t.update(np.array([1, 2, 3]), np.array([[2, 3], [4, 5], [6, 7]]),
             np.array([[0.6, 0.3], [0.9, 0.1], [0.5, 0.4]], np.float32))
    e = expand(t, 1, (2, 1), 8, lambda r, p, d: p)
    # Depth 1: 2 (0.6), 3 (0.3); depth 2: one child each: 4 under 2 (0.54), 6 under 3 (0.15).
    assert e.tree.tokens.tolist() == [2, 4, 3, 6]
    assert e.tree.parents.tolist() == [-1, 0, -1, 2]
    np.testing.assert_allclose(e.tree.scores, [0.6, 0.54, 0.3, 0.15], rtol=1e-6)
    assert len(expand(t, 9, (2, 1), 8, lambda r, p, d: p).tree) == 0          # never seen: nothing
    assert len(expand(t, 1, (2, 1), 8, lambda r, p, d: p, max_depth=1).tree) == 2  # clipped depth
    assert len(expand(t, 1, (2, 1), 0, lambda r, p, d: p).tree) == 0


def test_config_is_validated():
    for bad in (dict(topk=0), dict(breadth=()), dict(breadth=(9,)), dict(max_nodes=0)):
        with pytest.raises(ValueError):
            RecycleConfig(**bad)


def test_drafter_learns_the_table_from_outcomes_and_drafts_the_root_successors():
    d = RecycleDrafter(topk=2, breadth=(2, 1))
    d.begin([4, 1])
    d.commit(StepOutcome((), (2,), row_tokens=np.array([1, 2]), topk_ids=np.array([[2, 3], [5, 6]]),
                         topk_probs=np.array([[0.6, 0.3], [0.8, 0.1]], np.float32)))
    tree = d.propose(DraftRequest(budget=8, max_depth=8))  # root is now 2
    assert tree.tokens.tolist()[:2] == [5, 6] and tree.parents.tolist()[:2] == [-1, -1]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_recycle_greedy_equals_ar(fast, scale):
    lm = tiny_loaded(3, scale=scale)
    dec = Decoder(lm, hf_kernels=not fast, cost_curve=FLAT)
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, TINY_VOCAB, 20).tolist()
    ar = dec.generate(prompt, method="ar", max_new_tokens=60)
    out = dec.generate(prompt, method="recycle", max_new_tokens=60)
    assert out.token_ids == ar.token_ids
    if scale == 4.0:  # decisive, repetitive outputs: the target's own successors get accepted
        assert out.steps < ar.steps and out.accepted_by_source.get("recycle", 0) > 0


def test_drafters_of_one_state_share_the_table():
    from lookupdec.drafters.calibrate import Calibration
    from lookupdec.drafters.state import DrafterState

    cal = Calibration()
    state = DrafterState(cal)
    # c shares the calibration but not the state: tables belong to the state alone.
    a, b, c = RecycleDrafter(state=state), RecycleDrafter(state=state), RecycleDrafter(calibration=cal)
    assert a.calibration is cal and RecycleDrafter(state=state, table_key="auto").table is not a.table
    a.begin([1])
    a.commit(StepOutcome((), (3,), row_tokens=np.array([1]), topk_ids=np.arange(8)[None] + 10,
                         topk_probs=np.full((1, 8), 0.1, np.float32)))
    assert _successors(b.table, 1)[0].tolist() == list(range(10, 18))  # the next request starts warm
    assert len(_successors(c.table, 1)[0]) == 0                          # another decoder's is its own


def test_a_step_planned_without_budget_asks_for_no_top_k_rows_and_stays_exact():
    """A batch's gate (or draft_budget=0) plans steps with budget 0: no draft, and no top-k rows for
    Token Recycling's table either (that was most of what such a step cost beyond ``ar``)."""
    dec = Decoder(tiny_loaded(3), draft_budget=8)
    prompt = np.random.default_rng(0).integers(3, TINY_VOCAB, 12).tolist()
    ar = dec.generate(prompt, method="ar", max_new_tokens=20).token_ids
    for method in ("recycle", "auto"):
        seq = dec.new_sequence(prompt, method=method, max_new_tokens=20)
        seq.prefill()
        assert seq.plan(None).topk > 0, method
        plain = seq.plan(0)
        assert plain.topk == 0 and len(plain.tree) == 0 and plain.extra is None, method
        from lookupdec.batch import step_together

        while not seq.done:
            step_together(dec.verifier, [seq], None, budget=0 if len(seq.new) % 2 else None)
        assert seq.result().token_ids == ar, method


def test_the_drafter_s_native_expansion_equals_expand_with_its_calibrated_rate():
    """``RecycleDrafter.propose`` (one native call, the rate inside) drafts what ``expand`` with the
    drafter's ``_rate`` drafts: the same nodes in the same order, the same doubles, the same keys
    waiting for outcomes; with learnt rates, a sampling band, equal probabilities (ties in the
    heap), tokens never seen, and depth and node limits."""
    from lookupdec.drafters.calibrate import Calibration

    rng = np.random.default_rng(8)
    drafted = 0
    for trial in range(150):
        cal = Calibration()
        for _ in range(200):  # learnt rates on the recycle keys
            cal.observe(("recycle", int(rng.integers(0, 8)), int(rng.integers(0, 6)), int(rng.integers(0, 7))),
                        bool(rng.random() < 0.4))
        cal = cal.band(0.7) if trial % 3 == 0 else cal
        k, vocab = 4, 12
        d = RecycleDrafter(RecycleConfig(topk=k, breadth=(4, 3, 2, 2, 1), max_nodes=int(rng.integers(1, 30))),
                           calibration=cal)
        rows = rng.integers(0, vocab - 2, 20)  # the last two tokens never get a row
        probs = rng.choice([0.5, 0.25, 0.125, float(rng.random())], (20, k)).astype(np.float32)
        d.table.update(rows, rng.integers(0, vocab, (20, k)), probs)
        root = int(rng.integers(0, vocab))
        d.begin([root])
        depth_limit, asked = int(rng.integers(1, 7)), int(rng.integers(1, 40))
        tree = d.propose(DraftRequest(budget=asked, max_depth=depth_limit))
        want = expand(d.table, root, d.config.breadth, min(asked, d.config.max_nodes), d._rate, depth_limit)
        if not len(want.tree):
            assert len(tree) == 0
            continue
        assert tree.tokens.tolist() == want.tree.tokens.tolist()
        assert tree.parents.tolist() == want.tree.parents.tolist()
        assert tree.scores.tolist() == want.tree.scores.tolist()
        keys = [d._key(r, p, x) for r, p, x in zip(want.ranks.tolist(), want.probs.tolist(),
                                                 want.tree.depth.tolist())]
        assert d._outcomes._waiting[-1].keys == keys
        drafted += len(tree) > 1
    assert drafted > 75  # most trials drafted a tree, not only the empty case
