"""Calibration: raw estimates become acceptance probabilities learned from outcomes."""
from __future__ import annotations

import numpy as np

from lookupdec.drafters.calibrate import Calibration, NodeScorer, conditional
from lookupdec.tree import DraftTree


def test_path_scores_are_products_of_conditionals_and_never_exceed_the_parent():
    s = NodeScorer("pld", Calibration(), prior=lambda raw, m, d: 0.8 * raw)
    tree = DraftTree.from_sequences([[5, 6, 7], [5, 8]])
    scored = s.score(tree, conditional(tree), match_len=3, source_id=1)
    c = conditional(tree)  # [1.0, 0.5, 1.0, 0.5]
    expected = [0.8 * c[0], 0.8 * c[0] * 0.8 * c[1], 0.8 * c[0] * 0.8 * c[1] * 0.8 * c[2], 0.8 * c[0] * 0.8 * c[3]]
    assert np.allclose(scored.scores, expected)
    assert scored.sources.tolist() == [1] * 4
    assert all(scored.scores[i] <= scored.scores[p] for i, p in enumerate(scored.parents.tolist()) if p >= 0)


def test_outcomes_move_the_rates_of_their_own_keys_only():
    cal = Calibration()
    s = NodeScorer("rest", cal, prior=lambda raw, m, d: 0.5)
    chain = DraftTree.chain([5, 6, 7])
    for _ in range(60):
        s.score(chain, np.ones(3), match_len=4, source_id=3)
        s.learn((5, 6, 9))  # the first two nodes are right every time, the third never
    t = s.score(chain, np.ones(3), match_len=4, source_id=3)
    cond = [t.scores[0], t.scores[1] / t.scores[0], t.scores[2] / t.scores[1]]
    assert cond[0] > 0.9 and cond[1] > 0.9 and cond[2] < 0.1
    # Another source shares the Calibration but not the rates; a fresh key starts near its prior.
    other = NodeScorer("llma", cal, prior=lambda raw, m, d: 0.5)
    t2 = other.score(chain, np.ones(3), match_len=4, source_id=2)
    assert abs(t2.scores[0] - 0.5) < 1e-9
    assert cal.observations("rest") == 180 and cal.observations("llma") == 0


def test_only_nodes_under_a_confirmed_parent_are_observed():
    cal = Calibration()
    s = NodeScorer("pld", cal, prior=lambda raw, m, d: 0.5)
    tree = DraftTree.from_sequences([[5, 6], [7, 8]])   # 5 -> 6, 7 -> 8
    s.score(tree, np.ones(4), match_len=2, source_id=1)
    s.learn((5, 9))   # 5 right, 6 wrong (9 followed), 7 wrong; 8 is under a wrong node: not observed
    assert cal.observations("pld") == 3
    # A node deeper than the step's new tokens waits for the steps after it.
    s.score(DraftTree.chain([1, 2, 3]), np.ones(3), match_len=2, source_id=1)
    s.learn((1,))
    assert cal.observations("pld") == 4
    s.learn((2, 4))  # 2 followed, 3 did not
    assert cal.observations("pld") == 6
    # Once a node fails, nothing under it is ever observed, however many tokens follow.
    s.score(DraftTree.chain([1, 2, 3]), np.ones(3), match_len=2, source_id=1)
    s.learn((7,))
    s.learn((2, 3))
    assert cal.observations("pld") == 7


def test_deep_nodes_are_decided_by_later_steps_and_their_rates_learned():
    """A source verified a few tokens deep still learns how its deep nodes fare.

    Each step checks only the first node (a one-token step), but the copy runs on: the
    later steps decide the deep nodes, and their depth buckets learn the copy's rate.
    Deciding only with each step's own tokens would leave them at the prior.
    """
    cal = Calibration()
    s = NodeScorer("pld", cal, prior=lambda raw, m, d: 0.3)
    text = list(range(100, 400))
    for at in range(200):
        # Every other proposal starts wrong; a copy that starts right runs on to depth 12.
        chain = text[at:at + 12] if at % 2 else [0] + text[at + 1:at + 12]
        s.score(DraftTree.chain(chain), np.ones(12), match_len=4, source_id=1)
        s.learn(text[at:at + 1])
    first = cal.rate(("pld", 5, 3, 0), 0.3)  # raw 1.0, match 4, depth 1
    deep = cal.rate(("pld", 5, 3, 6), 0.3)   # the same, depth 12 and beyond
    assert 0.4 < first < 0.6 and deep > 0.95
    assert cal.observations("pld") > 100 * 11
    # A scorer restarted for a new sequence drops what waits: the next tokens do not follow it.
    s.score(DraftTree.chain([1, 2, 3]), np.ones(3), match_len=2, source_id=1)
    s.restart()
    before = cal.observations("pld")
    s.learn((1, 2, 3))
    assert cal.observations("pld") == before


