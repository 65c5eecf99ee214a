"""A token drawn from a logit row in one native call (``lookupdec.sampling.draw``, ext/csrc/sample.c) against
a float64 inverse-CDF oracle, on every instruction set."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.sampling import SamplingParams, draw, sample_at, target_probs

pytestmark = pytest.mark.cpu


def _oracle(x: np.ndarray, temperature: float, u: float) -> tuple[int, float]:
    """The token at ``u`` of softmax(x / T) in float64, and how far ``u`` is from that token's boundaries."""
    s = x.astype(np.float64) / temperature
    p = np.exp(s - s.max())
    c = np.cumsum(p) / p.sum()
    j = int(np.searchsorted(c, u, side="right"))
    lo = c[j - 1] if j else 0.0
    return j, min(u - lo, c[j] - u)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 1000, 49152])
def test_draw_is_the_inverse_cdf_of_the_tempered_softmax(isa, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    if n > 4:
        x[rng.integers(0, n, n // 4)] = -np.inf  # masked: never drawn
    x[0] = 3.0  # at least one token with mass
    checked = 0
    for temperature in (0.3, 1.0, 2.5):
        for u in rng.random(300):
            got = draw(torch.from_numpy(x), SamplingParams(temperature), float(u))
            want, margin = _oracle(x, temperature, float(u))
            assert np.isfinite(x[got]), (isa, n, temperature, u)
            if margin > 1e-5:  # far from a boundary: float rounding cannot move it
                assert got == want, (isa, n, temperature, u)
                checked += 1
    assert checked > 600


def test_u_at_the_top_draws_the_last_token_with_mass():
    x = torch.tensor([1.0, 2.0, float("-inf"), 0.5, float("-inf")])
    assert draw(x, SamplingParams(1.0), float(np.nextafter(1.0, 0.0))) == 3
    assert draw(x, SamplingParams(1.0), 0.0) == 0


def test_top_k_top_p_and_other_dtypes_take_the_torch_route():
    x = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 3
    for params in (SamplingParams(0.8, top_k=20), SamplingParams(0.8, top_p=0.9)):
        for u in (0.1, 0.5, 0.93):
            assert draw(x, params, u) == sample_at(target_probs(x, params), u)
    assert draw(x.double(), SamplingParams(0.8), 0.4) == sample_at(target_probs(x.double(), SamplingParams(0.8)), 0.4)
