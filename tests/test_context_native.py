"""The context source's proposal in one native call (``context_propose``) against its Python route.

Two PLD drafters, one on each route (``PLDDrafter.native_propose``), see the same text and are told
the same outcomes: every proposal must be the same tree to the bit (tokens, parents, scores,
sources, depths), the adaptive depth must move alike, and the calibration must learn alike.
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec._native import LiveCore, context_propose
from lookupdec.drafters.auto import context_source
from lookupdec.drafters.base import DraftRequest, StepOutcome
from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.pld import PLDConfig, PLDDrafter

CONFIGS = {
    "default": lambda cal: PLDDrafter(calibration=cal),
    "auto's context source": context_source,
    "no fallback": lambda cal: PLDDrafter(PLDConfig(min_n=1, max_n=6, fallback_width=0), calibration=cal),
    "long matches": lambda cal: PLDDrafter(PLDConfig(min_n=3, max_n=32, max_width=48, max_depth=16,
                                                     fallback_width=8, fallback_depth=6), calibration=cal),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_native_context_proposals_equal_the_python_route_step_after_step(name):
    rng = np.random.default_rng(list(CONFIGS).index(name))
    # Repeats with noise: long matches, short ones, and stretches with none.
    base = rng.integers(3, 40, 60).tolist()
    text = []
    while len(text) < 900:
        start = int(rng.integers(0, 50))
        text += base[start:start + int(rng.integers(3, 20))] + rng.integers(3, 400, int(rng.integers(0, 4))).tolist()
    fast, slow = CONFIGS[name](Calibration()), CONFIGS[name](Calibration())
    slow.native_propose = False
    pos = 80
    for d in (fast, slow):
        d.begin(text[:pos])
    drafted = empty = 0
    while pos < 850:
        req = DraftRequest(int(rng.choice([0, 1, 3, 16, 64])), int(rng.choice([1, 2, 8, 100])))
        a, b = fast.propose(req), slow.propose(req)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        assert a.scores.tolist() == b.scores.tolist() and a.sources.tolist() == b.sources.tolist()
        assert a.depth.tolist() == b.depth.tolist() and fast._drafted == slow._drafted
        drafted += len(a) > 0
        empty += len(a) == 0
        # The target continues the text: accept the matching path, then one token more.
        node, accepted = -1, []
        while True:
            nxt = next((i for i in range(len(a)) if int(a.parents[i]) == node
                        and int(a.tokens[i]) == text[pos + len(accepted)]), None)
            if nxt is None:
                break
            accepted.append(nxt)
            node = nxt
        new = tuple(text[pos:pos + len(accepted) + 1])
        for d in (fast, slow):
            d.commit(StepOutcome(tuple(accepted), new, a, np.arange(len(a), dtype=np.int64)))
        assert fast.depth == slow.depth
        pos += len(new)
    assert drafted > 30 and empty > 5, (drafted, empty)
    assert fast._scorer.calibration._fine == slow._scorer.calibration._fine


def test_native_context_proposal_refuses_bounds_the_index_does_not_hold():
    core = LiveCore(1, 4)
    core.extend(np.array([5, 6, 5, 6, 5], np.int32))
    levels = Calibration().levels()
    assert context_propose(core, (1, 4, 3, 8), None, 8, levels, "pld", True, 1) is not None
    assert context_propose(core, (1, 4, 3, 0), None, 8, levels, "pld", True, 1) is None  # no width
    with pytest.raises((ValueError, TypeError)):
        context_propose(core, (1, 4, 3), None, 8, levels, "pld", True, 1)  # a malformed bound
