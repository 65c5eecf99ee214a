"""The cost model: the cost curve as a prior, corrected by measured steps (lookupdec/pricing.py)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from lookupdec import costs
from lookupdec.costs import CostCurve
from lookupdec.pricing import CostModel, StepTiming, isotonic, scaled_curve
from tests.conftest import tiny_loaded

# The curve `make demo` cached on the AVX2 EPYC (issue 17): c(4) < c(1), no head timings.
AVX2 = CostCurve((1, 2, 4, 8, 16, 32, 64), (67.6, 73.3, 60.1, 82.8, 87.5, 122.4, 226.3), 257,
                 (0.0,) * 7, "cpu: AMD EPYC, AVX2", "avx2")


def _isotonic_oracle(v, w):
    """Weighted isotonic regression by its min-max formula: f_i = max_{j<=i} min_{k>=i} mean(v[j..k])."""
    n = len(v)
    out = []
    for i in range(n):
        best = -np.inf
        for j in range(i + 1):
            low = min(np.average(v[j:k + 1], weights=w[j:k + 1]) for k in range(i, n))
            best = max(best, low)
        out.append(best)
    return np.array(out)


def test_isotonic_matches_the_min_max_oracle_on_random_inputs_and_edge_shapes():
    rng = np.random.default_rng(0)
    assert isotonic([]).tolist() == []
    assert isotonic([3.0]).tolist() == [3.0]
    assert isotonic([2.0, 2.0, 2.0]).tolist() == [2.0, 2.0, 2.0]
    assert isotonic([3.0, 2.0, 1.0]).tolist() == [2.0, 2.0, 2.0]
    for _ in range(200):
        n = int(rng.integers(1, 9))
        v = rng.normal(size=n).round(1)  # rounded: ties between neighbours happen
        w = rng.uniform(0.1, 3.0, size=n)
        got = isotonic(v, w)
        assert np.all(np.diff(got) >= -1e-12)
        np.testing.assert_allclose(got, _isotonic_oracle(v, w), atol=1e-9)


def test_a_noisy_prior_is_made_monotone_before_any_step():
    model = CostModel(AVX2)
    t = model.table(past=257, max_width=64)
    assert np.all(np.diff(t[1:]) >= 0), "a wider forward must never be priced cheaper"
    assert t[4] < AVX2.ms_at(1) + 1e-9 < t[64]  # c(1), c(2), c(4) pooled to their mean, not c(1) kept
    assert np.all(np.diff(np.array(model.curve().ms)) >= 0)


def test_online_fit_converges_to_a_synthetic_cost():
    """Steps measured under a cost 1.6x steeper than the prior (plus noise) move the model to it."""
    prior = CostCurve((1, 4, 8, 16, 32, 64), (30.0, 31.0, 34.0, 40.0, 60.0, 110.0), 256, (0.01,) * 6, "cpu", "p",
                      head_ms=(1.0, 2.0, 3.5, 6.0, 11.0, 21.0))
    true_body = scaled_curve(replace_head(prior), 1.6)
    rng = np.random.default_rng(1)
    model = CostModel(prior, min_steps=10 ** 9)
    for _ in range(600):
        w = int(rng.integers(1, 40))
        past = int(rng.integers(100, 600))
        rows = min(w, 7)
        head = 1.3 * float(np.interp(rows, prior.widths, prior.head_ms))  # lm_head 1.3x the prior's
        body = true_body.ms_at(w, past) * float(rng.lognormal(0.0, 0.05))
        model.observe(StepTiming(w, past, body + head, rows, head, draft_ms=0.4, host_ms=0.8))
    for w in (1, 4, 8, 16, 32):
        assert model.body_ms(w, 256) == pytest.approx(true_body.ms_at(w, 256), rel=0.08), w
    assert model.head_rows_ms(7) == pytest.approx(1.3 * float(np.interp(7, prior.widths, prior.head_ms)), rel=0.05)
    assert model.host_ms == pytest.approx(0.8) and model.draft_ms == pytest.approx(0.4)
    # An untouched model prices as its prior does (a uniform curve has no monotone fix to make):
    # exactly at the measured widths, within the interpolation of body and lm_head apart between them.
    fresh = CostModel(prior)
    for w in (1, 4, 16, 32):
        assert fresh.ms_at(w, 300) == pytest.approx(prior.ms_at(w, 300))
    for w in (5, 12, 40):
        assert fresh.ms_at(w, 300) == pytest.approx(prior.ms_at(w, 300), rel=0.01)
        assert fresh.logits_extra_ms(w, w + 4) == pytest.approx(prior.logits_extra_ms(w, w + 4), rel=0.02)


def replace_head(curve: CostCurve) -> CostCurve:
    """The curve's body alone (its time less the lm_head rows it included), without head timings."""
    from dataclasses import replace

    head = [float(np.interp(min(w, 7), curve.widths, curve.head_ms)) for w in curve.widths]
    return replace(curve, ms=tuple(m - h for m, h in zip(curve.ms, head)), head_ms=())


