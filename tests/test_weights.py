"""Weight formats of the fast forward: float16 products against their oracle, exactness against ``ar``
in the same format (unscaled weights with near-ties included), and the rule ``auto`` picks by."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lookupdec.decoder import Decoder
from lookupdec.fast_forward import FastForward
from tests.oracles.forward import reference_forward
from lookupdec.products import MIN_PRODUCT_ROWS, _LinearF16, make_linear
from lookupdec.models import LoadedModel
from lookupdec.weights import WeightsChoice, auto_candidates, pick_faster
from tests.conftest import TINY_VOCAB, char_tokenizer, load_benchmark, save_tiny, tiny_loaded, tiny_model
from tests.oracles.weights import linear_reference, rounded_model
from tests.test_decoder_exact import OracleDrafter, RandomDrafter

pytestmark = pytest.mark.cpu  # weight formats are the fast forward's (CPU only)


@pytest.mark.parametrize("bias", [False, True])
def test_float16_linear_equals_the_float64_product_of_float16_rounded_weights(bias):
    g = torch.Generator().manual_seed(1)
    for out_f, in_f in ((200, 72), (40, 576), (7, 1536)):
        w = torch.randn(out_f, in_f, generator=g) * 0.3
        b = torch.randn(out_f, generator=g) if bias else None
        lin = make_linear(w, b, "float16")
        for rows in (1, 2, 3, 5, 17, 64):
            x = torch.randn(rows, in_f, generator=g)
            y = lin(x)
            assert y.dtype == torch.float32 and y.shape == (rows, out_f)
            ref16, ref32 = linear_reference(x, w, b, "float16"), linear_reference(x, w, b, "float32")
            # float32 accumulation over in_f terms: a few ulps of the sum of |terms|
            scale = (x.abs().double() @ w.abs().double().T)
            assert float(((y.double() - ref16).abs() / scale).max()) < 1e-6
            # ... and the weights really are rounded: the float32 product is well beyond that bound
            assert float(((y.double() - ref32).abs() / scale).max()) > 5e-6
    # a non-contiguous input gives the same rows
    x = torch.randn(9, 2 * 72, generator=g)[:, ::2]
    w = torch.randn(30, 72, generator=g)
    torch.testing.assert_close(make_linear(w, None, "float16")(x), make_linear(w, None, "float16")(x.contiguous()),
                               atol=0, rtol=0)


def test_float16_small_products_round_like_the_same_rows_of_wider_ones():
    """Padded or not (the probe decides per CPU), a product of 1-3 rows equals those rows inside products
    of 4-6 rows bit for bit, so a one-row ar step rounds like a row of a small verify forward."""
    g = torch.Generator().manual_seed(7)
    for out_f, in_f in ((960, 576), (576, 1536), (200, 72)):
        lin = make_linear(torch.randn(out_f, in_f, generator=g) * 0.1, None, "float16")
        assert lin.min_rows in (1, MIN_PRODUCT_ROWS)
        x = torch.randn(6, in_f, generator=g)
        for width in (4, 5, 6):
            wide = lin(x[:width])
            for r in (1, 2, 3):
                assert torch.equal(lin(x[:r]), wide[:r]), (out_f, in_f, width, r)


def test_float16_pads_small_products_where_the_probe_finds_them_rounding_differently(monkeypatch):
    import lookupdec.products as ffm

    monkeypatch.setattr(ffm, "_small_products_round_alike", lambda packed, in_features: False)
    w = torch.randn(30, 72)
    lin = make_linear(w, None, "float16")
    assert lin.min_rows == MIN_PRODUCT_ROWS
    x = torch.randn(2, 72)
    padded = torch.cat([x, torch.zeros(MIN_PRODUCT_ROWS - 2, 72)])
    assert torch.equal(lin(x), torch.ops.quantized.linear_dynamic_fp16(padded, lin.packed)[:2])


def test_weights_float16_cannot_hold_are_refused_with_the_fix():
    w = torch.randn(8, 8)
    w[3, 3] = 1e5
    with pytest.raises(ValueError, match="float32"):
        make_linear(w, None, "float16")
    with pytest.raises(ValueError, match="float16"):
        make_linear(w, None, "int8")


def test_every_product_of_a_float16_fast_forward_uses_float16_weights():
    """q/k/v, o, gate/up, down and lm_head: the logits equal transformers' forward of the model with every
    linear weight rounded to float16, and differ from the unrounded model's."""
    model = tiny_model(3)
    ff = FastForward(model, weights="float16")
    assert ff.weights == "float16" and isinstance(ff.lm_head, _LinearF16)
    assert all(isinstance(p, _LinearF16) for layer in ff.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
    ids = [5, 9, 17, 33, 5, 9, 60, 2, 101]
    cache = ff.new_cache(16)
    got = ff.forward(cache, torch.tensor(ids), torch.arange(len(ids)), None, slice(0, len(ids)), causal=True)
    want16 = reference_forward(rounded_model(model, "float16"), ids)
    want32 = reference_forward(model, ids)
    torch.testing.assert_close(got, want16, atol=2e-4, rtol=1e-5)
    assert float((got - want32).abs().max()) > 10 * float((got - want16).abs().max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float16_trees_equal_float16_ar_on_unscaled_weights_with_near_ties(seed):
    """transformers' initialisation (scale 1): top-two logits nearly tie along the output, where a verify
    row rounding differently from ar's one-row step would flip a token first."""
    lm = tiny_loaded(seed, scale=1.0)
    dec = Decoder(lm, weights="float16", draft_budget=24)
    assert dec.weights == "float16" and dec.verifier.fast.weights == "float16"
    prompt = np.random.default_rng(seed).integers(3, TINY_VOCAB, 30).tolist()
    ar = dec.generate(prompt, method="ar", max_new_tokens=64)
    with torch.no_grad():
        logits = rounded_model(lm.model, "float16")(torch.tensor([prompt + list(ar.token_ids)])).logits[0]
    top2 = torch.topk(logits[len(prompt) - 1:-1], 2).values
    assert float((top2[:, 0] - top2[:, 1]).min()) < 2e-3  # the near-ties are there
    for depth in (2, 6):
        out = dec.generate(prompt, max_new_tokens=64, drafter=OracleDrafter(list(ar.token_ids), depth, seed))
        assert out.token_ids == ar.token_ids and out.steps < ar.steps
    out = dec.generate(prompt, max_new_tokens=64, drafter=RandomDrafter(seed, size=24))
    assert out.token_ids == ar.token_ids
    for method in ("pld", "recycle", "lookahead"):
        assert dec.generate(prompt, method=method, max_new_tokens=64).token_ids == ar.token_ids, method


def test_float16_batched_decoding_equals_each_request_alone():
    lm = tiny_loaded(5, scale=1.0)
    dec = Decoder(lm, weights="float16")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, TINY_VOCAB, n).tolist() for n in (4, 19, 33)]
    alone = [dec.generate(p, method="pld", max_new_tokens=40).token_ids for p in prompts]
    together = dec.generate_batch(prompts, method="pld", max_new_tokens=40, batch_size=3)
    assert [r.token_ids for r in together] == alone
    assert alone == [dec.generate(p, method="ar", max_new_tokens=40).token_ids for p in prompts]


