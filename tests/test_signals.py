"""One signals type for the verifier's reports: VerifyResult and StepOutcome share VerifierSignals."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from lookupdec.drafters.base import StepOutcome, VerifierSignals
from lookupdec.tree import DraftTree
from lookupdec.verify import LazyLogits, VerifyResult


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_result_and_outcome_declare_the_signals_once_through_the_shared_type():
    shared = set(VerifierSignals.NAMES)
    assert _names(VerifierSignals) == shared
    for cls in (VerifyResult, StepOutcome):
        assert issubclass(cls, VerifierSignals) and shared <= _names(cls)
        # Declared by the base alone: a subclass redeclaring one would copy it by hand.
        assert not shared & set(cls.__dict__.get("__annotations__", {}))


def test_a_results_signals_reach_an_outcome_unchanged():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 1.0, 0.0]])
    res = VerifyResult(LazyLogits.of(logits), DraftTree.chain([2]), topk=2, root=9,
                       extra_argmax=np.array([1, 3]))
    res.row(0), res.row(1)  # the rows an acceptance walk reads
    sig = res.signals()
    assert sig.row_tokens.tolist() == [9, 2]
    assert sig.topk_ids.tolist() == [[1, 3], [0, 2]]
    np.testing.assert_allclose(sig.topk_probs[0], torch.softmax(logits[0], -1)[[1, 3]].numpy(), rtol=1e-5)
    out = StepOutcome((0,), (2, 0), res.tree, np.array([0]), **sig.fields())
    for name in VerifierSignals.NAMES:
        np.testing.assert_array_equal(getattr(out, name), getattr(sig, name))
    # A window slice keeps the top-k and only those extra rows.
    part = out.window(1, 1)
    assert part.extra_argmax.tolist() == [3] and part.topk_ids is out.topk_ids


def test_without_topk_only_the_extra_rows_are_reported():
    res = VerifyResult(LazyLogits.of(torch.zeros(1, 4)), DraftTree.empty(), extra_argmax=np.array([2]))
    sig = res.signals()
    assert len(sig.row_tokens) == 0 and sig.topk_ids.shape == (0, 0) and sig.extra_argmax.tolist() == [2]
