"""Every source pays its own way (drafters/ledger.py), temperature bands, deferred top-k."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder
from lookupdec.drafters.auto import AutoDrafter, context_source
from lookupdec.drafters.base import DraftRequest, Drafter, ExtraRows, StepOutcome
from lookupdec.drafters.calibrate import Calibration, temperature_band
from lookupdec.drafters.ledger import SourceLedger
from lookupdec.index import build_index_from_tokens
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier, greedy_accept
from tests.conftest import FLAT, TINY_VOCAB, tiny_loaded, tiny_model

NAMES = ["good", "useless"]


def test_a_source_that_does_not_pay_is_switched_off_and_retried_at_a_bounded_cost():
    led = SourceLedger(NAMES, min_steps=8, probe_steps=4)
    on_steps = 0
    for _ in range(3000):
        drafting = led.drafting(NAMES)
        on_steps += drafting[1]
        # "good": one marginal token per step for 1 ms; "useless": nothing for 3 ms a step.
        led.record(30.0, 2, NAMES, [1.0, 0.0], [1.0 if drafting[0] else 0.0, 3.0 if drafting[1] else 0.0])
    good, useless = led.account("good"), led.account("useless")
    assert good.on and good.switches == 0
    assert not useless.on and useless.switches == 1
    assert useless.probes >= 2  # re-tried, more than once
    # Re-trying cost at most 1% of the time, plus one probe.
    assert led.probe_spent_ms <= 0.01 * led.total_ms + 4 * 3.0
    assert on_steps == 8 + 4 * useless.probes - useless.probe_left  # the last re-try may not have run yet


def test_a_source_that_starts_paying_again_is_switched_back_on_by_a_retry():
    led = SourceLedger(NAMES, min_steps=8, probe_steps=4, probe_share=0.05)
    useful_later = False
    for step in range(2000):
        drafting = led.drafting(NAMES)
        if step == 300:
            assert not led.account("useless").on
            useful_later = True
        u = 2.0 if (useful_later and drafting[1]) else 0.0
        led.record(30.0, 2 + u, NAMES, [1.0, u], [1.0, 1.0 if drafting[1] else 0.0])
    assert led.account("useless").on and led.account("useless").switches == 1


def test_of_two_sources_proposing_the_same_tokens_one_stays_on():
    """Neither's tokens are its own while both draft; once one is off, the other's are."""
    led = SourceLedger(["a", "b"], min_steps=8, probe_steps=4)
    for _ in range(2000):
        on = led.drafting(["a", "b"])
        both, any_on = on[0] and on[1], on[0] or on[1]
        tokens = 2.0 if any_on else 0.0  # each step they bring 2 shared tokens
        unique = [0.0 if both else tokens * on[0], 0.0 if both else tokens * on[1]]
        led.record(30.0, 1 + tokens, ["a", "b"], unique, [1.0 * on[0], 1.0 * on[1]])
    ons = [led.account("a").on, led.account("b").on]
    assert sum(ons) == 1


def test_of_two_sources_proposing_the_same_tokens_the_dearer_one_is_switched_off():
    """Listed first or not, the source that costs more for the same shared tokens is the one off."""
    for names in (["cheap", "dear"], ["dear", "cheap"]):
        led = SourceLedger(names, min_steps=8, probe_steps=4)
        ms = {"cheap": 0.5, "dear": 3.0}
        for _ in range(500):
            on = led.drafting(names)
            both, any_on = all(on), any(on)
            tokens = 2.0 if any_on else 0.0
            unique = [0.0 if both else tokens * o for o in on]
            led.record(30.0, 1 + tokens, names, unique, [ms[n] * o for n, o in zip(names, on)])
        assert led.account("cheap").on and led.account("cheap").switches == 0, names
        assert not led.account("dear").on, names


def test_a_retry_that_brings_no_token_does_not_switch_a_source_back_on():
    """Not even one whose re-try rows were priced below the "too cheap to switch off" share."""
    led = SourceLedger(NAMES, min_steps=8, probe_steps=4, probe_share=0.05)
    for _ in range(2000):
        drafting = led.drafting(NAMES)
        probing = led.account("useless").probe_left > 0
        # 3 ms a step while on, but priced at almost nothing while being re-tried; never a token.
        cost = (0.01 if probing else 3.0) if drafting[1] else 0.0
        led.record(30.0, 2, NAMES, [1.0, 0.0], [1.0, cost])
    useless = led.account("useless")
    assert useless.probes >= 2 and useless.switches == 1 and not useless.on


def test_accounts_are_by_name_and_new_names_start_on():
    led = SourceLedger()
    assert led.drafting(["a", "b"]) == [True, True]
    led.record(10.0, 1, ["a"], [0.0], [1.0])
    assert [a.name for a in led.accounts] == ["a", "b"]


class _Useless:
    """Runs a window of 6 extra rows every step (as Lookahead does) and proposes nodes that never match."""

    name = "history"  # any source name: auto accounts by name

    def __init__(self):
        self.windows = 0

    def begin(self, prompt_ids):
        pass

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree.empty()

    def window_rows(self) -> int:
        return 6

    def window(self, request: DraftRequest) -> ExtraRows:
        self.windows += 1
        return ExtraRows(np.full(6, TINY_VOCAB - 1), np.arange(1, 7), np.tril(np.ones((6, 6), bool)))

    def commit(self, outcome: StepOutcome):
        pass


# Each row costs a tenth of a plain step: a window of 6 rows costs 60% more per step and brings nothing.
SLOPED = CostCurve((1, 128), (10.0, 137.0), 0, (0.0, 0.0), "test", "sloped")


def test_auto_switches_a_useless_source_off_retries_it_and_stays_exact():
    lm = tiny_loaded(0)
    dec = Decoder(lm, cost_curve=SLOPED)
    prompt = dec.encode("the cat sat on the mat; the cat sat on the mat; the cat", chat_template=False)
    ref = dec.generate(prompt, method="ar", max_new_tokens=160)
    useless = _Useless()
    # A large re-try share (20%) so that re-tries happen within one short generation.
    ledger = SourceLedger(min_steps=8, probe_steps=2, probe_share=0.2)
    auto = AutoDrafter(sources=[context_source(dec.calibration), useless], cost=SLOPED, ledger=ledger)
    out = dec.generate(prompt, drafter=auto, max_new_tokens=160)
    assert out.token_ids == ref.token_ids
    acct = ledger.account("history")
    assert acct.switches == 1 and acct.probes >= 1 and not acct.on
    assert 8 <= useless.windows <= 8 + 2 * acct.probes < out.steps - 1  # its window stopped running
    assert ledger.account("pld").on


class _Chain(Drafter):
    """Proposes one fixed chain, sure of it; with ``rows`` window rows beside the tree each step."""

    def __init__(self, name: str, tokens: list[int], rows: int = 0):
        self.name, self.tokens, self.rows = name, tokens, rows

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree.chain(self.tokens, [0.99] * len(self.tokens))

    def window_rows(self) -> int:
        return self.rows

    def window(self, request: DraftRequest) -> ExtraRows | None:
        m = self.rows
        return ExtraRows(np.full(m, 3), np.arange(1, m + 1), np.tril(np.ones((m, m), bool))) if m else None


class _Spy(SourceLedger):
    def __init__(self):
        super().__init__()
        self.calls = []

    def record(self, step_ms, tokens, names, unique_tokens, marginal_ms):
        self.calls.append((list(names), list(unique_tokens), list(marginal_ms)))
        super().record(step_ms, tokens, names, unique_tokens, marginal_ms)


@pytest.fixture
def still_clock(monkeypatch):
    """Drafting timed on a clock that never moves: a source's marginal time is then its rows alone,
    whatever else the machine is doing (on the wall clock a loaded CI machine once took 1.4 ms to
    draft three tokens)."""
    import types

    import lookupdec.drafters.auto as auto_module

    monkeypatch.setattr(auto_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))


def test_tokens_several_sources_proposed_are_credited_to_the_cheapest_of_them(still_clock):
    """The dear source (a window of 6 rows), listed first, shares three accepted tokens with the cheap
    one and brings one of its own: the shared three are the cheap one's, only the fourth the dear one's,
    and the dear one pays for its window and its own row only."""
    spy = _Spy()
    dear, cheap = _Chain("dear", [5, 6, 7, 8], rows=6), _Chain("cheap", [5, 6, 7])
    auto = AutoDrafter(sources=[dear, cheap], cost=SLOPED, ledger=spy)
    auto.begin([1, 2, 3])
    req = DraftRequest(budget=16, max_depth=8)
    tree = auto.propose(req)
    assert tree.tokens.tolist() == [5, 6, 7, 8]
    auto.window(req)
    auto.commit(StepOutcome((0, 1, 2, 3), (5, 6, 7, 8, 9), tree, np.arange(4)))
    (names, unique, marginal), = spy.calls
    assert names == ["dear", "cheap"] and unique == [1.0, 3.0]
    row = (137.0 - 10.0) / 127  # ms per row on SLOPED
    # cheap: three rows; dear: six window rows and one tree row on top.
    assert marginal[1] == pytest.approx(3 * row)
    assert marginal[0] == pytest.approx(7 * row)


def test_the_deferred_topk_time_is_charged_to_the_sources_that_asked_for_it(still_clock):
    spy = _Spy()
    asks = _Chain("asks", [5])
    asks.topk = 8
    auto = AutoDrafter(sources=[_Chain("plain", [5]), asks], cost=SLOPED, ledger=spy)
    auto.begin([1, 2, 3])
    tree = auto.propose(DraftRequest(budget=16, max_depth=8))
    assert auto.topk == 8
    auto.commit(StepOutcome((0,), (5, 9), tree, np.arange(len(tree)), topk_ms=40.0))
    (_, _, marginal), = spy.calls
    row = (137.0 - 10.0) / 127  # ms per row on SLOPED
    # The one shared row is plain's (the asker is dearer by its top-k); the asker pays the 40 ms alone.
    assert marginal == pytest.approx([row, 40.0])


@pytest.mark.parametrize("budget, window_runs", [(5, False), (12, False), (16, True), (20, True)])
def test_the_window_counts_inside_the_draft_budget(budget, window_runs):
    """The tree is chosen first; the window runs only where it fits beside it in the budget."""
    chain, windowed = _Chain("pld", list(range(5, 15))), _Chain("lookahead", [], rows=6)
    auto = AutoDrafter(sources=[chain, windowed], cost=FLAT, gate=False)
    auto.begin([1, 2, 3])
    req = DraftRequest(budget=budget, max_depth=16)
    tree = auto.propose(req)
    window = auto.window(req)
    rows = 0 if window is None else len(window)
    assert (rows == 6) == window_runs
    assert len(tree) + rows <= budget
    assert len(tree) == min(10, budget)  # under a flat curve the whole chain that fits is drafted


def test_gating_is_off_for_a_single_source_method():
    assert AutoDrafter(sources=[context_source(None)], cost=FLAT).ledger is None


def test_the_decoder_keeps_one_ledger_per_method_and_band_across_requests(tmp_path):
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    assert dec._ledger("auto", 0.0) is dec._ledger("auto", 0.0)
    assert dec._ledger("auto", 0.0) is not dec._ledger("auto", 1.0)
    assert dec._ledger("auto", 0.9) is dec._ledger("auto", 1.0)
    dec.generate("ab ab ab ab", method="auto", max_new_tokens=24)
    assert any(a.steps > 0 for a in dec._ledger("auto", 0.0).accounts)


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_with_every_source_and_gating_equals_ar_on_unscaled_weights(seed, tmp_path):
    """Every source at once (context, references, prediction, datastore, history, recycle, lookahead,
    the small LM cut from the target) on near-tie weights: greedy output equals ar's."""
    lm = tiny_loaded(seed, scale=1.0)
    rng = np.random.default_rng(seed)
    build_index_from_tokens([rng.integers(3, 100, 300).tolist() for _ in range(10)], tmp_path / "i",
                            tokenizer=lm.tokenizer)
    dec = Decoder(lm, indexes=str(tmp_path / "i"), cost_curve=FLAT, history=tmp_path / "h", draft_layers=1)
    for plen in (3, 40, 12):
        prompt = rng.integers(3, 100, plen).tolist()
        ref = dec.generate(prompt, method="ar", max_new_tokens=64, remember=True)
        text = lm.tokenizer.decode(list(ref.token_ids[:20]), skip_special_tokens=True) or "x"
        out = dec.generate(prompt, method="auto", max_new_tokens=64, references=[text, "abc abc"], prediction=text)
        assert out.token_ids == ref.token_ids
        assert sum(s.draft_size for s in out.step_stats) > 0


