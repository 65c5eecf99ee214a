"""The "quantized-int8" weight format: the GGUF's blocks against inputs rounded to 8 bits per block of 32,
each block's sum taken in integers (ext/csrc/qmatmul_i8.c, LK_I8).

On a CPU without AVX2 (or AVX-512 VNNI) the format is refused (``weights_unavailable_reason``); its plain-C route
still runs here when a test forces it (``native_or_c``), so every test below runs on every machine: each
route the CPU has (VNNI, AVX2, plain C) through the ``isa`` fixture. Every method equals ``ar`` in this format on
near-tie models, a tree row's logits are one-token-at-a-time decoding's bit for bit, and a prompt's
rows are the same bits however it is split: ``tests/test_quantized.py`` and
``tests/test_prefix_cache.py``, whose tests of those run in every quantized format.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.decoder import Decoder
from lookupdec.products import _LinearQuantI8
from tests.oracles.blocks import int8_rows_reference, product_reference, q8_0_reference
from tests.test_quantized import _blockified, _matrix, assert_refused_without, assert_rows_independent

pytestmark = pytest.mark.cpu


@pytest.fixture
def native_or_c(monkeypatch):
    """Let the format be built here: on a CPU without AVX2 its products take the plain-C route."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)


def _product(lin, x):
    return lin(torch.from_numpy(np.ascontiguousarray(x))).numpy()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_int8_products_equal_the_float64_product_of_the_weights_and_the_inputs_rounded_to_8_bits(isa, fmt):
    rng = np.random.default_rng(5)
    # outputs not a multiple of 16 (a padded group), 1 to 130 rows (every tile and a second pass of rows)
    for n, k, rows in ((1, 32, 1), (5, 64, 3), (13, 96, 4), (37, 64, 33), (16, 64, 8), (9, 64, 130), (70, 576, 7)):
        w = _matrix(rng, n, k, fmt)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        x[0, :32] = 0.0  # an all-zero input block
        lin = _LinearQuantI8(torch.from_numpy(w), None)
        got, want = _product(lin, x), product_reference(int8_rows_reference(x), w)
        scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30), (isa, n, k, rows)
    # ... and not the float32 product: the rounding is there (far above float32's)
    assert np.max(np.abs(got - product_reference(x, w)) / (scale + 1e-30)) > 1e-4


def test_inputs_round_to_the_nearest_step_of_their_block_ties_to_even(isa):
    """32 outputs, output i picking input i with weight 127/128 (Q8_0: d = 2^-7, q = 127): each output is
    127/128 times the input as the route rounded it, exactly. The block's largest magnitude is 127, so its
    step is 1 and the rounding is to integers."""
    w = q8_0_reference(np.eye(32, dtype=np.float32) * (127 / 128))
    assert w[0, 0] == 127 / 128
    lin = _LinearQuantI8(torch.from_numpy(w), None)
    assert lin.fmt & _native.QMATMUL_I8
    values = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.49, -126.5, 0.4999, 100.5001] + [0.0] * 22
    rounded = [127, 0, 2, 2, 0, -2, 3, -126, 0, 101] + [0] * 22
    x = np.array([values, [v / 4 for v in values]], np.float32)  # the second row: a step of 1/4, same integers
    assert np.array_equal(int8_rows_reference(x[:1]), np.array([rounded], np.float32))  # the oracle agrees
    got = _product(lin, x)
    assert got[0].tolist() == [float(np.float32(r * 127 / 128)) for r in rounded], isa
    assert got[1].tolist() == [float(np.float32(r * 127 / 128 / 4)) for r in rounded], isa


