"""``auto`` tells its sources the tokens of steps that proposed nothing only when it next drafts.

The contract this rests on: for every source, being told tokens ``a`` then ``b`` by steps
without a proposal leaves it in the state that being told ``a + b`` at once does. Checked
source by source through what each then proposes (the slow oracle is the one-by-one telling).
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.costs import CostCurve
from lookupdec.drafters.auto import AutoDrafter, context_source
from lookupdec.drafters.base import DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.llma import LLMADrafter
from lookupdec.drafters.lookahead import LookaheadDrafter
from lookupdec.drafters.recycle import RecycleDrafter
from lookupdec.drafters.rest import RESTDrafter
from lookupdec.drafters.state import DrafterState
from lookupdec.index import build_index_from_tokens
from lookupdec.index.suffix import open_index
from lookupdec.tree import DraftTree

FLAT = CostCurve((1, 64), (10.0, 10.5), 0, (0.0, 0.0), "test", "flat")

rng = np.random.default_rng(7)
# A repetitive text over a small vocabulary: every source finds something to draft.
TEXT = rng.integers(3, 12, 400).tolist()
PROMPT, DRAFTED, PLAIN = TEXT[:200], TEXT[200:203], TEXT[203:260]


def _sources(tmp_path) -> dict:
    build_index_from_tokens([TEXT[i:i + 80] for i in range(0, 400, 40)], tmp_path / "i")
    index = open_index(tmp_path / "i")
    return {
        "context": lambda: context_source(Calibration()),
        "llma": lambda: LLMADrafter([TEXT[150:330]], calibration=Calibration()),
        "rest": lambda: RESTDrafter([index], calibration=Calibration()),
        "lookahead": lambda: LookaheadDrafter(calibration=Calibration(), cost=FLAT),
        "recycle": lambda: RecycleDrafter(calibration=Calibration(), state=DrafterState(Calibration())),
    }


def _drafting_step(d: Drafter) -> None:
    """One step that proposes and has its first node (if any) accepted, with top-k rows (recycle's table)."""
    tree = d.propose(DraftRequest(16, 8))
    accepted = (0,) if len(tree) and tree.tokens[0] == DRAFTED[0] else ()
    k = max(int(d.topk), 1)
    rows = np.arange(3, 12, dtype=np.int64)  # a top-k row for every token of the text
    ids = np.array([[(t * 5 + j) % 9 + 3 for j in range(k)] for t in rows], np.int64)
    probs = np.tile(np.linspace(0.5, 0.1, k, dtype=np.float32), (len(rows), 1))
    origin = np.arange(len(tree), dtype=np.int64)
    d.commit(StepOutcome(accepted, tuple(DRAFTED[:1 + len(accepted)]), tree, origin, row_tokens=rows,
                         topk_ids=ids, topk_probs=probs))


def _same(a: DraftTree, b: DraftTree) -> bool:
    return (a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
            and np.array_equal(a.scores, b.scores))


@pytest.mark.parametrize("name", ["context", "llma", "rest", "lookahead", "recycle"])
def test_telling_tokens_one_step_at_a_time_or_all_at_once_leaves_a_source_alike(name, tmp_path):
    make = _sources(tmp_path)[name]
    one, once = make(), make()
    for d in (one, once):
        d.begin(PROMPT)
        _drafting_step(d)
    for t in PLAIN:
        one.commit(StepOutcome((), (t,)))
    once.commit(StepOutcome((), tuple(PLAIN)))
    a, b = one.propose(DraftRequest(16, 8)), once.propose(DraftRequest(16, 8))
    assert len(a) > 0, "the fixture must give every source something to draft"
    assert _same(a, b)


class _Recorder(Drafter):
    """A source that drafts nothing and records every commit."""

    name = "recorder"

    def __init__(self) -> None:
        self.commits: list[tuple[int, ...]] = []

    def begin(self, prompt_ids) -> None:
        self.commits = []

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree.empty()

    def commit(self, outcome: StepOutcome) -> None:
        self.commits.append(tuple(outcome.new_tokens))


def test_auto_tells_its_sources_the_plain_steps_tokens_once_when_it_next_drafts():
    rec = _Recorder()
    auto = AutoDrafter(sources=[context_source(Calibration()), rec], cost=FLAT, gate=False)
    auto.begin(PROMPT)
    for t in PLAIN[:5]:
        auto.commit(StepOutcome((), (t,)))  # steps that proposed nothing (a paused gate)
    assert rec.commits == []
    auto.propose(DraftRequest(16, 8))
    assert rec.commits == [tuple(PLAIN[:5])]
    auto.commit(StepOutcome((), (PLAIN[5],), DraftTree.empty(), np.zeros(0, np.int64)))
    # After a proposal the step's tokens are told at once, and nothing is told twice.
    assert rec.commits == [tuple(PLAIN[:5]), (PLAIN[5],)]
    # A new sequence forgets what the last one had not told.
    auto.commit(StepOutcome((), (PLAIN[6],)))
    auto.begin(PROMPT)
    auto.propose(DraftRequest(16, 8))
    assert rec.commits == []


def test_auto_after_plain_steps_drafts_what_it_would_have_drafted_told_each_step():
    """The slow oracle: an auto whose sources are told each plain step's tokens at once."""
    lazy, eager = (AutoDrafter(cost=FLAT, gate=False) for _ in range(2))
    for d in (lazy, eager):
        d.begin(PROMPT)
    for t in PLAIN:
        lazy.commit(StepOutcome((), (t,)))
        eager.commit(StepOutcome((), (t,)))
        eager._catch_up()
    a, b = lazy.propose(DraftRequest(16, 8)), eager.propose(DraftRequest(16, 8))
    assert len(a) > 0
    assert _same(a, b)