def test_temperature_bands_learn_separately():
    cal = Calibration()
    key = ("pld", 4, 2, 0)
    hot = cal.band(1.0)
    assert temperature_band(0.0) == 0 and hot is cal.band(0.9) and hot is not cal.band(0.3)
    before = cal.rate(key, 0.6)
    for _ in range(60):
        hot.observe(key, False)
    assert cal.rate(key, 0.6) == before  # greedy rates untouched by sampled misses
    assert hot.rate(key, 0.6) < 0.1
    for _ in range(60):
        cal.observe(key, True)
    assert cal.rate(key, 0.6) > 0.9
    assert hot.rate(key, 0.6) < 0.15  # the band's own evidence outweighs greedy's
    # A band with no evidence starts from the greedy rate, discounted.
    mild = cal.band(0.3)
    assert 0.5 < mild.rate(key, 0.6) < cal.rate(key, 0.6)


def test_decoder_hands_each_request_its_temperature_band():
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    seq = dec.new_sequence("ab ab", method="auto", max_new_tokens=4, temperature=1.0, seed=0)
    assert seq.drafter.calibration is dec.calibration.band(1.0)
    seq = dec.new_sequence("ab ab", method="auto", max_new_tokens=4)
    assert seq.drafter.calibration is dec.calibration