def test_a_curve_that_agrees_stays_and_one_off_is_flagged_and_logged(caplog):
    good = CostModel(AVX2, min_steps=20)
    truth = CostModel(AVX2)  # the monotone version of the same curve is what steps measure
    for i in range(60):
        w = (1, 8, 16, 32)[i % 4]
        good.observe(StepTiming(w, 257, truth.ms_at(w, 257)))
    assert good.table(257, 8) is not None and not good.stale
    off = CostModel(scaled_curve(AVX2, 2.0, "all"), min_steps=20)
    with caplog.at_level(logging.INFO, logger="lookupdec.pricing"):
        for i in range(60):
            w = (1, 8, 16, 32)[i % 4]
            off.observe(StepTiming(w, 257, truth.ms_at(w, 257)))
        off.table(257, 8)
    assert off.stale
    assert any("disagrees" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("factor, level", [(1.6, logging.INFO), (3.0, logging.WARNING)])
def test_a_disagreement_the_fit_absorbs_is_info_and_a_gross_one_a_warning_naming_the_fix(caplog, factor, level):
    """Steps 1.6x the curve (noise and load on a small VM reach that) are logged at INFO, both when
    found and when the fit is adopted; steps 3x the curve (a curve measured under load) at WARNING,
    with the command that measures it again."""
    from lookupdec.pricing import settle_stale

    model = CostModel(AVX2)
    with caplog.at_level(logging.INFO, logger="lookupdec.pricing"):
        for i in range(80):
            w = (1, 4, 8, 16)[i % 4]
            model.observe(StepTiming(w, 257, factor * model.prior.ms_at(w, 257)))
        model.table(257, 8)
        assert model.stale
        settle_stale(model, "fit", None)
    records = [r for r in caplog.records if r.name == "lookupdec.pricing"]
    assert len(records) == 2 and {r.levelno for r in records} == {level}
    assert ("cost-curve --remeasure" in records[0].getMessage()) == (level == logging.WARNING)
    assert not model.stale and model.steps == 0


def test_a_curve_is_not_judged_on_fewer_steps_than_min_steps():
    model = CostModel(AVX2)
    for _ in range(model.min_steps - 1):  # far off, but not enough steps yet
        model.observe(StepTiming(8, 257, 5 * AVX2.ms_at(8, 257)))
    model.table(257, 8)
    assert not model.stale
    for _ in range(model.refit_every):  # the next refit sees min_steps and more
        model.observe(StepTiming(8, 257, 5 * AVX2.ms_at(8, 257)))
    model.table(257, 8)
    assert model.stale


def test_scaled_curve_steepens_or_scales_and_refuses_nonsense():
    s = scaled_curve(AVX2, 2.0)
    assert s.ms[0] == AVX2.ms[0] and s.ms[-1] == pytest.approx(AVX2.ms[0] + 2 * (AVX2.ms[-1] - AVX2.ms[0]))
    assert scaled_curve(AVX2, 0.5, "all").ms == tuple(m / 2 for m in AVX2.ms)
    for bad in (dict(factor=0.0), dict(factor=-1.0), dict(factor=2.0, how="sideways")):
        with pytest.raises(ValueError):
            scaled_curve(AVX2, **bad)


def _decoder(tmp_path, monkeypatch, **kw):
    from lookupdec.decoder import Decoder

    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "cache"))
    return Decoder(tiny_loaded(0), **kw)


