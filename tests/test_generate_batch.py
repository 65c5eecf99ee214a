"""Decoder.generate_batch and the batch pricer (lookupdec/batch.py).

Oracles: each prompt decoded alone (``ar``), a brute-force search over every
ancestor-closed choice of nodes for the pricer, and the exact marginals of the
first tokens for sampling through a batch.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from lookupdec.batch import price_batch, step_together
from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder
from lookupdec.drafters.base import DraftRequest
from lookupdec.errors import ContextTooLongError
from lookupdec.sampling import SamplingParams
from lookupdec.sequence import StepPlan
from lookupdec.tree import DraftTree
from tests.conftest import TINY_VOCAB, tiny_loaded
from tests.test_sampling import TopTokensDrafter, _exact_marginals, assert_matches

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [40, 41, 42, 43, 44, 40, 41, 42] * 3, [9], "abcabcabc abc", [70, 71, 72, 73] * 6,
           [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]


def _flat(ms1=10.0, slope=0.05):
    """A memory-bound curve: a row costs little next to the weights' read."""
    return CostCurve((1, 64), (ms1, ms1 + 63 * slope), 0, (0.0, 0.0), "cpu", "flat")


# The fast forward's shared batch forward is CPU code; transformers' padded batch runs anywhere.
BACKENDS = [pytest.param("fast", marks=pytest.mark.cpu), "hf"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [4.0, 1.0])
@pytest.mark.parametrize("method", ["ar", "pld", "auto"])
def test_batched_greedy_equals_each_prompt_alone(scale, method, backend):
    """Every prompt's tokens through a batch of 3 (prompts joining as others finish) equal ``ar`` alone."""
    lm = tiny_loaded(1, scale=scale)
    dec = Decoder(lm, cost_curve=_flat(), draft_budget=16, hf_kernels=backend == "hf")
    assert dec.verifier.backend == backend
    order = []
    res = dec.generate_batch(PROMPTS, method=method, max_new_tokens=40, batch_size=3,
                             on_result=lambda i, r: order.append(i))
    assert sorted(order) == list(range(len(PROMPTS)))
    for k, (r, p) in enumerate(zip(res, PROMPTS)):
        alone = dec.generate(p, method="ar", max_new_tokens=40).token_ids
        assert r.token_ids == alone, (method, k)
        assert r.method == method and r.new_tokens == len(r.token_ids)
    if method != "ar":  # drafting really happened inside the batch
        assert sum(sum(r.accepted_by_source.values()) for r in res) > 0


def test_prediction_drafts_and_is_counted():
    """A predicted output equal to the answer is drafted from (source 'prediction'), output unchanged."""
    lm = tiny_loaded(2)
    dec = Decoder(lm, cost_curve=_flat(), draft_budget=24)
    prompt = [30, 31, 32, 33]
    ar = dec.generate(prompt, method="ar", max_new_tokens=40)
    pred = lm.tokenizer.decode(list(ar.token_ids))
    out = dec.generate(prompt, method="auto", max_new_tokens=40, prediction=pred)
    assert out.token_ids == ar.token_ids
    assert out.accepted_by_source.get("prediction", 0) > 0  # auto's other sources propose the same tokens too
    assert out.steps < ar.steps
    # llma drafts from the prediction alone: nearly every token comes from it.
    batch = dec.generate_batch([prompt, [5, 6, 7]], method="llma", max_new_tokens=40, predictions=[pred, "xyz"])
    assert batch[0].token_ids == ar.token_ids and batch[0].accepted_by_source.get("prediction", 0) > 25
    with pytest.raises(ValueError, match="does not use a prediction"):
        dec.generate(prompt, method="pld", prediction=pred)


def test_generate_batch_errors_name_the_prompt():
    dec = Decoder(tiny_loaded(3), cost_curve=_flat())
    with pytest.raises(ValueError, match="batch_size"):
        dec.generate_batch([[5]], batch_size=0)
    with pytest.raises(ValueError, match="one entry per prompt"):
        dec.generate_batch([[5], [6]], references=[["a"]])
    with pytest.raises(ValueError, match="prompt 1: .*context") as err:
        dec.generate_batch([[5], [6] * 300], method="ar", max_new_tokens=4)
    # Still the error it was, with its fields: only its message names the prompt.
    assert isinstance(err.value, ContextTooLongError) and err.value.prompt_tokens == 300, err.value
    assert dec.generate_batch([], method="ar") == []


