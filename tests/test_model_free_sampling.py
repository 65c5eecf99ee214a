"""Sampling through Token Recycling, Lookahead and auto keeps the target's distribution (chi-square).

The pattern of tests/test_sampling.py: the first three generated tokens' marginals over seeded draws
against the exact marginals enumerated from the model. Each drafter is one object reused across the
draws, so the recycle table and the calibration carry over (as they would across a server's
requests); drafts depend only on earlier draws, never on the current step's random numbers.
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.drafters.auto import AutoDrafter
from lookupdec.drafters.single import lookahead_method, recycle_method
from lookupdec.drafters.lookahead import LookaheadDrafter
from lookupdec.sampling import SamplingParams
from tests.conftest import FLAT, TINY_VOCAB, tiny_loaded
from tests.test_sampling import _exact_marginals, assert_matches



def _drafter(kind):
    if kind == "recycle":
        return recycle_method(cost=FLAT)
    if kind == "lookahead":
        return lookahead_method(cost=FLAT)
    # auto with the model-free sources only (live context, recycle, lookahead), a small fixed window.
    from lookupdec.drafters.auto import context_source
    from lookupdec.drafters.calibrate import Calibration
    from lookupdec.drafters.recycle import RecycleDrafter

    cal = Calibration()
    return AutoDrafter(sources=[context_source(cal), RecycleDrafter(calibration=cal),
                                LookaheadDrafter(calibration=cal, window=3, ngram=3)], calibration=cal, cost=FLAT)


@pytest.mark.parametrize("kind", ["recycle", "lookahead", "auto"])
def test_token_distributions_match_plain_sampling(kind):
    lm = tiny_loaded(7)
    dec = Decoder(lm, hf_kernels=False)
    params = SamplingParams(1.0, top_k=4, top_p=0.95)
    # [10, 11, 12] and the model's own greedy continuation (tokens 54 and 96 recur, and both are
    # likely next tokens): its n-grams seed the pools, its rows fill the recycle table.
    prompt = [10, 11, 12, 96, 63, 54, 96, 96, 96, 54, 96, 54, 96, 54, 96]
    exact = _exact_marginals(lm, prompt, params, 3)
    drafter = _drafter(kind)
    counts = [np.zeros(TINY_VOCAB) for _ in range(3)]
    accepted = 0
    for seed in range(1_500):
        out = dec.generate(prompt, max_new_tokens=4, temperature=1.0, top_k=4, top_p=0.95, seed=seed,
                           drafter=drafter)
        for k in range(3):
            counts[k][out.token_ids[k]] += 1
        accepted += sum(s.accepted for s in out.step_stats)
    assert accepted > 150  # speculation really ran
    for k in range(3):
        assert_matches(counts[k], exact[k])