def test_shrinkage_toward_the_coarse_rate_then_the_prior():
    cal = Calibration(prior_weight=4.0)
    fine, coarse = ("pld", 4, 2, 1), ("pld", 4, 2, 3)  # same raw and match buckets, other depth buckets
    for _ in range(12):
        cal.observe(fine, True)
    # The fine key learned most; a sibling depth bucket borrows from the shared coarse rate.
    assert cal.rate(fine, 0.2) > cal.rate(coarse, 0.2) > 0.2
    assert abs(Calibration().rate(fine, 0.2) - 0.2) < 1e-12


def test_merged_calibration_observes_whole_paths_and_learns_a_source_s_overconfidence():
    from lookupdec.drafters.merged import MergedCalibration
    from lookupdec.tree import merge_trees

    cal = Calibration()
    mc = MergedCalibration(cal)
    # Two sources agree on [5, 6]; one also proposes [7]. Both overstate their chances.
    a = DraftTree.chain([5, 6], scores=[0.9, 0.9], source=1)
    b = DraftTree.from_sequences([[5, 6], [7]], source=2)
    first = mc.apply(merge_trees([a, b]))
    assert np.allclose(first.scores, merge_trees([a, b]).tree.path_scores())  # no outcome yet: the prior
    for _ in range(80):
        mc.apply(merge_trees([a, b]))
        mc.learn((5, 8))  # 5 right, 6 wrong, 7 wrong
    after = mc.apply(merge_trees([a, b]))
    assert after.scores[0] > 0.9 and after.scores[1] < 0.1 and after.scores[2] < 0.1
    # A path deeper than a step's new tokens is decided by the steps after it: a miss below a miss.
    mc = MergedCalibration(cal)
    before = cal.observations("auto")
    mc.apply(merge_trees([DraftTree.from_sequences([[5, 6, 9], [5, 7]])]))
    mc.learn((5,))  # node 5 decided (followed, as the bonus token); 6, 7 and 9 lie beyond
    assert cal.observations("auto") == before + 1
    mc.learn((7, 1))  # 7 followed, 6 did not, so 9 (under 6) is a miss too
    assert cal.observations("auto") == before + 4


def test_dropping_tokens_no_proposal_waits_on_changes_no_outcome():
    """``Outcomes`` keeps one token list for its waiting proposals and drops its decided head
    (``TRIM``): the rates learned equal those of a list that is never cut."""
    from lookupdec.drafters.calibrate import Outcomes

    rng = np.random.default_rng(3)
    text = rng.integers(0, 3, 600).tolist()
    rates = []
    for trim in (5, 10**9):
        cal = Calibration()
        out = Outcomes(cal, conditional=False)
        out.TRIM = trim
        at = 0
        while at < 580:
            tree = DraftTree.from_sequences([text[at:at + 6], [text[at], 2 - text[at + 1]]])
            depth = tree.depth.tolist()
            out.add(tree.tokens.tolist(), tree.parents.tolist(), depth,
                    [("s", 0, 0, d) for d in depth])
            step = 1 + at % 3  # steps of 1-3 tokens
            out.learn(text[at:at + step])
            at += step
        rates.append(dict(cal._fine))
    assert rates[0] == rates[1] and sum(t for _, t in rates[0].values()) > 1000


def test_conditional_equals_the_vectorised_formula_with_zero_scored_parents():
    """Each node's score over its parent's (root children: their own; 0 under a parent scored 0)."""
    rng = np.random.default_rng(5)
    for _ in range(100):
        n = int(rng.integers(1, 30))
        parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        scores = rng.random(n) * (rng.random(n) > 0.2)  # about a fifth scored 0
        tree = DraftTree(rng.integers(0, 9, n), parents, scores)
        parent_s = np.where(parents >= 0, scores[np.maximum(parents, 0)], 1.0)
        want = np.divide(scores, parent_s, out=np.zeros(n), where=parent_s > 0)
        assert conditional(tree).tolist() == want.tolist()
    assert conditional(DraftTree.empty()).tolist() == []


# -- the native loops (ext/calib.pxi) against their Python references ------------------------------

def _random_tree(rng, n):
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, 6, n), np.array(parents, np.int32), np.ones(n))


def _trained(rng, with_band):
    """A Calibration (or its band at 0.7) with outcomes on many keys, greedy and band alike."""
    cal = Calibration(prior_weight=3.0)
    out = cal.band(0.7) if with_band else cal
    for c in (cal, out):
        for _ in range(300):
            key = (str(rng.choice(["pld", "auto"])), int(rng.integers(0, 6)), int(rng.integers(0, 4)),
                   int(rng.integers(0, 7)))
            c.observe(key, bool(rng.random() < 0.6))
    return out