def _plan(tree: DraftTree) -> StepPlan:
    return StepPlan(1, tree, None, None, 0, DraftRequest(64, 64), 0.0)


def _brute(trees, curve, margin, padded=False):
    """Best (tokens per ms) over every ancestor-closed choice of nodes, and the plain rate.
    ``padded``: ``B`` sequences of up to ``D`` rows (root and kept nodes) cost ``c(B * D)``."""
    b = len(trees)
    options = []
    for t in trees:
        ps = t.path_scores()
        subsets = []
        for mask in itertools.product([0, 1], repeat=len(t)):
            chosen = [i for i in range(len(t)) if mask[i]]
            if all(t.parents[i] < 0 or mask[t.parents[i]] for i in chosen):
                subsets.append((len(chosen), float(ps[chosen].sum()) if chosen else 0.0))
        options.append(subsets)
    best = 0.0
    for combo in itertools.product(*options):
        width = b * max(1 + c[0] for c in combo) if padded and b > 1 else b + sum(c[0] for c in combo)
        rate = (b + sum(c[1] for c in combo)) / curve.ms_at(width)
        best = max(best, rate)
    return best, b / curve.ms_at(b)


@pytest.mark.parametrize("padded", [False, True])
def test_price_batch_equals_brute_force_and_never_beats_plain_slower(padded):
    rng = np.random.default_rng(0)
    curves = [_flat(), CostCurve((1, 4, 8, 64), (10.0, 10.5, 14.0, 80.0), 0, (0.0,) * 4, "cpu", "knee"),
              CostCurve((1, 64), (1.0, 64.0), 0, (0.0, 0.0), "cpu", "compute-bound")]
    for trial in range(60):
        trees = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 5))
            parents = [int(rng.integers(-1, i)) for i in range(n)]
            trees.append(DraftTree(rng.integers(3, 100, n), np.array(parents, np.int32), rng.uniform(0.01, 1.0, n)))
        curve = curves[trial % 3]
        price = price_batch([_plan(t) for t in trees], curve, margin=0.02, padded=padded)
        best, plain = _brute(trees, curve, 0.02, padded)
        kept_rows = [1 + len(p.tree) for p in price.plans]
        assert price.width == (len(trees) * max(kept_rows) if padded and len(trees) > 1 else sum(kept_rows))
        rate = price.expected_tokens / price.ms
        assert rate >= plain - 1e-12  # never priced slower than the batch decoding plainly
        if best > plain * 1.02:
            assert rate == pytest.approx(best, rel=1e-9)
        else:
            assert price.width == len(trees)  # nothing pays: nothing drafted
        for p, t in zip(price.plans, trees):
            if len(p.tree) < len(t):
                assert p.kept is not None and len(p.kept) == len(p.tree)
                assert p.tree.tokens.tolist() == t.tokens[p.kept].tolist()


def test_padded_batches_keep_the_nodes_that_ride_free_below_the_widest_tree():
    """Padded (transformers' batch), a short tree's rows below the widest tree's cost nothing, so
    its weak nodes are kept; priced by rows (the fast forward) they are not worth their rows."""
    strong = DraftTree.chain([5, 6, 7, 8, 9, 10], scores=[0.95] * 6)
    weak = DraftTree.chain([11, 12], scores=[0.01, 0.5])
    curve = CostCurve((1, 16, 64), (10.0, 10.4, 64.0), 0, (0.0,) * 3, "cpu", "flat to 16")
    rows = price_batch([_plan(strong), _plan(weak)], curve)
    pads = price_batch([_plan(strong), _plan(weak)], curve, padded=True)
    assert len(rows.plans[0].tree) == 6 and len(rows.plans[1].tree) == 0 and rows.width == 8
    assert len(pads.plans[0].tree) == 6 and len(pads.plans[1].tree) == 2 and pads.width == 14
    steep = CostCurve((1, 64), (1.0, 64.0), 0, (0.0, 0.0), "cpu", "compute-bound")
    assert price_batch([_plan(strong), _plan(weak)], steep, padded=True).width == 2  # nothing pays


