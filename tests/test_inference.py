"""``lookupdec.inference.inference``: the function runs in inference mode whether or not its caller
holds one, and the caller's mode is what it was afterwards."""
from __future__ import annotations

import pytest
import torch

from lookupdec.inference import inference


@inference
def _mode_inside(x: torch.Tensor) -> tuple[bool, torch.Tensor]:
    return torch.is_inference_mode_enabled(), x * 2


@pytest.mark.parametrize("outer", [None, True, False])
def test_runs_in_inference_mode_and_restores_the_callers(outer):
    x = torch.ones(3, requires_grad=outer is None)
    if outer is None:
        on, y = _mode_inside(x)
        after = torch.is_inference_mode_enabled()
    else:
        with torch.inference_mode(outer):
            on, y = _mode_inside(x)
            after = torch.is_inference_mode_enabled()
        assert after is outer
    assert on and y.is_inference() and not y.requires_grad
    assert after == bool(outer)
    assert y.tolist() == [2.0, 2.0, 2.0]


def test_exceptions_pass_through_and_leave_the_mode_off():
    @inference
    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    assert not torch.is_inference_mode_enabled()