def test_an_owned_model_in_float16_decodes_as_a_callers_copy_and_keeps_one_copy(tmp_path):
    owned = Decoder(save_tiny(tmp_path, 0), weights="float16")
    kept = tiny_model(0)
    before = {k: v.clone() for k, v in kept.state_dict().items()}
    ref = Decoder(LoadedModel(kept, char_tokenizer(), "kept", (2,), 256), weights="float16")
    assert all(torch.equal(v, kept.state_dict()[k]) for k, v in before.items())  # a caller's model is unchanged
    linear = sum(p.numel() for name, p in kept.named_parameters() if "proj" in name or "lm_head" in name)
    assert sum(p.numel() for p in owned.model.parameters()) == sum(p.numel() for p in kept.parameters()) - linear
    prompt = [5, 6, 7, 8, 5, 6]
    for method in ("ar", "pld"):
        assert owned.generate(prompt, method=method, max_new_tokens=30).token_ids == \
            ref.generate(prompt, method=method, max_new_tokens=30).token_ids


def test_auto_keeps_float32_for_models_not_stored_in_float16_or_quantized():
    for stored in ("", "float32", "bfloat16"):
        lm = tiny_loaded(0)
        dec = Decoder(LoadedModel(lm.model, lm.tokenizer, lm.name, lm.eos_ids, lm.max_context, stored))
        assert dec.weights == "float32" and "offered" in dec.weights_choice.reason and not dec.weights_choice.ms
    assert auto_candidates("float16") == ("float32", "float16")
    assert auto_candidates("quantized") == ("float32", "float16", "quantized")
    assert auto_candidates("bfloat16") == ("float32",)