def test_each_row_of_an_int8_product_is_independent_of_its_batch_bit_for_bit(isa):
    """A row alone equals that row in any wider product, through every tile (8, 4, 2 and 1 rows; 1 to 4
    groups of 16 outputs), at any thread count, with the other rows changed."""
    assert_rows_independent(lambda w: _LinearQuantI8(w, None), np.random.default_rng(6))


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_int8_routes_give_the_same_bits(fmt):
    """Block sums are integers and the scales are applied in one order, so the VNNI, AVX2 and plain-C routes
    agree exactly, not merely to rounding: every route this CPU has, each named."""
    from tests.conftest import NATIVE_ISAS

    rng = np.random.default_rng(7)
    lin = _LinearQuantI8(torch.from_numpy(_matrix(rng, 53, 128, fmt)), None)
    x = rng.standard_normal((23, 128)).astype(np.float32) * np.float32(3.0)
    x[3, 32:64] = 0.0  # a zero block
    outs = {}
    try:
        for name in NATIVE_ISAS:
            _native.qmatmul_force_isa(name)
            outs[_native.qmatmul_i8_isa()] = _product(lin, x)
    finally:
        _native.qmatmul_force_isa(NATIVE_ISAS[0])
    # AVX-512 without VNNI takes the AVX2 route; every route the CPU has is among those compared
    assert {"c", "avx2"} & set(NATIVE_ISAS) <= set(outs)
    for name, out in outs.items():
        assert np.array_equal(out, outs["c"]), name


def test_repacking_refuses_blocks_of_the_wrong_shape():
    qs, dm = np.zeros((4, 32), np.uint8), np.zeros((4, 4), np.float32)
    assert [a.shape for a in _native.qpack_i8(0, qs, dm, 4, 64)] == [(512,), (64,)]  # one group of 16, 2 blocks
    for args in ((1, qs, dm, 4, 64), (0, qs, dm, 5, 64), (0, qs, dm, 4, 96), (2, qs, dm, 4, 64), (0, qs, dm, 4, 70)):
        with pytest.raises(ValueError, match="qpack_i8"):
            _native.qpack_i8(*args)


def test_the_formats_rounding_reaches_the_logits(native_or_c):
    dec = Decoder(_blockified(0), weights="quantized-int8")
    plain = Decoder(_blockified(0), weights="quantized").verifier
    prompt = [5, 9, 11, 7, 3, 12, 4]
    assert not torch.equal(dec.verifier.prefill(dec.verifier.new_cache(8), prompt),
                           plain.prefill(plain.new_cache(8), prompt))  # the rounding reaches the logits


def test_a_cpu_without_avx2_or_vnni_refuses_the_format_naming_the_fix(tmp_path, monkeypatch):
    assert_refused_without(tmp_path, monkeypatch, "quantized-int8", "qmatmul_i8_native", "AVX2 or AVX-512 VNNI")


def test_q8_0_bytes_of_minus_128_are_summed_exactly_on_every_route():
    """GGML's quantizer never writes -128 into a Q8_0 block, but a file may hold it: the VNNI route reads
    it as 0 (stored plus 128) and the AVX2 route as |q| = 128 against the sign-flipped input, both within
    their integer bounds. Weights of -128 and 127 against inputs of +-127 (the largest pair sums) give the
    exact products on every route."""
    from tests.conftest import NATIVE_ISAS

    n, k = 16, 64
    qs = np.where(np.arange(n * k).reshape(n, k) % 3 == 0, -128, 127).astype(np.int8).view(np.uint8)
    dm = np.full((n, k // 32), 2.0 ** -7, np.float32)
    pq, pdm = _native.qpack_i8(1, np.ascontiguousarray(qs), dm, n, k)
    x = np.where(np.arange(2 * k).reshape(2, k) % 2 == 0, 127.0, -127.0).astype(np.float32)
    x[1] = 127.0  # one block's scale is 1, so the inputs are their own integers
    want = product_reference(x, qs.view(np.int8).astype(np.float32) * np.float32(2.0 ** -7))
    try:
        for name in NATIVE_ISAS:
            _native.qmatmul_force_isa(name)
            y = np.empty((2, n), np.float32)
            _native.qmatmul_ptr(1 | _native.QMATMUL_I8, x.ctypes.data, 2, k, pq.ctypes.data, pdm.ctypes.data, n,
                                y.ctypes.data, 1)
            assert np.array_equal(y, want.astype(np.float32)), (name, _native.qmatmul_i8_isa())
    finally:
        _native.qmatmul_force_isa(NATIVE_ISAS[0])
