"""Lookahead: window layout, pool and update rules by hand, sizing rules, and lossless decoding."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder
from lookupdec.drafters.base import DraftRequest, StepOutcome
from lookupdec.drafters.lookahead import (LookaheadConfig, LookaheadDrafter, NgramPool, shape_for, window_rows,
                                          window_rows_for)
from tests.conftest import FLAT, TINY_VOCAB, tiny_loaded

REQ = DraftRequest(budget=16, max_depth=16)


def _slow_seen(L, W, l, c):
    """Cells row (l, c) sees: level 0 columns 0..c-l, then the diagonal up to itself (the Lookahead pattern)."""
    seen = {(0, j) for j in range(c - l + 1)}
    seen |= {(l - j, c - j) for j in range(l + 1) if c - j >= 0}
    return seen


@pytest.mark.parametrize("L,W", [(1, 1), (1, 5), (2, 3), (3, 2), (4, 6)])
def test_window_layout_equals_the_slow_rule_and_each_row_sees_one_chain(L, W):
    levels = np.arange(L * W).reshape(L, W) + 10
    x = window_rows(levels)
    for l in range(L):
        for c in range(W):
            r = l * W + c
            want = {(j // W, j % W) for j in np.flatnonzero(x.visible[r]).tolist()}
            assert want == _slow_seen(L, W, l, c)
            # One cell per column 0..c: a chain of c + 1 tokens, so the row's depth is c + 1.
            assert sorted(cc for _, cc in want) == list(range(c + 1)) and x.depth[r] == c + 1
            assert x.tokens[r] == levels[l, c]


def test_pool_keeps_the_most_recent_g_continuations_per_key():
    p = NgramPool(2)
    p.add([1, 2, 3])
    p.add([1, 4, 5])
    assert p.get(1) == [(4, 5), (2, 3)]
    p.add([1, 2, 3])                  # seen again: moves to the front, no duplicate
    assert p.get(1) == [(2, 3), (4, 5)]
    p.add([1, 6, 7])                  # a third: the oldest goes
    assert p.get(1) == [(6, 7), (2, 3)]
    assert p.get(9) == [] and len(p) == 2


def test_sizing_rule_from_the_cost_curve():
    steep = CostCurve((1, 2), (10.0, 20.0), 0, (0.0, 0.0), "", "")
    assert window_rows_for(steep, 0.1) == 0          # the first extra row costs 100%: no window
    assert window_rows_for(FLAT, 0.1) == 64          # capped
    assert window_rows_for(None, 0.1) == 0
    assert shape_for(0, LookaheadConfig()).rows == 0
    assert shape_for(16, LookaheadConfig()) == shape_for(16, LookaheadConfig(window=4, ngram=5, guess=4))
    assert shape_for(16, LookaheadConfig(window=3)).window == 3
    d = LookaheadDrafter(cost=steep)
    d.begin([1, 2, 3, 4])
    assert d.window(REQ) is None and d.window_rows() == 0
    for bad in (dict(window=-1), dict(ngram=1), dict(guess=0), dict(row_fraction=1.5)):
        with pytest.raises(ValueError):
            LookaheadConfig(**bad)


def test_pool_seeded_from_the_prompt_and_fed_by_committed_text():
    d = LookaheadDrafter(window=0, ngram=3, guess=4)
    d.begin([5, 6, 7, 8])
    assert d.propose(REQ).tokens.tolist() == []                   # nothing follows 8 yet
    d.commit(StepOutcome((), (5, 6)))                             # text ... 8 5 6: grams (7 8 5), (8 5 6)
    assert d.pool.get(8) == [(5, 6)]
    assert sorted(d.propose(REQ).tokens.tolist()) == [7, 8]       # after 6: (7, 8) from the prompt
    assert d.propose(DraftRequest(budget=16, max_depth=1)).tokens.tolist() == [7]  # clipped to max_depth


def test_window_outputs_close_ngrams_and_move_the_levels():
    d = LookaheadDrafter(window=3, ngram=3, guess=4)
    d.begin([1, 2, 3])
    d.levels = np.array([[10, 11, 12], [20, 21, 22]])
    x = d.window(REQ)
    assert x.tokens.tolist() == [10, 11, 12, 20, 21, 22]
    out = np.array([30, 31, 32, 40, 41, 42])                      # argmax of rows (0,0)..(1,2)
    d.commit(StepOutcome((), (7,), extra_argmax=out))
    # Row (1, c) sees the diagonal (0, c-1), (1, c): grams [10 21 41], [11 22 42].
    assert d.pool.get(10) == [(21, 41)] and d.pool.get(11) == [(22, 42)]
    # Levels move up; the last level's argmax become the top level one column to the right.
    assert d.levels.tolist() == [[20, 21, 22], [40, 40, 41]]
    d.commit(StepOutcome((), (8,)))                               # no window ran: levels stay
    assert d.levels.tolist() == [[20, 21, 22], [40, 40, 41]]


class _NoWindowAllowed(LookaheadDrafter):
    def window(self, request):
        raise AssertionError("window() called under chain verification")


def test_window_is_not_asked_for_under_chain_verification():
    lm = tiny_loaded(5)
    dec = Decoder(lm, hf_kernels=True, tree_masks=False)
    prompt = [9, 10, 11, 12, 9, 10]
    ar = dec.generate(prompt, method="ar", max_new_tokens=30)
    out = dec.generate(prompt, max_new_tokens=30, drafter=_NoWindowAllowed(window=3, ngram=3))
    assert out.token_ids == ar.token_ids


class _CountingWindow(LookaheadDrafter):
    calls = 0

    def window(self, request):
        type(self).calls += 1
        return super().window(request)


def test_the_window_never_runs_at_draft_budget_zero():
    # The window's rows are part of a step's draft: with no budget a step is a plain one.
    lm = tiny_loaded(5)
    prompt = [9, 10, 11, 12, 9, 10]
    _CountingWindow.calls = 0
    out = Decoder(lm, draft_budget=0).generate(prompt, max_new_tokens=20, drafter=_CountingWindow(window=3, ngram=3))
    assert _CountingWindow.calls == 0 and out.new_tokens == 20
    assert all(s.draft_size == 0 for s in out.step_stats)
    Decoder(lm, draft_budget=8).generate(prompt, max_new_tokens=20, drafter=_CountingWindow(window=3, ngram=3))
    assert _CountingWindow.calls > 0  # the same drafter does ask for its window once there is a budget


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_lookahead_and_auto_greedy_equal_ar(fast, scale):
    lm = tiny_loaded(6, scale=scale)
    dec = Decoder(lm, hf_kernels=not fast, cost_curve=FLAT)
    rng = np.random.default_rng(6)
    sped = 0
    for plen in (3, 25):
        prompt = rng.integers(3, TINY_VOCAB, plen).tolist()
        ar = dec.generate(prompt, method="ar", max_new_tokens=60)
        la = dec.generate(prompt, method="lookahead", max_new_tokens=60)
        auto = dec.generate(prompt, method="auto", max_new_tokens=60)
        assert la.token_ids == ar.token_ids and auto.token_ids == ar.token_ids
        if scale == 4.0 and ar.new_tokens > 20:  # repetitive outputs: the pool's n-grams get accepted
            assert la.steps < ar.steps and la.accepted_by_source.get("lookahead", 0) > 0
            sped += 1
    assert sped or scale == 1.0  # the speed-up check really ran


class _BadWindow(LookaheadDrafter):
    def __init__(self, bad):
        super().__init__(window=2, ngram=2)
        self.bad = bad

    def window(self, request):
        return self.bad


def test_a_bad_window_is_refused_with_the_drafter_named():
    from lookupdec.drafters.base import ExtraRows
    from lookupdec.errors import DraftError

    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    for bad, msg in (([5, 6], "not ExtraRows"),
                     (ExtraRows(np.array([TINY_VOCAB]), np.array([1]), np.ones((1, 1))), "outside the model")):
        with pytest.raises(DraftError, match=msg):
            dec.generate([5, 6, 7], max_new_tokens=5, drafter=_BadWindow(bad))
