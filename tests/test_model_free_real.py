"""recycle, lookahead and auto (every model-free source) on the embedded model: greedy output is ar's."""
from __future__ import annotations

import pytest

from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder

# A curve as flat as a memory-bound CPU's, fixed so the test does not measure one.
CURVE = CostCurve((1, 16, 64), (30.0, 33.0, 60.0), 0, (0.0, 0.0, 0.0), "test", "fixed")


@pytest.mark.slow
def test_model_free_methods_equal_ar_on_the_embedded_model(real_loaded):
    dec = Decoder(real_loaded, cost_curve=CURVE)
    prompt = "List the days of the week, then list them again in reverse order."
    ar = dec.generate(prompt, method="ar", max_new_tokens=40)
    for method in ("recycle", "lookahead", "auto"):
        out = dec.generate(prompt, method=method, max_new_tokens=40)
        assert out.token_ids == ar.token_ids, method
        assert out.steps <= ar.steps
