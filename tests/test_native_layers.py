"""The decoder layers of a step in one native call (lookupdec.native_layers, ext/csrc/layers.c):
its element-wise routines against their formulas, and the whole layers against the Python loop
they replace, row by row."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.fast_forward import FastForward
from tests.oracles.forward import reference_forward
from tests.conftest import TINY_VOCAB, tiny_loaded
from tests.oracles.blocks import blockified_model

pytestmark = pytest.mark.cpu  # the quantized format is the fast forward's (CPU only)

def _rotary(x, cos, sin):
    out = np.empty_like(x)
    _native.rotary_ptr(x.ctypes.data, x.shape[0], x.shape[1], x.shape[2], cos.ctypes.data, sin.ctypes.data,
                       out.ctypes.data)
    return out


def _silu_mul(gu):
    out = np.empty((gu.shape[0], gu.shape[1] // 2), np.float32)
    _native.silu_mul_ptr(gu.ctypes.data, gu.shape[0], gu.shape[1] // 2, out.ctypes.data)
    return out


def test_rotary_is_the_float32_formula_bit_for_bit():
    """``x * cos + roll(x, D/2) * sin_signed``, each product rounded to float32, then the sum (numpy's float32
    operations are correctly rounded: the oracle is exact), for every row, head and position."""
    rng = np.random.default_rng(0)
    for D in (2, 8, 64):
        x = rng.standard_normal((5, 3, D)).astype(np.float32) * 10
        cos = rng.standard_normal((5, D)).astype(np.float32)
        sin = rng.standard_normal((5, D)).astype(np.float32)
        want = x * cos[:, None, :] + np.roll(x, D // 2, axis=-1) * sin[:, None, :]
        assert np.array_equal(_rotary(x, cos, sin), want)


def test_rotary_equals_the_python_loops_torch_formula_to_rounding():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((4, 12, 64)).astype(np.float32))
    cos = torch.from_numpy(rng.standard_normal((4, 1, 64)).astype(np.float32))
    sin = torch.from_numpy(rng.standard_normal((4, 1, 64)).astype(np.float32))
    want = torch.addcmul(x * cos, torch.roll(x, 32, -1), sin)  # FastForward._rope (which may fuse the add)
    got = _rotary(x.numpy(), cos[:, 0].contiguous().numpy(), sin[:, 0].contiguous().numpy())
    torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-6, rtol=1e-6)


def test_silu_mul_equals_float64_silu_on_every_instruction_set(isa):
    """``silu(g) * u`` within float32 rounding of the float64 formula, over the whole float32 range of gates
    (0 and -0, tiny, the polynomial's ends at -87.3 and 88, beyond them, huge): finite everywhere."""
    rng = np.random.default_rng(2)
    edges = np.array([0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 20.0, -20.0, 87.2, 87.4, -87.2, -87.4, 88.0, -88.0,
                      88.5, -88.5, 100.0, -100.0, 1e30, -1e30], np.float32)
    for inter in (1, 7, 16, 17, 40, 1536):
        g = np.resize(np.concatenate([edges, (rng.standard_normal(inter) * 8).astype(np.float32)]), (3, inter))
        u = (rng.standard_normal((3, inter)) * 3).astype(np.float32)
        got = _silu_mul(np.concatenate([g, u], axis=1).astype(np.float32))
        g64, u64 = g.astype(np.float64), u.astype(np.float64)
        want = g64 * np.exp(-np.logaddexp(0.0, -g64)) * u64  # silu(g) = g * sigmoid(g), stable in float64
        assert np.isfinite(got).all(), isa
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-35, err_msg=isa)


def test_a_gate_gets_the_same_bits_in_a_vector_lane_and_in_the_scalar_tail(isa):
    """Every lane and the tail run the same fused operations: a value's result does not depend on its place."""
    rng = np.random.default_rng(3)
    vals = np.concatenate([rng.standard_normal(200) * 30, [0.0, -87.3, -87.31, 88.0, 88.01, -100.0]]).astype(np.float32)
    inter = 33  # lanes 0..31 vector (AVX-512 or AVX2), 32 the tail
    for v in vals:
        g = np.full(inter, v, np.float32)
        out = _silu_mul(np.concatenate([g, np.full(inter, 1.5, np.float32)])[None])
        assert len(set(out[0].view(np.uint32).tolist())) == 1, (isa, float(v))


def _quantized_ff(seed=0):
    model = blockified_model(tiny_loaded(seed).model)
    return model, FastForward(model, weights="quantized")


def test_native_layers_serve_quantized_products_and_nothing_else():
    model, ff = _quantized_ff()
    assert ff.layer_table is not None and tuple(ff.layer_table.shape) == (ff.n_layers, _native.LAYER_INT64S)
    assert FastForward(model, weights="float32").layer_table is None


def _step(ff, cache, ids, past, bias, native):
    table, ff.layer_table = ff.layer_table, (ff.layer_table if native else None)
    try:
        return ff.forward(cache, torch.tensor(ids), torch.arange(past, past + len(ids)), bias,
                          list(range(len(ids))))
    finally:
        ff.layer_table = table


def test_native_layers_compute_the_python_loops_logits_and_the_models_own():
    """The same step through the native layers and through the Python loop (torch's rotary and SiLU: another
    exp, so float rounding apart), and against transformers' own forward of the whole sequence."""
    model, ff = _quantized_ff()
    rng = np.random.default_rng(4)
    prompt = rng.integers(3, TINY_VOCAB, 19).tolist()
    new = rng.integers(3, TINY_VOCAB, 6).tolist()
    out = {}
    for native in (True, False):
        cache = ff.new_cache(64)
        ff.forward(cache, torch.tensor(prompt), torch.arange(len(prompt)), None, None, causal=True)
        causal = torch.zeros(6, len(prompt) + 6).masked_fill_(
            torch.ones(6, len(prompt) + 6, dtype=torch.bool).triu_(len(prompt) + 1), torch.finfo(torch.float32).min)
        out[native] = _step(ff, cache, new, len(prompt), causal, native)
        assert cache.length == len(prompt) + 6
    torch.testing.assert_close(out[True], out[False], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[True], reference_forward(model, prompt + new)[len(prompt):], atol=1e-4, rtol=1e-5)


def test_a_rows_bits_do_not_depend_on_its_batch_mates_through_the_native_layers(isa):
    """Two sequences in one ``forward_batch`` (one row and three rows) give each row the bits it gets alone."""
    _, ff = _quantized_ff(1)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, TINY_VOCAB, n).tolist() for n in (11, 23)]
    steps = [[int(rng.integers(3, TINY_VOCAB))], rng.integers(3, TINY_VOCAB, 3).tolist()]

    def prefilled(p):
        c = ff.new_cache(64)
        ff.forward(c, torch.tensor(p), torch.arange(len(p)), None, None, causal=True)
        return c

    caches = [prefilled(p) for p in prompts]
    hidden = ff.forward_batch(caches, [torch.tensor(s) for s in steps],
                              [torch.arange(len(p), len(p) + len(s)) for p, s in zip(prompts, steps)], [None, None])
    for p, s, h in zip(prompts, steps, hidden):
        alone = ff.forward(prefilled(p), torch.tensor(s), torch.arange(len(p), len(p) + len(s)), None, "hidden")
        assert torch.equal(h, alone), isa