def test_the_decoder_resolves_its_cost_provider_before_the_first_step_and_steps_feed_it(tmp_path, monkeypatch):
    calls = []
    real = costs.measure

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **{**k, "widths": (1, 2, 4, 8), "repeats": 1, "warmup": 0})

    monkeypatch.setattr(costs, "measure", counting)
    dec = _decoder(tmp_path, monkeypatch)
    seq = dec.new_sequence("ab ab ab", method="pld", max_new_tokens=8)
    assert dec._cost_model is None and not calls  # pld does not price: nothing measured
    seq = dec.new_sequence("ab ab ab", method="auto", max_new_tokens=12)
    assert dec._cost_model is not None and len(calls) == 1  # measured before prefill (the first timed work)
    assert seq.costs is dec._cost_model
    assert "model" in dec.cost_curve().measured_for and "threads" in dec.cost_curve().measured_for
    seq.prefill()
    while not seq.done:
        plan = seq.plan()
        res = dec.verifier.forward(seq.cache, seq.past, plan.root, plan.tree, extra=plan.extra, topk=plan.topk)
        seq.finish(plan, res, 0.001)
    assert dec._cost_model.steps == len(seq.result().step_stats) - 1  # every step but the prefill
    assert len(calls) == 1


@pytest.mark.cpu  # lm_head timed apart: the fast forward's (CPU only)
def test_every_step_reports_its_lm_head_apart_from_the_body_plain_steps_too(tmp_path, monkeypatch):
    """The model fits body and lm_head apart: a plain step whose lm_head rode in its body once made
    the first draft row look a quarter as dear as it was."""
    import torch

    from lookupdec.pricing import CostModel as Model

    seen: list[StepTiming] = []
    monkeypatch.setattr(Model, "observe", lambda self, t: seen.append(t))
    dec = _decoder(tmp_path, monkeypatch, cost_curve=CostCurve((1, 64), (10.0, 10.5), 0, (0.0, 0.0), "t", "flat"))
    assert dec.verifier.backend == "fast"
    seq = dec.new_sequence("ab ab ab", method="auto", max_new_tokens=6)
    seq.prefill()
    plan = seq.plan(0)  # a plain step
    res = dec.verifier.forward(seq.cache, seq.past, plan.root, plan.tree, extra=plan.extra, topk=plan.topk)
    # The plain step's logits are the ones a forward computing them inside gives, bit for bit.
    cache = dec.verifier.new_cache(seq.past + 4)
    dec.verifier.prefill(cache, list(seq.prompt_ids))
    inside = dec.verifier.fast.forward(cache, torch.tensor([plan.root]), torch.tensor([seq.past]), None, slice(0, 1))
    assert torch.equal(res.row(0), inside[0])
    seq.finish(plan, res, 0.001)
    assert len(seen) == 1 and seen[0].width == 1
    assert seen[0].head_rows == 1 and seen[0].head_ms > 0


