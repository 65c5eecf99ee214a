"""The "quantized" weight format: blocks recovered from float32 weights, the native products against their
float64 oracle on every instruction set this CPU has, each row independent of the rest of its batch bit for
bit, and every method equal to ``ar`` in the format (tiny models whose weights went through GGML's quantizer)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.blocks import dequantize, find_blocks
from lookupdec.decoder import Decoder
from lookupdec.fast_forward import FastForward
from tests.oracles.forward import reference_forward
from lookupdec.models import LoadedModel
from lookupdec.products import make_linear
from lookupdec.weights import pick_faster
from tests.conftest import NATIVE_ISAS, TINY_VOCAB, save_tiny, tiny_loaded
from tests.oracles.blocks import blockified_model, product_reference, q4_1_reference, q8_0_reference
from tests.test_decoder_exact import OracleDrafter, RandomDrafter

pytestmark = pytest.mark.cpu  # the quantized format is the fast forward's (CPU only)

def _matrix(rng, n, k, fmt):
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block (d = 0)
    if n > 1:
        w[1, :32] = -np.abs(w[1, :32])  # a block with no positive value
    return q4_1_reference(w) if fmt == "q4_1" else q8_0_reference(w)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_blocks_are_found_back_from_what_ggmls_reference_quantizer_made(fmt):
    rng = np.random.default_rng(0)
    for n, k in ((1, 32), (7, 64), (13, 160)):
        w = _matrix(rng, n, k, fmt)
        blocks = find_blocks(w)
        assert blocks is not None and blocks.shape == (n, k)
        assert np.array_equal(dequantize(blocks), w)  # every value, bit for bit
        if fmt == "q4_1":
            assert blocks.fmt == "q4_1" and blocks.qs.nbytes == n * k // 2
    q8 = find_blocks(_matrix(rng, 5, 64, "q8_0"))
    assert q8.fmt == "q8_0" and q8.qs.nbytes == 5 * 64  # more than 16 levels a block: not Q4_1


def test_matrices_that_are_not_blocks_have_none():
    rng = np.random.default_rng(1)
    w = _matrix(rng, 4, 64, "q4_1")
    assert find_blocks((rng.standard_normal((4, 64))).astype(np.float32)) is None  # a float32 checkpoint
    nudged = w.copy()
    nudged[2, 5] = np.nextafter(nudged[2, 5], np.float32(1))  # one value edited by one ulp
    assert find_blocks(nudged) is None
    assert find_blocks(w[:, :48].copy()) is None  # K not a multiple of 32
    bad = w.copy()
    bad[0, 0] = np.nan
    assert find_blocks(bad) is None
    assert find_blocks(w.astype(np.float64)) is None


def _product(lin, x):
    return lin(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_quantized_products_equal_the_float64_product_of_the_dequantized_weights(isa, fmt):
    rng = np.random.default_rng(2)
    for n, k, rows in ((1, 32, 1), (5, 64, 3), (13, 96, 4), (64, 160, 5), (37, 64, 33), (9, 64, 130), (6, 576, 3),
                       (5, 1056, 7)):
        w = _matrix(rng, n, k, fmt)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        lin = make_linear(torch.from_numpy(w), None, "quantized")
        got, want = _product(lin, x), product_reference(x, w)
        scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T  # float32 rounding is relative to it
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-30), (isa, n, k, rows)
    bias = rng.standard_normal(13).astype(np.float32)
    w = _matrix(rng, 13, 64, fmt)
    lin = make_linear(torch.from_numpy(w), torch.from_numpy(bias), "quantized")
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(_product(lin, x), product_reference(x, w) + bias, rtol=1e-5, atol=1e-5)


def assert_rows_independent(make, rng):
    """Products built by ``make(weight)`` give each row the same bits alone and in any wider product."""
    for fmt in ("q4_1", "q8_0"):
        lin = make(torch.from_numpy(_matrix(rng, 45, 96, fmt)))  # 45 outputs: full tiles of 4 and a remainder
        x = rng.standard_normal((101, 96)).astype(np.float32)  # two passes of rows: 64, then 37
        full = _product(lin, x)
        for r in (0, 5, 36, 47, 48, 100):
            assert np.array_equal(_product(lin, x[r:r + 1]), full[r:r + 1]), (fmt, r)
        for lo, hi in ((0, 2), (20, 23), (3, 7), (10, 19), (40, 93)):  # 2, 3, 4, 9 and 53 rows
            assert np.array_equal(_product(lin, x[lo:hi]), full[lo:hi]), (fmt, lo, hi)
        other = x.copy()
        other[1:] = rng.standard_normal((100, 96))
        assert np.array_equal(_product(lin, other)[0], full[0])
        before = torch.get_num_threads()
        try:
            for threads in (1, 3):
                torch.set_num_threads(threads)
                assert np.array_equal(_product(lin, x), full)
        finally:
            torch.set_num_threads(before)


def assert_refused_without(tmp_path, monkeypatch, weights, flag, needs):
    """A CPU lacking ``needs`` (``lookupdec.products.<flag>`` made False) refuses format ``weights`` in the
    library and in the CLI, naming what it lacks and ``--weights quantized``, with no traceback."""
    import lookupdec.products as products
    from click.testing import CliRunner

    from lookupdec.cli import main

    monkeypatch.setattr(products, flag, lambda: False)
    assert needs in products.weights_unavailable_reason(weights)
    with pytest.raises(ValueError, match=f"{needs}.*use --weights quantized "):
        Decoder(_blockified(0), weights=weights)
    with pytest.raises(ValueError, match=needs):
        make_linear(torch.zeros(4, 32), None, weights)
    bad = CliRunner().invoke(main, ["generate", "--model", save_tiny(tmp_path, 0), "--prompt", "hello",
                                    "--weights", weights])
    assert bad.exit_code == 1 and needs in bad.output and "--weights quantized" in bad.output
    assert "Traceback" not in bad.output


@pytest.mark.parametrize("own_threads", [False, True])
def test_each_row_of_a_quantized_product_is_independent_of_its_batch_bit_for_bit(isa, own_threads):
    """A row computed alone (plain decoding) equals the same row inside a wider product (a verify tree,
    other sequences of a batch, a prefill), on every route (weights dequantized in registers for a few
    rows, in the tall tiles for up to 24 (AVX-512) or 8 (AVX2), into a scratch tile for more), for any thread count and
    with the other rows changed."""
    _native.qmatmul_force_own_threads(own_threads)
    try:
        assert_rows_independent(lambda w: make_linear(w, None, "quantized"), np.random.default_rng(3))
    finally:
        _native.qmatmul_force_own_threads(False)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_tall_tiles_give_the_scratch_tiles_bits_for_every_row_count(isa, fmt):
    """The tall tiles (AVX-512: 8 rows x 2 outputs a tile; AVX2: 8 rows x 1 output) and the scratch
    tile they replace sum each output in the same order: the same bits for every row count that
    crosses a tall tile's edge (up to 24 rows here, beyond the AVX2 default of 8, so several tall
    passes run), with a remainder of outputs (45: full tiles of 4, then 1), and the same as each row
    alone (the 1-row register tile)."""
    rng = np.random.default_rng(6)
    lin = make_linear(torch.from_numpy(_matrix(rng, 45, 160, fmt)), None, "quantized")
    before = _native.qmatmul_tall_rows()
    try:
        for rows in (5, 7, 8, 9, 16, 17, 23, 24, 25):
            x = rng.standard_normal((rows, 160)).astype(np.float32)
            _native.qmatmul_tall_rows(24)
            tall = _product(lin, x)
            _native.qmatmul_tall_rows(0)
            scratch = _product(lin, x)
            assert np.array_equal(tall, scratch), (isa, fmt, rows)
            alone = np.concatenate([_product(lin, x[r:r + 1]) for r in range(rows)])
            assert np.array_equal(tall, alone), (isa, fmt, rows)
    finally:
        _native.qmatmul_tall_rows(before)


def test_forcing_an_instruction_set_resets_its_tall_tile_limit(isa):
    """The tall-row limit belongs to the instruction set: forcing one again drops an override, and the
    plain C route has no tall tiles."""
    default = _native.qmatmul_tall_rows(3)
    assert _native.qmatmul_force_isa(isa)
    assert _native.qmatmul_tall_rows() == default
    assert (default > 4) == (isa != "c")


def test_the_instruction_sets_agree_with_each_other_to_float_rounding():
    rng = np.random.default_rng(4)
    w = _matrix(rng, 21, 128, "q4_1")
    x = rng.standard_normal((6, 128)).astype(np.float32)
    lin = make_linear(torch.from_numpy(w), None, "quantized")
    outs = {}
    try:
        for name in NATIVE_ISAS:
            _native.qmatmul_force_isa(name)
            outs[name] = _product(lin, x)
    finally:
        _native.qmatmul_force_isa(NATIVE_ISAS[0])
    for name in NATIVE_ISAS:
        np.testing.assert_allclose(outs[name], outs["c"], rtol=1e-5, atol=1e-5)
    assert _native.qmatmul_isa() == NATIVE_ISAS[0]


def test_products_run_on_the_openmp_team_torch_loaded():
    """Where torch brought an OpenMP runtime, the products share its threads (our own pool beside it spins
    against torch's idle threads on the same cores)."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    loaded = any(name in maps for name in ("/libgomp", "/libiomp", "/libomp"))
    assert _native.qmatmul_threads() == ("openmp" if loaded else "threads")


def test_a_quantized_fast_forward_computes_the_blockified_models_own_logits():
    lm = tiny_loaded(0)
    model = blockified_model(lm.model)
    ff = FastForward(model, weights="quantized")
    assert ff.weights == "quantized" and ff.lm_head.weights == "quantized"
    ids = torch.tensor(np.random.default_rng(0).integers(3, TINY_VOCAB, 20))
    cache = ff.new_cache(32)
    got = ff.forward(cache, ids, torch.arange(20), None, list(range(20)), causal=True)
    torch.testing.assert_close(got, reference_forward(model, ids.tolist()), atol=1e-4, rtol=1e-5)


def _blockified(seed, scale=1.0, stored="quantized"):
    lm = tiny_loaded(seed, scale=scale)
    return LoadedModel(blockified_model(lm.model), lm.tokenizer, lm.name, lm.eos_ids, lm.max_context, stored)


@pytest.mark.parametrize("weights", ["quantized", "quantized-bf16", "quantized-int8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantized_trees_equal_quantized_ar_on_unscaled_weights_with_near_ties(seed, weights, monkeypatch):
    """In every format on the GGUF's blocks (quantized-bf16 and quantized-int8 on their plain-C routes where
    the CPU lacks AVX-512 BF16 or VNNI), every method, alone and batched, equals ``ar`` in the same format."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_bf16_native", lambda: True)
    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)
    lm = _blockified(seed)
    dec = Decoder(lm, weights=weights, draft_budget=24)
    assert dec.weights == weights and dec.verifier.fast.weights == weights
    prompt = np.random.default_rng(seed).integers(3, TINY_VOCAB, 30).tolist()
    ar = dec.generate(prompt, method="ar", max_new_tokens=64)
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + list(ar.token_ids)])).logits[0]
    top2 = torch.topk(logits[len(prompt) - 1:-1], 2).values
    assert float((top2[:, 0] - top2[:, 1]).min()) < 5e-3  # near-ties are there
    for depth in (2, 6):
        out = dec.generate(prompt, max_new_tokens=64, drafter=OracleDrafter(list(ar.token_ids), depth, seed))
        assert out.token_ids == ar.token_ids and out.steps < ar.steps
    assert dec.generate(prompt, max_new_tokens=64, drafter=RandomDrafter(seed, size=24)).token_ids == ar.token_ids
    for method in ("pld", "recycle", "lookahead", "auto"):
        assert dec.generate(prompt, method=method, max_new_tokens=64).token_ids == ar.token_ids, method
    short = dec.generate(prompt[:11], method="ar", max_new_tokens=40).token_ids
    for method in ("pld", "auto"):
        together = dec.generate_batch([prompt, prompt[:11]], method=method, max_new_tokens=40, batch_size=2)
        assert together[0].token_ids == ar.token_ids[:40] and together[1].token_ids == short, method


def test_auto_times_the_quantized_format_where_the_weights_are_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    dec = Decoder(_blockified(0))
    assert set(dec.weights_choice.ms) == {"float32", "float16", "quantized"}
    assert dec.weights == pick_faster(dec.weights_choice.ms) == dec.verifier.fast.weights


@pytest.mark.parametrize("weights,head", [("quantized-bf16", "quantized"), ("quantized-int8", "quantized-int8")])
def test_a_rounded_format_is_every_layers_product_and_its_own_lm_head_choice(weights, head, monkeypatch):
    """quantized-bf16 rounds the layers' products and keeps lm_head in float32 products; quantized-int8
    rounds every product's inputs, lm_head's included. Either way the step runs in one native call with
    its lm_head, and the format has its own cost curve."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_bf16_native", lambda: True)  # the C routes where needed
    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)
    dec = Decoder(_blockified(0), weights=weights)
    fast = dec.verifier.fast
    assert dec.weights == fast.weights == weights and fast.layer_table is not None
    assert all(p.weights == weights for layer in fast.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
    assert fast.lm_head.weights == head and fast.native is not None and fast.native.has_head
    assert dec.cost_curve().key != Decoder(_blockified(0), weights="quantized").cost_curve().key


def test_auto_never_picks_a_format_that_changes_the_model(tmp_path, monkeypatch):
    """Rounding the weights (bfloat16) or the inputs (8 bits) changes the model, so ``auto`` times neither
    format (as it never picks float16 for a float32 model), even where the CPU runs both."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_bf16_native", lambda: True)
    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    dec = Decoder(_blockified(0))
    assert not {"quantized-bf16", "quantized-int8"} & set(dec.weights_choice.ms)
    assert dec.weights not in ("quantized-bf16", "quantized-int8")


def test_quantized_weights_for_a_model_without_blocks_are_a_user_error_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match="Q4_1 or Q8_0"):
        Decoder(tiny_loaded(0), weights="quantized")
    from click.testing import CliRunner

    from lookupdec.cli import main

    bad = CliRunner().invoke(main, ["generate", "--model", save_tiny(tmp_path, 0), "--prompt", "hello",
                                    "--weights", "quantized"])
    assert bad.exit_code == 1 and "Q4_1 or Q8_0" in bad.output and "Traceback" not in bad.output


@pytest.mark.slow
def test_embedded_model_quantized_equals_its_float32_weights_and_methods_equal_ar(real_loaded):
    """The embedded GGUF's matrices are Q4_1 (layers) and Q8_0 (embedding / lm_head): the format finds all of
    them, and greedy decoding in it equals float32's here and every method equals its own ar."""
    dec = Decoder(real_loaded, weights="quantized")
    kinds = {lin.fmt for layer in dec.verifier.fast.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)}
    assert kinds == {_native.QMATMUL_FORMATS["q4_1"]} and dec.verifier.fast.lm_head.fmt == _native.QMATMUL_FORMATS["q8_0"]
    ref = Decoder(real_loaded, weights="float32")
    for text in ("Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
                 "Write a Python function that returns the squares of a list of numbers."):
        ids = dec.encode(text)
        ar = dec.generate(ids, method="ar", max_new_tokens=40)
        assert ar.token_ids == ref.generate(ids, method="ar", max_new_tokens=40).token_ids
        for method in ("pld", "auto"):
            assert dec.generate(ids, method=method, max_new_tokens=40).token_ids == ar.token_ids, method


@pytest.mark.parametrize("weights", ["quantized", "quantized-bf16", "quantized-int8"])
def test_every_tree_row_is_the_bits_of_one_token_at_a_time_decoding(isa, weights, monkeypatch):
    """With quantized weights (any of the formats) every step of the fast forward treats rows alone (the products,
    the norms and the native attention), so a verified tree node's logits are exactly those of feeding its
    root-to-node chain one token per forward, as ``ar`` does: not merely close."""
    import lookupdec.products as products
    from lookupdec.verify import TreeVerifier
    from tests.test_fast_forward import verified_trees

    monkeypatch.setattr(products, "qmatmul_bf16_native", lambda: True)  # quantized-bf16: the C route where needed
    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)  # quantized-int8: likewise
    verifier = TreeVerifier(_blockified(0).model, fast=True, weights=weights)
    for prompt, root, tree, res in verified_trees(verifier, sizes=(2, 9, 20, 40)):
        for i in range(len(tree)):
            chain = verifier.new_cache(64)
            verifier.prefill(chain, prompt)
            for j, token in enumerate([root] + tree.path_tokens(i)):
                logits = verifier.fast.forward(chain, torch.tensor([token]), torch.tensor([len(prompt) + j]), None,
                                               [0])
            assert torch.equal(res.logits[1 + i], logits[0]), (len(tree), i)