def test_auto_measures_quantized_models_once_and_caches_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    lm = tiny_loaded(0)
    quantized = LoadedModel(lm.model, lm.tokenizer, lm.name, lm.eos_ids, lm.max_context, "quantized")
    first = Decoder(quantized)
    choice = first.weights_choice
    assert not choice.cached and set(choice.ms) == {"float32", "float16"}
    assert all(len(v) == 2 and min(v) > 0 for v in choice.ms.values())
    assert first.weights == pick_faster(choice.ms) == first.verifier.fast.weights
    files = list((tmp_path / "costs").glob("weights-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["weights"] == first.weights
    again = Decoder(quantized)
    assert again.weights_choice.cached and again.weights == first.weights
    # A damaged choice file is measured over, never a crash (10**400 raised OverflowError).
    good = files[0].read_text()
    for damaged in ('"x"', "[]", "{",
                    json.dumps({**json.loads(good), "ms": {"float32": [10 ** 400, 1.0]}})):
        files[0].write_text(damaged)
        assert not Decoder(quantized).weights_choice.cached
    # the curve of each format is its own
    from lookupdec.costs import curve_description, curve_path

    other = Decoder(lm, weights="float16" if first.weights == "float32" else "float32")
    assert curve_path(other.verifier, 1) != curve_path(first.verifier, 1)
    assert f"weights {other.weights}" in curve_description(other.verifier, 1)


def test_build_verifier_prepares_the_model_only_to_time_the_formats(tmp_path):
    """``prepare`` (``LoadedModel.materialize`` in the Decoder) runs before the formats are timed, which
    reads every weight of the first layers; a cached choice or a format asked for times nothing."""
    from lookupdec.verify import TreeVerifier
    from lookupdec.weights import build_verifier

    model = tiny_loaded(0).model
    calls = []

    def build(fmt):
        calls.append(fmt)
        return TreeVerifier(model, fast=True, weights=fmt)

    def run(weights):
        calls.clear()
        return build_verifier(build, model, weights=weights, stored="quantized", fast=True, threads=1,
                              cache_dir=tmp_path, prepare=lambda: calls.append("prepare"))[1]

    first = run("auto")
    assert not first.cached and calls == ["prepare", first.weights]
    assert run("auto").cached and calls == [first.weights]
    run("float16")
    assert calls == ["float16"]


def test_pick_faster_prefers_float32_on_a_tie():
    assert pick_faster({"float16": (10.0, 20.0), "float32": (10.0, 20.0)}) == "float32"
    assert pick_faster({"float16": (10.0, 19.0), "float32": (10.0, 20.0)}) == "float16"
    assert pick_faster({"float16": (10.0, 21.0), "float32": (10.0, 20.0)}) == "float32"
    assert WeightsChoice("float32", "x").ms == {}


def test_bad_weight_formats_are_user_errors_naming_the_fix():
    with pytest.raises(ValueError, match="auto, float32, float16"):
        Decoder("no/such/model/dir", weights="int4")  # checked before the model loads
    with pytest.raises(ValueError, match="--weights float32"):
        Decoder(tiny_loaded(0), weights="float16", hf_kernels=True)
    dec = Decoder(tiny_loaded(0), hf_kernels=True)  # auto on transformers' forward: no format
    assert dec.weights == "" and dec.verifier.backend == "hf"


def test_cli_generate_takes_weights(tmp_path):
    from click.testing import CliRunner

    from lookupdec.cli import main

    d = save_tiny(tmp_path, 0)
    ok = CliRunner().invoke(main, ["generate", "--model", d, "--prompt", "hello", "--method", "ar",
                                   "--max-new-tokens", "5", "--weights", "float16", "--json"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(main, ["generate", "--model", d, "--prompt", "hello", "--weights", "int4"])
    assert bad.exit_code == 2 and "int4" in bad.output


def test_the_float16_exactness_audit_runs_every_method_without_a_mismatch(tmp_path):
    """benchmarks/exactness.py --weights float16 (what the full audit runs on the embedded model), at tiny scale
    on unscaled weights: every registered method, draft included, equals ar in float16."""
    from lookupdec.methods import METHODS

    ex = load_benchmark("exactness")
    from lookupdec.index.build import build_index

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(ex.REFRAINS * 4) + "\n" + ex.prompt_set(8)[0].text)
    build_index([corpus], tmp_path / "idx", tokenizer=char_tokenizer(), progress=False)  # for rest
    out = tmp_path / "a.json"
    rc = ex.main(["--model", save_tiny(tmp_path / "m", 1, scale=1.0), "--n", "8", "--max-len", "24",
                  "--width-prompts", "0", "--draft-layers", "1", "--weights", "float16", "--index",
                  str(tmp_path / "idx"), "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and data["config"]["weights_used"] == "float16"
    assert set(data["methods"]) == set(METHODS) - {"ar"}
    assert all(not m["mismatches"] for m in data["methods"].values())
    # llma runs on the prompts that carry references (summarization, RAG); every other method on all 8
    assert data["methods"].pop("llma")["generations"] >= 1
    assert all(m["generations"] == 8 for m in data["methods"].values())


def _tiny_gguf(path, kinds):
    from gguf import GGUFWriter

    from tests.conftest import add_gguf_tensor

    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # metadata of every kind is skipped
    w.add_string("general.name", "tiny")
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_tensor("norm.weight", np.ones(64, np.float32))  # 1-D tensors do not count
    for i, kind in enumerate(kinds):
        add_gguf_tensor(w, f"m{i}.weight", rng.standard_normal((4, 64)).astype(np.float32), kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_header_reader_agrees_with_the_gguf_package_and_classifies_storage(tmp_path):
    import gguf

    from lookupdec.gguf_info import gguf_tensor_types, gguf_weight_storage

    path = _tiny_gguf(tmp_path / "a.gguf", ["F32", "F16", "Q8_0", "Q4_0"])
    want = {t.name: (int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in gguf.GGUFReader(path).tensors}
    assert gguf_tensor_types(path) == want
    assert gguf_weight_storage(path) == "float32"
    assert gguf_weight_storage(_tiny_gguf(tmp_path / "b.gguf", ["Q8_0", "F16", "Q4_0"])) == "quantized"
    assert gguf_weight_storage(_tiny_gguf(tmp_path / "c.gguf", ["F16", "F16"])) == "float16"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x05" * 10)
    with pytest.raises(ValueError, match="GGUF"):
        gguf_tensor_types(str(bad))


@pytest.mark.slow
def test_embedded_model_methods_equal_ar_in_float16(real_loaded):
    dec = Decoder(real_loaded, weights="float16")
    assert dec.weights == "float16"
    for text in ("Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
                 "Write a Python function that returns the squares of a list of numbers."):
        ids = dec.encode(text)
        ar = dec.generate(ids, method="ar", max_new_tokens=40)
        for method in ("pld", "auto"):
            assert dec.generate(ids, method=method, max_new_tokens=40).token_ids == ar.token_ids, method


@pytest.mark.slow
def test_embedded_model_peak_memory_is_within_1_2x_of_transformers_own_loader(tmp_path):
    """Issue 18/19's bound, first run on a machine (empty cache: the format choice and the cost curve are
    measured in the process): Decoder().generate() against from_pretrained(gguf_file=...) + generate()."""
    mem = load_benchmark("memory")
    base = mem.probe("transformers", None, 8, 2, None)
    ours = mem.probe("lookupdec:auto", None, 8, 2, str(tmp_path))
    assert base["new_tokens"] > 0 and ours["new_tokens"] > 0
    assert ours["peak_mib"] <= 1.2 * base["peak_mib"], (ours, base)