def test_a_stale_curve_is_refreshed_between_requests_as_the_decoder_is_told(tmp_path, monkeypatch, caplog):
    calls = []
    real = costs.measure

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **{**k, "widths": (1, 2, 4, 8), "repeats": 1, "warmup": 0})

    def make_stale(model):
        for _ in range(80):  # steps 50x slower than the curve says (more than min_steps)
            model.observe(StepTiming(1, 20, 50 * model.ms_at(1, 20)))
        model.table(20, 4)
        assert model.stale

    monkeypatch.setattr(costs, "measure", counting)
    # "measure": measured again before the next request, the fit restarted on the new curve.
    dec = _decoder(tmp_path, monkeypatch, cost_refresh="measure")
    model = dec.costs()
    assert len(calls) == 1
    make_stale(model)
    with caplog.at_level(logging.WARNING, logger="lookupdec.pricing"):
        dec.new_sequence("ab ab", method="auto", max_new_tokens=4)
    assert len(calls) == 2 and not model.stale and model.steps == 0
    assert any("measuring the cost curve" in r.getMessage() for r in caplog.records)
    # "fit" (the default): the steps' fit becomes the prior; nothing measured, nothing written.
    dec = _decoder(tmp_path, monkeypatch)
    model = dec.costs()
    files = {f: f.read_text() for f in (tmp_path / "cache").rglob("*.json")}
    make_stale(model)
    fitted = model.ms_at(1, 20)
    dec.new_sequence("ab ab", method="auto", max_new_tokens=4)
    assert len(calls) == 2 and not model.stale and model.steps == 0
    assert model.ms_at(1, 20) == pytest.approx(fitted, rel=1e-6) and model.prior.ms[0] > 10 * dec.cost_curve().ms[0]
    assert {f: f.read_text() for f in files} == files
    # A given curve is never measured again, even when told "measure".
    given = _decoder(tmp_path, monkeypatch, cost_curve=AVX2, cost_refresh="measure")
    m2 = given.costs()
    for _ in range(80):
        m2.observe(StepTiming(8, 257, 10 * AVX2.ms_at(8)))
    m2.table(257, 4)
    assert m2.stale
    given.new_sequence("ab ab", method="auto", max_new_tokens=4)
    assert len(calls) == 2 and given.cost_curve() is AVX2
    assert m2.ms_at(8, 257) > 3 * AVX2.ms_at(8)
    with pytest.raises(ValueError, match="cost_refresh"):
        _decoder(tmp_path, monkeypatch, cost_refresh="sometimes")


def test_use_cost_curve_restarts_the_model_from_a_wrong_curve_and_refuses_other_things(tmp_path, monkeypatch):
    dec = _decoder(tmp_path, monkeypatch, cost_curve=AVX2)
    model = dec.costs()
    model.observe(StepTiming(8, 257, 80.0))
    off = scaled_curve(AVX2, 2.0)
    dec.use_cost_curve(off)
    assert dec.costs() is model and model.prior is off and model.steps == 0
    with pytest.raises(TypeError, match="CostCurve"):
        dec.use_cost_curve({"1": 30.0})


def test_auto_retabulates_when_measured_steps_refit_the_model():
    from lookupdec.drafters.auto import AutoDrafter

    model = CostModel(AVX2, refit_every=2)
    auto = AutoDrafter(cost=model)
    auto.begin([5, 6, 7, 5, 6, 7, 5, 6])
    before = auto._costs(16)[8]
    for _ in range(30):  # steps at width 8 cost three times what the curve says
        model.observe(StepTiming(8, 8, 3 * model.ms_at(8, 8)))
    after = auto._costs(16)[8]
    assert after > 2 * before


def test_the_version_moves_with_the_fit_not_with_every_refit():
    """Tables keyed by ``version`` are rebuilt when a knot moved by more than VERSION_TOLERANCE, and stay
    within it of the fit otherwise."""
    from lookupdec.pricing import VERSION_TOLERANCE

    model = CostModel(CostCurve((1, 4, 16), (10.0, 14.0, 30.0), 8, (0.0, 0.0, 0.0), "cpu", "k"), refit_every=1)
    v0 = model.version
    table = model.table(8, 16)
    for _ in range(40):  # steps that cost what the curve says: the fit does not move
        model.observe(StepTiming(4, 8, model.body_ms(4, 8)))
        assert model.version == v0
    assert np.allclose(model.table(8, 16)[1:], table[1:], rtol=VERSION_TOLERANCE)
    for _ in range(40):  # steps at twice the price: it moves, and the version with it
        model.observe(StepTiming(4, 8, 2 * model.body_ms(4, 8)))
    assert model.version > v0
    assert model.table(8, 16)[4] > 1.5 * table[4]