def test_native_scoring_equals_the_python_loop_bit_for_bit_with_bands_and_grown_matches():
    from lookupdec.drafters.calibrate import lookup_prior

    rng = np.random.default_rng(3)
    for trial in range(200):
        cal = _trained(rng, with_band=trial % 2 == 1)
        n = int(rng.integers(1, 40))
        tree = _random_tree(rng, n)
        # Raws on and around the bucket edges, per-node match lengths across the match edges.
        raws = rng.choice([0.0, 0.15, 0.2, 0.35, 0.6, 0.85, 0.999, 1.0, float(rng.random())], n)
        lens = rng.integers(0, 40, n).tolist()
        s = NodeScorer("pld", cal, grow=trial % 3 != 0)
        assert s.prior is lookup_prior
        native = s.score(tree, raws, lens, source_id=1)
        scores, depth, keys = s._score_py(tree.parents.tolist(), raws.tolist(), lens)
        assert native.scores.tolist() == scores  # the same doubles, not merely close
        assert native.depth.tolist() == depth
        assert s._outcomes._waiting[-1].keys == keys


def test_a_scorer_with_its_own_prior_uses_that_prior():
    cal = Calibration()
    t = DraftTree.chain([5, 6])
    half = NodeScorer("x", cal, prior=lambda r, m, d: 0.5).score(t, np.ones(2), 3, source_id=1)
    tenth = NodeScorer("x", Calibration(), prior=lambda r, m, d: 0.1).score(t, np.ones(2), 3, source_id=1)
    assert half.scores.tolist() == [0.5, 0.25] and np.allclose(tenth.scores, [0.1, 0.01])


def test_native_merged_rates_equal_the_python_keys_and_rates():
    from lookupdec._native import calib_merged
    from tests.oracles.calibrate import merged_rates

    rng = np.random.default_rng(4)
    for trial in range(100):
        cal = _trained(rng, with_band=trial % 2 == 0)
        for _ in range(100):  # the merged keys' own outcomes
            cal.observe(("auto", int(rng.integers(0, 20)), int(rng.integers(0, 4)), int(rng.integers(0, 7))),
                        bool(rng.random() < 0.5))
        n = int(rng.integers(0, 30))
        scores = rng.choice([0.0, 0.05, 0.999, 1.0, 0.4999, float(rng.random())], n).tolist()
        agree = rng.integers(1, 6, n).tolist()
        depth = rng.integers(1, 20, n).tolist()
        rated, keys = calib_merged(cal.levels(), scores, agree, depth)
        want_rated, want_keys = merged_rates(cal, scores, agree, depth)
        assert keys == want_keys and rated == want_rated


def test_native_outcomes_decide_the_same_nodes_as_the_python_loop():
    from lookupdec.drafters.calibrate import Outcomes
    from tests.oracles.calibrate import learn_reference

    rng = np.random.default_rng(5)
    for trial in range(60):
        conditional = trial % 2 == 0
        fast, slow = Calibration(), Calibration()
        a, b = Outcomes(fast, conditional=conditional), Outcomes(slow, conditional=conditional)
        for step in range(30):
            n = int(rng.integers(0, 12))
            tree = _random_tree(rng, n) if n else None
            if tree is not None:
                depth = tree.depth.tolist()
                keys = [("s", int(rng.integers(0, 3)), 0, d) for d in depth]
                for o in (a, b):
                    o.add(tree.tokens.tolist(), tree.parents.tolist(), depth, keys)
            new = rng.integers(0, 6, int(rng.integers(1, 4))).tolist()  # tokens from the trees' small alphabet
            a.learn(new)
            b._seen.extend(new)
            b._waiting = learn_reference(slow, b._waiting, b._seen, conditional)[-b.horizon:]
            if not b._waiting:
                b._seen = []
            assert [w.at for w in a._waiting] == [w.at for w in b._waiting]
            assert [w.state for w in a._waiting] == [w.state for w in b._waiting]
        assert fast._fine == slow._fine and fast._coarse == slow._coarse
        assert sum(t for _, t in fast._fine.values()) > 0  # something was decided


def test_native_loops_refuse_what_they_would_read_out_of_bounds():
    """The native loops read some lists unchecked: a node at depth 0, or a rate entry that is not a
    ``[hits, trials]`` list, is refused with an error, never read past."""
    import pytest

    from lookupdec.drafters.calibrate import Outcomes

    out = Outcomes(Calibration())
    out.add([5], [-1], [0], [("s", 0, 0, 0)])
    with pytest.raises(ValueError, match="depth below 1"):
        out.learn([5])
    cal = Calibration()
    cal._fine[("pld", 5, 1, 0)] = (1.0, 2.0)  # a tuple where the rates keep lists
    with pytest.raises(TypeError):
        NodeScorer("pld", cal).score(DraftTree.chain([5]), np.array([1.0]), 2, source_id=1)
