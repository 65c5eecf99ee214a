"""A result's step times account for its whole elapsed time (lookupdec/sequence.py, ``StepStats``).

The host share the benchmarks report is the steps' drafting and other time over their total; time
the loop spends outside every timed part (the gate, the cost model's observation) must land in a
step, or that share reads low.
"""
from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

import lookupdec.sequence as sequence_module
from lookupdec.decoder import Decoder
from tests.conftest import TINY_VOCAB, tiny_loaded


@pytest.mark.parametrize("method", ["ar", "pld", "auto"])
def test_step_times_add_up_to_the_elapsed_time(monkeypatch, method):
    """On a clock that advances 1 ms at every reading, the steps' draft + verify + other ms equal the
    elapsed ms but for a fixed handful of readings (around the prefill and after the last step),
    however many steps ran: the loop's own readings (the gate's, the step's end) are in a step.
    Leaving out one reading a step would miss by more than the 10 allowed."""
    ticks = itertools.count()
    monkeypatch.setattr(sequence_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3))
    dec = Decoder(tiny_loaded(0))
    prompt = np.random.default_rng(1).integers(3, TINY_VOCAB, 40).tolist() * 2
    out = dec.generate(prompt, method=method, max_new_tokens=40)
    assert out.steps > 15
    timed = sum(s.draft_ms + s.verify_ms + s.other_ms for s in out.step_stats)
    elapsed = out.elapsed_s * 1e3
    assert elapsed - 10.0 <= timed <= elapsed + 1e-6, (timed, elapsed, out.steps)
