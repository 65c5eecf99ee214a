"""benchmarks/curve_choices.py: auto's tree follows the cost curve; the LogitSpec source drafts what its rule says."""
import sys

import numpy as np

from lookupdec.drafters.base import DraftRequest, StepOutcome
from lookupdec.drafters.calibrate import Calibration
from tests.conftest import load_benchmark

cc = load_benchmark("curve_choices")
sim = sys.modules["simulate"]  # as curve_choices imported it


def _logitspec_oracle(seq, cands, k, depth):
    """Every occurrence (most recent first, one per candidate) of (root, c) in seq, continued: plain scans."""
    root = seq[-1]
    out = []
    for c, _ in cands[: k + 1]:
        if c == root:
            continue
        for i in range(len(seq) - 1, 0, -1):
            if seq[i - 1] == root and seq[i] == c:
                out.append([c] + seq[i + 1: i + depth])
                break
    return out


def test_logitspec_source_drafts_the_continuations_of_root_and_each_candidate():
    rng = np.random.default_rng(0)
    for _ in range(50):
        prompt = rng.integers(0, 6, int(rng.integers(2, 40))).tolist()
        new = rng.integers(0, 6, int(rng.integers(1, 4))).tolist()
        ids = rng.permutation(6)[:4]
        s = cc.LogitSpecSource(Calibration(), candidates=3, depth=5)
        s.begin(prompt)
        s.commit(StepOutcome((), tuple(new), row_tokens=np.array([new[-1]]), topk_ids=ids[None],
                             topk_probs=np.full((1, 4), 0.2, np.float32)))
        seq = prompt + new
        want = _logitspec_oracle(seq, list(zip(ids.tolist(), [0.2] * 4)), 3, 5)
        tree = s.propose(DraftRequest(64, 64))
        got = sorted(tree.path_tokens(int(i)) for i in tree.leaves())
        # The trie merges chains that share a prefix: compare the set of maximal chains.
        maximal = sorted(w for w in want if not any(o != w and o[:len(w)] == w for o in want))
        assert got == sorted({tuple(w): w for w in maximal}.values())


def _records():
    """Repetitive outputs (lookup drafts pay) with recorded top-k."""
    recs = []
    rng = np.random.default_rng(1)
    for q in range(4):
        phrase = rng.integers(10, 60, 7).tolist()
        out = (phrase * 12)[:80]
        ids = np.array([[t, 99] for t in out])
        probs = np.tile(np.array([0.8, 0.1], np.float32), (len(out), 1))
        recs.append(sim.Record(q, "qa", 0, tuple(phrase + [1, 2]), tuple(out), (), ids, probs))
    return recs


def test_auto_verifies_fewer_nodes_under_a_steeper_curve():
    recs = _records()
    flat = sim.curve_from_points(((1, 30.0), (64, 32.0)))
    steep = sim.curve_from_points(((1, 30.0), (2, 45.0), (64, 1000.0)))
    res_flat = sim.simulate(cc.auto_factory(flat, False), recs, cost=flat)
    res_steep = sim.simulate(cc.auto_factory(steep, False), recs, cost=steep)
    assert res_steep.overall.mean_draft < res_flat.overall.mean_draft
    assert res_flat.overall.tau > 1.5  # the repetitive outputs were really drafted


def test_the_three_measured_curves_are_named():
    for name in ("xeon", "amd-avx512", "amd-avx2-demo"):
        assert sim.named_curve(name).ms_at(1) > 0