def test_speculation_shrinks_as_the_batch_grows():
    """The same confident drafts: kept in full alone, cut in a wide batch, dropped when rows cost their share."""
    tree = DraftTree.chain([5, 6, 7, 8, 9, 10], scores=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    knee = CostCurve((1, 8, 16, 64), (10.0, 10.4, 16.0, 64.0), 0, (0.0,) * 4, "cpu", "knee")
    kept = []
    for b in (1, 2, 4, 8, 16):
        price = price_batch([_plan(tree)] * b, knee)
        kept.append((price.width - b) / b)  # nodes per sequence
    assert kept[0] == 6 and kept[-1] == 0
    assert all(x > y for x, y in zip(kept, kept[1:])), kept
    compute_bound = CostCurve((1, 64), (1.0, 64.0), 0, (0.0, 0.0), "cpu", "linear")
    assert price_batch([_plan(tree)] * 4, compute_bound).width == 4


def test_windows_dropped_and_sampled_trees_kept_whole_in_a_batch():
    from lookupdec.drafters.base import ExtraRows

    x = ExtraRows(np.array([5, 6]), np.array([1, 2]), np.tril(np.ones((2, 2), bool)))
    sampled = DraftTree(np.array([5, 6]), np.array([-1, 0], np.int32), np.array([0.01, 0.01]),
                        q=np.full((2, TINY_VOCAB), 1.0 / TINY_VOCAB))
    plan = StepPlan(1, DraftTree.chain([7]), None, x, 0, DraftRequest(8, 8), 0.0)
    price = price_batch([plan, _plan(sampled)], _flat())
    assert price.plans[0].extra is None
    assert len(price.plans[1].tree) == 2  # never cut, however low its scores
    assert price_batch([plan], _flat()).plans[0].extra is x  # alone, its drafter already priced it


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_through_a_batch_keeps_the_target_distribution(backend):
    """The first three tokens' marginals of one prompt sampled inside batches of 6 mixed sequences
    (trees three deep, every verify forward shared) equal the exact marginals."""
    lm = tiny_loaded(7)
    dec = Decoder(lm, hf_kernels=backend == "hf")
    assert dec.verifier.backend == backend
    params = dict(temperature=1.0, top_k=4, top_p=0.95)
    prompt = [10, 11, 12]
    exact = _exact_marginals(lm, prompt, SamplingParams(1.0, 0.95, 4), 3)
    top = np.argsort(-exact[1])[:3].tolist()
    seqs_tree = [[y, z, w] for y in top for z in top[:2] for w in top[:2]]
    counts = [np.zeros(TINY_VOCAB) for _ in range(3)]
    accepted = 0
    draws = 1500
    for start in range(0, draws, 5):
        seqs = [dec.new_sequence(prompt, max_new_tokens=4, seed=s, drafter=TopTokensDrafter(seqs_tree), **params)
                for s in range(start, start + 5)]
        seqs.append(dec.new_sequence([50, 51, 52, 53, 54], max_new_tokens=6, seed=start, method="pld", **params))
        for s in seqs:
            s.prefill()
        while any(not s.done for s in seqs):
            step_together(dec.verifier, [s for s in seqs if not s.done], None)
        for s in seqs[:5]:
            out = s.result()
            for k in range(3):
                counts[k][out.token_ids[k]] += 1
            accepted += out.step_stats[1].accepted
    assert accepted > 150  # speculation was really exercised inside the batches
    for k in range(3):
        assert_matches(counts[k], exact[k])


def test_batch_gate_pauses_after_idle_steps_doubles_and_resets():
    from lookupdec.batch import BatchGate

    g = BatchGate()
    for _ in range(BatchGate.IDLE_STEPS - 1):
        assert g.budget(3, 16) == 16
        g.record(3, drafted=True, kept=False)
    assert g.budget(3, 16) == 16
    g.record(3, drafted=True, kept=False)  # the IDLE_STEPS-th in a row: a pause of FIRST_PAUSE starts
    paused = [g.budget(3, 16) for _ in range(BatchGate.FIRST_PAUSE)]
    assert paused == [0] * BatchGate.FIRST_PAUSE
    for _ in range(BatchGate.FIRST_PAUSE):
        g.record(3, drafted=False, kept=False)  # paused steps teach nothing
    assert g.budget(3, 16) == 16  # the re-try
    g.record(3, drafted=True, kept=False)  # it kept nothing either: twice the pause
    assert [g.budget(3, 16) for _ in range(2 * BatchGate.FIRST_PAUSE)] == [0] * (2 * BatchGate.FIRST_PAUSE)
    assert g.budget(3, 16) == 16
    g.record(3, drafted=True, kept=True)  # a re-try that keeps a draft starts over
    assert g.pause == BatchGate.FIRST_PAUSE and g.idle == 0 and g.budget(3, 16) == 16
    assert g.budget(1, None) is None  # one sequence is never gated
    g.skip = 5
    assert g.budget(1, 7) == 7 and g.skip == 5


def test_batch_gate_pauses_kept_drafts_that_deliver_fewer_tokens_per_second_than_plain_steps():
    """Kept drafts are judged by what they deliver: every JUDGE_STEPS drafting steps their tokens/s is
    compared with plain steps of the same batch size (probed first when there are none)."""
    from lookupdec.batch import BatchGate

    g = BatchGate()
    J, P = BatchGate.JUDGE_STEPS, BatchGate.PROBE

    def drafting(size, tokens, seconds, steps=J):
        for _ in range(steps):
            assert g.budget(size, 16) == 16
            g.record(size, True, True, tokens, seconds)

    def plain(size, tokens, seconds, steps):
        for _ in range(steps):
            assert g.budget(size, 16) == 0
            g.record(size, False, False, tokens, seconds)

    drafting(3, 4, 0.4)                     # 10 tok/s, nothing to compare with yet: probe plain steps
    plain(3, 3, 0.2, P)                     # 15 tok/s
    assert g.budget(3, 16) == 16
    drafting(3, 4, 0.4)                     # drafting slower than plain: a pause of FIRST_PAUSE
    plain(3, 3, 0.2, BatchGate.FIRST_PAUSE)
    assert g.pause == 2 * BatchGate.FIRST_PAUSE
    drafting(3, 6, 0.3)                     # 20 tok/s: it pays, drafting goes on, the pause starts over
    assert g.skip == 0 and g.pause == BatchGate.FIRST_PAUSE
    drafting(3, 6, 0.3, J - 1)
    drafting(4, 1, 0.4, J - 1)              # another size starts its own judgement: no verdict yet
    assert g.skip == 0
    drafting(4, 1, 0.4, 1)                  # and it has no plain steps of size 4: probe them
    assert g.skip == P


def test_batch_gate_judges_each_batch_size_on_its_own_tally_as_sizes_alternate():
    """A server's batch changes size as requests come and go: each size keeps its own tally of
    drafting steps, so alternating sizes still reach a verdict, each against its own plain steps."""
    from lookupdec.batch import BatchGate

    g = BatchGate()
    J, P = BatchGate.JUDGE_STEPS, BatchGate.PROBE
    for size in (2, 3):
        for _ in range(P):
            g.record(size, False, False, 2, 0.1)   # plain steps: 20 tokens/s at either size
    for _ in range(J - 1):
        g.record(2, True, True, 1, 0.1)            # 10 tokens/s: below plain
        g.record(3, True, True, 4, 0.1)            # 40 tokens/s: above
    assert g.skip == 0                             # J - 1 steps of each size: no verdict yet
    g.record(3, True, True, 4, 0.1)
    assert g.skip == 0 and g.pause == BatchGate.FIRST_PAUSE  # size 3's verdict: drafting pays
    g.record(2, True, True, 1, 0.1)
    assert g.skip == BatchGate.FIRST_PAUSE         # size 2's verdict: it does not, a pause


def test_a_single_sequence_gate_thins_idle_steps_more_while_re_tries_keep_nothing():
    """``BatchGate(min_size=1)``: after ``IDLE_STEPS`` steps in a row that keep nothing, each re-try is
    followed by ``LONE_IDLE_SKIP`` plain steps, doubling while the re-tries keep nothing up to
    ``LONE_MAX_SKIP``; a kept draft makes every step draft again; the thinned steps are plain."""
    from lookupdec.batch import BatchGate

    g = BatchGate(min_size=1, max_pause=16)
    I, S, M = BatchGate.IDLE_STEPS, BatchGate.LONE_IDLE_SKIP, BatchGate.LONE_MAX_SKIP
    assert S < M
    skips = [S, 2 * S, 4 * S, 8 * S, 16 * S, 32 * S]
    skips = [min(k, M) for k in skips]
    assert skips[-1] == M and skips[-2] == M  # the schedule reaches the cap and stays there
    budgets = []
    for _ in range(I + sum(skips) + len(skips)):
        b = g.budget(1, 16)
        budgets.append(b)
        g.record(1, b != 0, False, 1, 0.01)   # nothing kept (or a thinned step: plain)
    assert budgets == [16] * I + [b for k in skips for b in [0] * k + [16]]
    assert [g.budget(1, 16) for _ in range(M + 1)] == [0] * M + [16]  # the last re-try's plain steps
    g.record(1, True, True, 1, 0.01)          # that re-try kept a draft: every step drafts again
    assert [g.budget(1, 16) for _ in range(I + M)] == [16] * (I + M)
    for _ in range(I):
        g.record(1, True, False, 1, 0.01)     # idle again: the thinning starts over from S
    assert [g.budget(1, 16) for _ in range(S + 1)] == [0] * S + [16]
    assert 1 in g._plain                      # the thinned steps were timed as plain ones


def test_a_single_sequence_gate_judges_kept_drafts_and_caps_its_pause():
    """``BatchGate(min_size=1)`` (Decoder.generate's, for auto): a lone sequence's drafts that deliver
    fewer tokens/s than its plain steps are paused, at most ``max_pause`` steps."""
    from lookupdec.batch import BatchGate

    g = BatchGate(min_size=1, max_pause=16)
    J, P = BatchGate.JUDGE_STEPS, BatchGate.PROBE
    for _ in range(J):
        g.record(1, True, True, 1, 0.012)   # kept drafts, 83 tok/s; no plain steps yet: probe them
    assert [g.budget(1, 16) for _ in range(P)] == [0] * P
    for _ in range(P):
        g.record(1, False, False, 1, 0.01)  # plain: 100 tok/s
    pauses = []
    for _ in range(4):
        assert g.budget(1, 16) == 16
        for _ in range(J):
            g.record(1, True, True, 1, 0.012)
        pauses.append(g.skip)
        for _ in range(g.skip):
            assert g.budget(1, 16) == 0
            g.record(1, False, False, 1, 0.01)
    assert pauses == [BatchGate.FIRST_PAUSE, 16, 16, 16]
    for _ in range(J):
        g.record(1, True, True, 2, 0.012)   # drafts that pay: no pause, and it starts over
    assert g.skip == 0 and g.pause == BatchGate.FIRST_PAUSE and g.budget(1, 16) == 16


def test_decoder_generate_gates_auto_per_temperature_band_and_stays_exact():
    """Decoder.generate keeps one single-sequence gate per (auto, temperature band) in its drafting
    state and asks it for every step's budget; a paused step is ar's: the output is unchanged."""
    dec = Decoder(tiny_loaded(1), cost_curve=_flat(), draft_budget=16)
    want = dec.generate(PROMPTS[0], method="ar", max_new_tokens=40).token_ids
    gate = dec.state.gate("auto", 0.0)
    gate.skip = 10  # a pause in progress: its steps plan with budget 0
    got = dec.generate(PROMPTS[0], method="auto", max_new_tokens=40)
    assert got.token_ids == want and got.steps > 10
    assert dec.state.gate("auto", 0.0) is gate and 1 in gate._plain  # the paused steps were timed as plain ones
    assert dec.state.gate("auto", 1.0) is not gate and dec.state.gate("pld", 0.0) is not gate


class _CountingDrafter:
    """Proposes the true continuation (first ``depth`` tokens); counts the proposals."""

    name = "counting"
    topk = 0

    def __init__(self, answer, depth=4):
        self.answer, self.depth, self.calls, self.pos = list(answer), depth, 0, 0

    def begin(self, prompt_ids):
        self.pos = 0

    def propose(self, request):
        self.calls += 1
        return DraftTree.chain(self.answer[self.pos + 1:self.pos + 1 + min(self.depth, request.budget)])

    def commit(self, outcome):
        self.pos += len(outcome.new_tokens)

    def window(self, request):
        return None

    def window_rows(self):
        return 0


def test_a_batch_where_no_draft_pays_stops_drafting_and_still_equals_ar():
    """Under a compute-bound curve (every row costs as much as the first) a batch keeps no draft: after
    ``IDLE_STEPS`` such steps the gate stops calling the drafters, re-trying now and then; outputs stay ar's."""
    from lookupdec.batch import BatchGate

    lm = tiny_loaded(1)
    steep = CostCurve((1, 64), (10.0, 640.0), 0, (0.0, 0.0), "cpu", "compute-bound")
    dec = Decoder(lm, cost_curve=steep, draft_budget=8)
    prompts = [[5, 6, 7, 8], [40, 41, 42], [9, 10, 11, 12, 13]]
    alone = [dec.generate(p, method="ar", max_new_tokens=40).token_ids for p in prompts]
    drafters = [_CountingDrafter(a) for a in alone]
    seqs = [dec.new_sequence(p, max_new_tokens=40, drafter=d) for p, d in zip(prompts, drafters)]
    for s in seqs:
        s.prefill()
    gate, steps = BatchGate(), 0
    while any(not s.done for s in seqs):
        step_together(dec.verifier, [s for s in seqs if not s.done], steep, gate=gate)
        steps += 1
    assert [s.result().token_ids for s in seqs] == alone
    calls = max(d.calls for d in drafters)
    assert steps >= 30 and calls < steps / 2, (calls, steps)  # most steps ran no drafter
    assert calls >= BatchGate.IDLE_STEPS + 1  # it did try, and re-tried


def test_a_lone_sequence_in_step_together_is_judged_by_the_lone_gate_and_still_equals_ar():
    """``step_together(..., lone_gate=...)`` (the server's engine for a lone ``auto`` request): the batch gate
    leaves one sequence alone, the lone gate pauses its drafting (no drafter call) and records its steps;
    the output stays ar's."""
    from lookupdec.batch import BatchGate

    dec = Decoder(tiny_loaded(1), cost_curve=_flat(), draft_budget=8)
    prompt = [5, 6, 7, 8]
    alone = dec.generate(prompt, method="ar", max_new_tokens=30).token_ids
    batch_gate, lone = BatchGate(), BatchGate(min_size=1)
    drafter = _CountingDrafter(alone)
    seq = dec.new_sequence(prompt, max_new_tokens=30, drafter=drafter)
    seq.prefill()
    lone.skip = 6  # a pause in progress
    widths = []
    while not seq.done:
        widths.append(step_together(dec.verifier, [seq], _flat(), gate=batch_gate, lone_gate=lone).width)
    assert seq.result().token_ids == alone
    assert widths[:6] == [1] * 6 and max(widths[6:]) > 1  # paused, then drafting again
    assert 0 < drafter.calls <= len(widths) - 6  # none while paused (later pauses are timing-dependent)
    assert 1 in lone._plain and not batch_gate._plain  # the lone gate timed its plain steps; the batch gate saw none


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_steps_width_counts_the_rows_its_forward_ran(backend):
    """Two sequences drafting 5 and 1 nodes: the fast forward runs 6 + 2 rows, transformers' padded
    batch 2 x 6 (each sequence the widest one's rows)."""
    lm = tiny_loaded(8)
    dec = Decoder(lm, hf_kernels=backend == "hf")
    assert dec.verifier.backend == backend
    seqs = [dec.new_sequence([10, 11, 12], max_new_tokens=8, drafter=TopTokensDrafter([[20, 21, 22, 23, 24]])),
            dec.new_sequence([30, 31], max_new_tokens=8, drafter=TopTokensDrafter([[40]]))]
    for s in seqs:
        s.prefill()
    step = step_together(dec.verifier, seqs, None)  # no curve: every node kept
    assert step.drafted == 6
    assert step.width == (12 if backend == "hf" else 8)
