"""Pricing of window rows and of top-k logits in auto's cost table, and their measurement."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.costs import MEASURED_LOGIT_ROWS, CostCurve, measure
from lookupdec.drafters.auto import AutoDrafter
from lookupdec.drafters.base import DraftRequest
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier
from tests.conftest import tiny_model

CURVE = CostCurve((1, 8, 65), (10.0, 12.0, 40.0), 0, (0.0, 0.0, 0.0), "test", "k", head_ms=(1.0, 2.0, 9.0))


class _Source:
    """Drafts nothing; runs ``rows`` window rows and asks for ``topk``."""

    name = "src"

    def __init__(self, rows=0, topk=0):
        self.rows, self.topk = rows, topk

    def begin(self, prompt_ids):
        pass

    def propose(self, request):
        return DraftTree.empty()

    def commit(self, outcome):
        pass

    def window_rows(self):
        return self.rows


def _slow_head(r):
    return float(np.interp(r, CURVE.widths, CURVE.head_ms))


def test_auto_prices_tree_and_window_rows_together_with_their_logits():
    # A source's top-k is deferred to the rows the acceptance walk computes (verify.py): it adds
    # no lm_head row, so the table is the same with or without it; window rows carry their logits.
    for rows, topk in ((0, 0), (5, 0), (0, 8), (5, 8)):
        auto = AutoDrafter(sources=[_Source(rows, topk)], cost=CURVE)
        auto.begin([1, 2, 3])
        table = auto._costs(20, auto.window_rows())
        for w in range(1, 21):
            logit_rows = min(w, MEASURED_LOGIT_ROWS) + rows
            done = min(w + rows, MEASURED_LOGIT_ROWS)
            want = CURVE.ms_at(w + rows) + max(_slow_head(logit_rows) - _slow_head(done), 0.0) * (logit_rows > done)
            assert abs(table[w] - want) < 1e-9, (rows, topk, w)
        assert auto.propose(DraftRequest(16, 16)).tokens.tolist() == []


@pytest.mark.cpu  # lm_head timed apart: the fast forward's (CPU only)
def test_measure_times_lm_head_on_the_fast_backend_only():
    model = tiny_model(0)
    fast = measure(TreeVerifier(model, fast=True), widths=(1, 4), past=8, far_past=16, repeats=1, warmup=0)
    hf = measure(TreeVerifier(model, fast=False), widths=(1, 4), past=8, far_past=16, repeats=1, warmup=0)
    assert len(fast.head_ms) == 2 and min(fast.head_ms) > 0 and hf.head_ms == ()
    assert CostCurve.from_json(fast.to_json()) == fast
