"""The "quantized-bf16" weight format: the GGUF's blocks with bfloat16 products (ext/csrc/qmatmul.c, LK_BF16).

On a CPU without AVX-512 BF16 the format is refused (``weights_unavailable_reason``); its products'
plain-C route still runs, so every test below runs on every machine: the vector route where the CPU
has it, the C route otherwise. Every method equals ``ar`` in this format on near-tie models, a tree
row's logits are one-token-at-a-time decoding's bit for bit, the format's plumbing, its refusal and
``auto``'s never picking it: ``tests/test_quantized.py``, whose tests of those run in every
quantized format.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.products import _LinearQuantBF16
from tests.oracles.blocks import bf16_reference, product_reference, q4_1_reference, q8_0_reference
from tests.test_quantized import _matrix, assert_refused_without, assert_rows_independent

pytestmark = pytest.mark.cpu


def _product(lin, x):
    return lin(torch.from_numpy(np.ascontiguousarray(x))).numpy()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_bf16_products_equal_the_float64_product_of_the_weights_and_inputs_rounded_to_bfloat16(isa, fmt):
    rng = np.random.default_rng(5)
    for n, k, rows in ((1, 32, 1), (5, 64, 3), (13, 96, 4), (37, 64, 33), (9, 64, 130), (6, 576, 3)):
        w = _matrix(rng, n, k, fmt)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        x[0, :3] = (1e-39, -1e-40, 1.0 + 2.0 ** -8)  # subnormals (to zero) and a tie (to even: 1.0)
        lin = _LinearQuantBF16(torch.from_numpy(w), None)
        got, want = _product(lin, x), product_reference(bf16_reference(x), bf16_reference(w))
        scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30), (isa, _native.qmatmul_bf16_isa(), n, k, rows)
    # ... and not the float32 product: the rounding is there (the largest difference is far above float32's)
    assert np.max(np.abs(got - product_reference(x, w)) / (scale + 1e-30)) > 1e-4


def test_rounding_to_bfloat16_goes_to_the_even_significand_on_ties_and_zeroes_subnormals(isa):
    """One weight of 127/128 (a Q8_0 block's d = 2^-7 times 127: exact in bfloat16) picks one input, so each
    output is 127/128 times that input as the route rounded it (the product is exact in float32)."""
    w = np.zeros((1, 32), np.float32)
    w[0, 0] = 127 / 128
    w = q8_0_reference(w)
    assert w[0, 0] == 127 / 128
    lin = _LinearQuantBF16(torch.from_numpy(w), None)
    assert lin.fmt & _native.QMATMUL_BF16
    values = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20, -(1.0 + 2.0 ** -8), 3e-39, -3e-39,
              2.0 ** -125, 65504.0, 1.0 / 3.0]
    rounded = [1.0, 1.0 + 2.0 ** -6, 1.0 + 2.0 ** -7, -1.0, 0.0, 0.0, 2.0 ** -125, 65536.0, 0.333984375]
    x = np.zeros((len(values), 32), np.float32)
    x[:, 0] = values
    assert bf16_reference(x[:, 0]).tolist() == rounded  # the oracle agrees with the values written out
    got = _product(lin, x)[:, 0]
    assert got.tolist() == [float(np.float32(r * 127 / 128)) for r in rounded], (isa, _native.qmatmul_bf16_isa())


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_each_weight_is_its_value_rounded_to_bfloat16(isa, fmt):
    """Rows of the identity pick single weights: the outputs are the weights as the route rounded them, which
    must be the oracle's rounding exactly (to nearest even), whichever way the route forms the bfloat16 values."""
    rng = np.random.default_rng(8)
    w = _matrix(rng, 37, 64, fmt)
    # A block whose values sit on ties of bfloat16 (9 significant bits, the last one set): Q4_1 with d = 2^-8,
    # m = 1 (1 + q / 256, odd q), Q8_0 with d = 3 * 2^-10 (odd q from 127 down: 3q has 9 bits from q = 86).
    if fmt == "q4_1":
        w[2, 32:] = 1 + (np.arange(32) % 16) * 2.0 ** -8
    else:
        w[2, 32:] = (127 - 2 * np.arange(32)) * 3 * 2.0 ** -10
    w = (q4_1_reference if fmt == "q4_1" else q8_0_reference)(w)
    ties = bf16_reference(w[2, 32:]) != w[2, 32:]
    assert ties.sum() >= 8
    lin = _LinearQuantBF16(torch.from_numpy(w), None)
    got = _product(lin, np.eye(64, dtype=np.float32))  # row i: every output's weight i
    assert np.array_equal(got, bf16_reference(w).T), (isa, _native.qmatmul_bf16_isa())
    assert not np.array_equal(got, w.T)


def test_each_row_of_a_bf16_product_is_independent_of_its_batch_bit_for_bit(isa):
    """The same property as the float products': a row alone equals that row in any wider product, on both
    routes (weights rounded in registers for few rows, into a scratch tile for many), at any thread count."""
    assert_rows_independent(lambda w: _LinearQuantBF16(w, None), np.random.default_rng(6))


def test_the_bf16_routes_agree_with_each_other_to_float_rounding():
    rng = np.random.default_rng(7)
    lin = _LinearQuantBF16(torch.from_numpy(_matrix(rng, 21, 128, "q4_1")), None)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    first = _native.qmatmul_isa()
    outs = {}
    try:
        for name in ("c", first):
            _native.qmatmul_force_isa(name)
            outs[_native.qmatmul_bf16_isa()] = _product(lin, x)
    finally:
        _native.qmatmul_force_isa(first)
    assert set(outs) == ({"c", "avx512bf16"} if _native.qmatmul_bf16_native() else {"c"})
    for out in outs.values():
        np.testing.assert_allclose(out, outs["c"], rtol=1e-5, atol=1e-5)


def test_a_cpu_without_bf16_instructions_refuses_the_format_naming_the_fix(tmp_path, monkeypatch):
    assert_refused_without(tmp_path, monkeypatch, "quantized-bf16", "qmatmul_bf16_native", "AVX-512 BF16")
