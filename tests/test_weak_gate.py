"""``auto``'s weak-match gate (drafters/weak.py): steps where the lookup sources matched nothing or little."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.drafters.auto import AutoDrafter
from lookupdec.drafters.base import DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.ledger import SourceLedger
from lookupdec.drafters.weak import BANDS, WeakMatchGate
from lookupdec.tree import DraftTree
from tests.conftest import FLAT, tiny_loaded


def _closed(*bands: int, probe_every: int = 1000) -> WeakMatchGate:
    """A gate whose ``bands`` have evidence that drafting there does not pay."""
    g = WeakMatchGate(min_steps=1, probe_every=probe_every)
    for b in bands:
        g.record(b, 0, 10.0, 5.0)
    return g


def test_a_band_that_does_not_pay_closes_and_is_retried_one_step_in_probe_every():
    g = WeakMatchGate(min_steps=8, probe_every=16)
    drafted = 0
    for _ in range(1000):
        if g.drafts(0):
            drafted += 1
            g.record(0, 0, 10.0, 0.6)  # nothing accepted, 0.6 ms spent
    assert not g.pays(0)
    assert drafted == 8 + (1000 - 8) // 16
    assert g.skipped[0] == 1000 - 8


def test_a_closed_band_opens_again_when_its_retries_pay():
    g = _closed(0, probe_every=4)
    drafted = []
    for step in range(200):
        d = g.drafts(0)
        drafted.append(d)
        if d:
            g.record(0, 1, 10.0, 2.0)  # now each drafting step brings a token worth a plain step
    assert g.pays(0)
    assert not all(drafted[:3]) and all(drafted[-50:])


def test_bands_learn_apart_and_a_strong_match_is_never_gated():
    g = _closed(0)
    assert not g.drafts(0) and g.drafts(1)
    assert g.band(None) == 0 and g.band(0.0) == 1 and g.band(BANDS[-1] / 2) == len(BANDS)
    assert g.band(BANDS[-1]) is None and g.band(0.99) is None


@pytest.mark.parametrize("bad", [dict(decay=0.0), dict(decay=1.5), dict(min_steps=-1), dict(probe_every=0)])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        WeakMatchGate(**bad)


class _Lookup(Drafter):
    """A lookup source proposing ``tree`` (empty by default); records what it is told."""

    name = "pld"

    def __init__(self):
        self.tree, self.told = DraftTree.empty(), []

    def propose(self, request):
        return self.tree

    def commit(self, outcome):
        self.told.extend(outcome.new_tokens)


class _Own(Drafter):
    """A source drafting from the target's predictions: asks for top-k, counts its proposals."""

    name = "recycle"
    looks_up = False
    topk = 2

    def __init__(self):
        self.proposals, self.told = 0, []

    def propose(self, request):
        self.proposals += 1
        return DraftTree.chain([9, 10], [0.99, 0.98])

    def commit(self, outcome):
        self.told.extend(outcome.new_tokens)


def _auto(gate: WeakMatchGate) -> tuple[AutoDrafter, _Lookup, _Own]:
    ledger = SourceLedger()
    ledger.weak = gate
    lookup, own = _Lookup(), _Own()
    auto = AutoDrafter(sources=[lookup, own], cost=FLAT, ledger=ledger)
    auto.begin([1, 2, 3])
    return auto, lookup, own


def test_auto_makes_a_no_match_step_plain_and_tells_its_sources_the_tokens_at_the_next_proposal():
    auto, lookup, own = _auto(_closed(0))
    req = DraftRequest(16, 8)
    tree = auto.propose(req)
    assert len(tree) == 0 and own.proposals == 0
    assert auto.topk == 0 and auto.window(req) is None  # no top-k rows, no window on a plain step
    auto.commit(StepOutcome((), (7,)))
    assert lookup.told == [] and own.told == []  # caught up at the next proposal, not now
    assert len(auto.propose(req)) == 0
    assert lookup.told == [7] and own.told == [7]
    # A strong lookup match is never gated: every source drafts.
    lookup.tree = DraftTree.chain([4], [0.9])
    assert len(auto.propose(req)) > 0 and own.proposals == 1 and auto.topk == 2


def test_a_weak_match_is_gated_in_its_own_band():
    auto, lookup, own = _auto(_closed(1))
    lookup.tree = DraftTree.chain([4], [BANDS[0] / 2])
    assert len(auto.propose(DraftRequest(16, 8))) == 0 and own.proposals == 0
    auto.commit(StepOutcome((), (4,)))
    lookup.tree = DraftTree.empty()  # band 0 is still open
    assert len(auto.propose(DraftRequest(16, 8))) > 0 and own.proposals == 1


def test_a_no_match_step_that_drafts_is_recorded_with_its_accepted_tokens():
    gate = WeakMatchGate()
    auto, lookup, own = _auto(gate)
    tree = auto.propose(DraftRequest(16, 8))
    assert len(tree) == 2 and own.proposals == 1
    auto.commit(StepOutcome((0,), (9, 5), tree, np.arange(len(tree))))
    assert gate.steps == [1] + [0] * len(BANDS)
    assert gate.saved_ms[0] == pytest.approx(FLAT.table(3, 2)[1])  # one accepted token: a plain step saved
    assert gate.cost_ms[0] > 0


@pytest.mark.parametrize("temperature", [0.0, 0.5])  # hotter, the tiny model ends within 5 tokens
def test_auto_with_its_weak_match_gate_closed_equals_ar(temperature):
    """Plain steps made by the gate change no token: greedy output is ``ar``'s, and sampled output
    ``ar``'s draws for the same seed."""
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    prompt = dec.encode("the cat sat on the mat; the cat sat on the mat; the cat", chat_template=False)
    ref = dec.generate(prompt, method="ar", max_new_tokens=96, temperature=temperature, seed=3)
    gate = _closed(0, 1, probe_every=5)
    dec._ledger("auto", temperature).weak = gate
    out = dec.generate(prompt, method="auto", max_new_tokens=96, temperature=temperature, seed=3)
    assert out.token_ids == ref.token_ids
    assert sum(gate.skipped) > 0  # the gate made steps plain
    assert sum(s.draft_size > 0 for s in out.step_stats) > 0  # and others still drafted