@pytest.mark.parametrize("scale", [4.0, 1.0])
@pytest.mark.cpu  # the fast forward's lazy lm_head rows (CPU only)
def test_deferred_topk_equals_eager_topk_on_the_rows_the_walk_computed(scale):
    model = tiny_model(5, scale=scale)
    v = TreeVerifier(model, fast=True)
    assert v.backend == "fast"
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, TINY_VOCAB, 10).tolist()
    for trial in range(6):
        cache = v.new_cache(64)
        v.prefill(cache, prompt)
        seqs = [rng.integers(3, TINY_VOCAB, int(rng.integers(1, 5))).tolist() for _ in range(4)]
        tree = DraftTree.from_sequences(seqs)
        res = v.forward(cache, len(prompt), 7, tree, topk=5)
        greedy_accept(res.tree, lambda r: int(res.row(r).argmax()))
        rows, ids, probs = res.topk_of()
        computed = res.rows.computed_rows()
        assert rows.tolist() == [([7] + tree.tokens.tolist())[r] for r in computed]
        # Eager: every row's logits in one product, as the verifier computed them before.
        full = torch.stack([res.row(r) for r in range(1 + len(tree))])
        vals, eager_ids = torch.topk(full[computed], 5, dim=-1)
        eager_probs = torch.softmax(full[computed], -1).gather(1, eager_ids).numpy()
        np.testing.assert_allclose(probs, eager_probs, rtol=1e-5, atol=1e-7)
        same = ids == eager_ids.numpy()
        # Ids agree except where two candidates' probabilities tie to float rounding.
        assert same.all() or np.allclose(probs[~same], eager_probs[~same], atol=1e-6)
        assert len(computed) <= 1 + len(tree)