class _StepByStepKnots:
    """The knots' decayed weights and log ratios updated at every step, in numpy: the oracle for
    ``CostModel``, which folds the steps in a plain-float batch at each refit."""

    def __init__(self, model: CostModel) -> None:
        self.m, n = model, len(model.prior.widths)
        self.w, self.lr, self.hw, self.hlr = np.zeros(n), np.zeros(n), 0.0, 0.0

    def observe(self, t: StepTiming) -> None:
        m, d, xs = self.m, self.m.decay, np.asarray(self.m.prior.widths, np.float64)
        self.w *= d
        self.lr *= d
        body, expect = t.forward_ms - t.head_ms, m._prior_body(t.width, t.past)
        if body > 0 and expect > 0:
            lr = np.log(body / expect)
            w = np.clip(t.width, xs[0], xs[-1])
            k = int(np.searchsorted(xs, w, side="right")) - 1
            if k >= len(xs) - 1:
                self.w[-1] += 1.0
                self.lr[-1] += lr
            else:
                f = (w - xs[k]) / (xs[k + 1] - xs[k])
                self.w[k:k + 2] += [1.0 - f, f]
                self.lr[k:k + 2] += [(1.0 - f) * lr, f * lr]
        if t.head_rows > 0 and t.head_ms > 0:
            h0 = float(np.interp(t.head_rows, xs, m._head0))
            self.hw, self.hlr = self.hw * d + 1.0, self.hlr * d + np.log(t.head_ms / h0)


def test_knots_folded_at_refits_equal_knots_updated_every_step():
    """Steps folded in at each refit give the knots' weights and log ratios (body and head) an
    update at every step gives, whenever they are read: reads of the fit and of ``disagreement``
    between steps, refit intervals from 1 to 19, widths between and beyond the knots, head rows,
    and steps the model must ignore."""
    prior = CostCurve((1, 4, 8, 16, 32, 64), (30.0, 31.0, 34.0, 40.0, 60.0, 110.0), 256, (0.01,) * 6, "cpu", "p",
                      head_ms=(1.0, 2.0, 3.5, 6.0, 11.0, 21.0))
    rng = np.random.default_rng(3)
    for trial in range(6):
        model = CostModel(prior, refit_every=int(rng.integers(1, 20)), min_steps=30)
        oracle = _StepByStepKnots(model)
        for step in range(int(rng.integers(20, 120))):
            w = int(rng.integers(1, 90))
            t = StepTiming(w, int(rng.integers(0, 900)), float(prior.ms_at(w) * rng.uniform(0.5, 3.0)),
                           int(rng.integers(0, 8)), float(rng.uniform(0.0, 4.0)))
            if rng.random() < 0.05:
                t = StepTiming(w, 10, float("nan"))  # ignored, by both
            model.observe(t)
            if np.isfinite(t.forward_ms):
                oracle.observe(t)
            if rng.random() < 0.3:
                read = int(rng.integers(3))
                if read == 0:
                    model.table(past=300, max_width=40)
                elif read == 1:
                    model.disagreement()
                # read == 2: nothing read this step
            if rng.random() < 0.1:
                model.disagreement()  # folds everything pending: the knots must equal the oracle's now
                np.testing.assert_allclose(model._w, oracle.w, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(model._lr, oracle.lr, rtol=1e-12, atol=1e-12)
                assert model._hw == pytest.approx(oracle.hw, rel=1e-12)
                assert model._hlr == pytest.approx(oracle.hlr, rel=1e-12, abs=1e-12)
        model.disagreement()
        np.testing.assert_allclose(model._w, oracle.w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(model._lr, oracle.lr, rtol=1e-12, atol=1e-12)