@pytest.mark.cpu  # the fast forward's lazy lm_head rows (CPU only)
def test_deferred_topk_skips_rows_the_walk_never_visits():
    model = tiny_model(5)
    v = TreeVerifier(model, fast=True)
    prompt = [5, 6, 7, 8]
    cache = v.new_cache(64)
    first = int(v.prefill(cache, prompt).argmax())
    # A wrong first token under the root, with a subtree the walk never enters.
    wrong = (first + 1) % TINY_VOCAB
    tree = DraftTree.from_sequences([[first, 9], [wrong, 10, 11, 12, 13], [wrong, 14, 15]])
    res = v.forward(cache, len(prompt), prompt[-1], tree, topk=4)
    greedy_accept(res.tree, lambda r: int(res.row(r).argmax()))
    rows = res.topk_of()[0]
    assert len(rows) < 1 + len(tree)


@pytest.mark.parametrize("extra", [1, 3, 6, 12])
def test_auto_prices_window_rows_as_the_per_width_formula(extra):
    """The tabulated prices of a step carrying ``extra`` window rows equal c(1 + k + extra) plus the
    window rows' lm_head beyond what the curve includes, width by width (the slow oracle)."""
    from lookupdec.costs import MEASURED_LOGIT_ROWS

    curve = CostCurve((1, 4, 16, 64), (20.0, 22.0, 40.0, 80.0), 0, (0.0,) * 4, "cpu", "k",
                      head_ms=(1.0, 2.5, 8.0, 30.0))
    auto = AutoDrafter(cost=curve)
    auto.begin([1, 2, 3])
    got = auto._costs(40, extra)
    for w in range(1, 41):
        want = curve.ms_at(w + extra) + curve.logits_extra_ms(w + extra, min(w, MEASURED_LOGIT_ROWS) + extra)
        assert got[w] == pytest.approx(want, rel=1e-12), w


class _Late(_Chain):
    """A second-stage source (as the small LM): asked after the first selection, always willing."""

    second_stage = True

    def pays(self, selection, max_depth, margin):
        return True


def test_a_window_that_no_longer_fits_beside_the_second_stages_nodes_does_not_run():
    """5 first-stage nodes and a 6-row window fit a budget of 12; the second stage's 5 more nodes leave
    no room for the window, so it does not run and the tree keeps the budget."""
    first, windowed, late = _Chain("pld", [5, 6, 7, 8, 9]), _Chain("lookahead", [], rows=6), _Late("draft", [10, 11, 12, 13, 14])
    auto = AutoDrafter(sources=[first, windowed, late], cost=FLAT, gate=False)
    auto.begin([1, 2, 3])
    req = DraftRequest(budget=12, max_depth=16)
    tree = auto.propose(req)
    assert auto.window(req) is None
    assert len(tree) == 10


def test_the_decoder_runs_no_window_that_does_not_fit_beside_the_tree():
    """Any drafter's window counts inside the step's budget (not only auto's, which prices it itself)."""
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    for budget, runs in ((12, False), (16, True)):
        dec.draft_budget = budget
        seq = dec.new_sequence([5, 6, 7, 8], drafter=_Chain("pld", list(range(20, 30)), rows=6), max_new_tokens=32,
                               chat_template=False)
        seq.prefill()
        plan = seq.plan()
        assert len(plan.tree) == 10
        assert (plan.extra is not None and len(plan.extra) == 6) == runs


def test_a_source_kept_on_is_never_switched_off_and_comes_back_on_when_marked():
    led = SourceLedger(["ctx", "useless", "dear"], min_steps=4, min_share=0.0)
    led.account("ctx").on = False  # off from an earlier decision: keep_on switches it back on
    led.keep_on("ctx")
    for _ in range(200):
        # none of them brings a token of its own; "dear" costs most
        led.record(30.0, 1, ["ctx", "useless", "dear"], [0.0, 0.0, 0.0], [2.0, 1.0, 5.0])
    assert led.account("ctx").on and led.account("ctx").switches == 0
    assert led.account("dear").switches >= 1 and led.account("useless").switches >= 1


def test_auto_never_switches_its_context_source_off(monkeypatch):
    """A prompt of tokens that never repeat: the context source drafts nothing that pays, which would
    switch it off after ``min_steps`` (no cost exemption here); ``auto`` keeps it on, so that it still
    drafts where the text turns to copying, as ``pld`` would.

    Drafting is timed on a clock that advances 0.1 ms a reading: the ledger's accounts then follow
    from the run alone. On the wall clock another source's switch could land on any step (each
    restarts the others' tallies, the context source's included), so the context source's steps
    since the last switch, asserted below, varied from run to run (1 in one CI run)."""
    import itertools
    import types

    import lookupdec.drafters.auto as auto_module
    import lookupdec.sequence as sequence_module

    ticks = itertools.count()
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-4)
    monkeypatch.setattr(auto_module, "time", clock)
    monkeypatch.setattr(sequence_module, "time", clock)
    lm = tiny_loaded(0)
    dec = Decoder(lm, cost_curve=SLOPED)
    prompt = np.random.default_rng(0).permutation(np.arange(3, TINY_VOCAB))[:60].tolist()
    ledger = SourceLedger(min_steps=4, min_share=0.0)
    auto = AutoDrafter(cost=SLOPED, ledger=ledger, calibration=dec.calibration, state=dec.state)
    out = dec.generate(prompt, drafter=auto, max_new_tokens=60)
    assert out.token_ids == dec.generate(prompt, method="ar", max_new_tokens=60).token_ids
    context = ledger.account(auto._names[0])
    assert auto.sources[0].name == context_source(dec.calibration).name
    assert context.on and context.switches == 0 and context.steps >= 4  # judged, and kept
