"""The float16 KV cache (``Decoder(kv_dtype="float16")``, ``--kv-dtype float16``): every method, alone,
batched and through the server, equals ``ar`` with the same cache; a tree row is the bits of decoding its
chain one token at a time; the cache holds half the bytes and has its own cost curve; what cannot take it
says so. The kernel itself is tested in tests/test_attention_half.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.decoder import Decoder
from tests.conftest import TINY_VOCAB, save_tiny, tiny_loaded
from tests.test_decoder_exact import OracleDrafter, RandomDrafter
from tests.test_quantized import _blockified

pytestmark = pytest.mark.cpu  # the fast forward's cache (CPU only)


@pytest.mark.parametrize("weights", ["quantized", "quantized-int8", "float32"])
def test_every_method_alone_and_batched_equals_ar_with_a_float16_cache(weights, monkeypatch):
    """Unscaled weights with near-ties (the GGUF's blocks; float32 on the same model), greedy and sampled."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)  # the plain-C route where the CPU lacks VNNI
    dec = Decoder(_blockified(0), weights=weights, draft_budget=24, kv_dtype="float16")
    assert dec.verifier.fast.kv_dtype == "float16"
    prompt = np.random.default_rng(0).integers(3, TINY_VOCAB, 30).tolist()
    ar = dec.generate(prompt, method="ar", max_new_tokens=64)
    for depth in (2, 6):
        out = dec.generate(prompt, max_new_tokens=64, drafter=OracleDrafter(list(ar.token_ids), depth, 0))
        assert out.token_ids == ar.token_ids and out.steps < ar.steps
    assert dec.generate(prompt, max_new_tokens=64, drafter=RandomDrafter(0, size=24)).token_ids == ar.token_ids
    for method in ("pld", "recycle", "lookahead", "auto"):
        assert dec.generate(prompt, method=method, max_new_tokens=64).token_ids == ar.token_ids, method
    sampled = {m: dec.generate(prompt, method=m, max_new_tokens=48, temperature=0.8, top_p=0.9, seed=5).token_ids
               for m in ("ar", "pld", "auto")}
    assert sampled["pld"] == sampled["ar"] and sampled["auto"] == sampled["ar"]
    short = dec.generate(prompt[:11], method="ar", max_new_tokens=40).token_ids
    together = dec.generate_batch([prompt, prompt[:11]], method="auto", max_new_tokens=40, batch_size=2)
    assert together[0].token_ids == ar.token_ids[:40] and together[1].token_ids == short


def test_a_float16_cache_keeps_half_the_bytes_rounded_and_has_its_own_cost_curve(tmp_path, monkeypatch):
    """Its rows are the float32 cache's rows rounded to float16 (the prompt's keys and values come from the
    same forward), its logits close to float32's but not the same, and its curve is measured apart."""
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    half = Decoder(_blockified(0), weights="quantized", kv_dtype="float16")
    full = Decoder(_blockified(0), weights="quantized")
    prompt = np.random.default_rng(1).integers(3, TINY_VOCAB, 40).tolist()
    caches = [d.verifier.new_cache(48) for d in (half, full)]
    logits = [d.verifier.prefill(c, prompt) for d, c in zip((half, full), caches)]
    assert caches[0].kv.dtype == torch.float16 and caches[0].kv.nbytes * 2 == caches[1].kv.nbytes
    # the first layer's keys and values come from the same inputs: exactly float32's, rounded
    assert torch.equal(caches[0].kv[0, :, :, :40], caches[1].kv[0, :, :, :40].half())
    assert not torch.equal(logits[0], logits[1])
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0.05)
    assert half.cost_curve().key != full.cost_curve().key
    assert "KV cache float16" in half.cost_curve().measured_for


def test_a_float16_cache_without_the_fast_forward_or_of_another_type_is_a_user_error_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match="--kv-dtype float32"):
        Decoder(tiny_loaded(0), hf_kernels=True, kv_dtype="float16")
    with pytest.raises(ValueError, match="kv_dtype must be one of float32, float16"):
        Decoder(tiny_loaded(0), kv_dtype="bfloat16")
    from click.testing import CliRunner

    from lookupdec.cli import main

    model = save_tiny(tmp_path, 0)
    bad = CliRunner().invoke(main, ["generate", "--model", model, "--prompt", "hello", "--hf-kernels",
                                    "--kv-dtype", "float16"])
    assert bad.exit_code == 1 and "--kv-dtype float32" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(main, ["generate", "--model", model, "--prompt", "hello", "--kv-dtype", "int8"])
    assert bad.exit_code == 2 and "--kv-dtype" in bad.output


def test_the_cli_and_the_server_decode_with_a_float16_cache_as_the_library_does(tmp_path):
    """`generate --kv-dtype float16` prints what the library gives; a server started with it answers what
    the library's ``ar`` gives with the same cache, for requests alone and several at once."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    import json

    from click.testing import CliRunner

    from lookupdec.cli import main
    from tests.server_proc import ServerProcess

    model = save_tiny(tmp_path, 0)
    dec = Decoder(model, kv_dtype="float16")
    prompts = ["abcabc abcabc", "hello world, hello", "The cat sat on the mat. The cat"]
    want = [dec.generate(p, method="ar", max_new_tokens=24).text for p in prompts]
    out = CliRunner().invoke(main, ["generate", "--model", model, "--prompt", prompts[0], "--kv-dtype", "float16",
                                    "--max-new-tokens", "24", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.strip().splitlines()[-1])["text"] == want[0]
    srv = ServerProcess(["--model", model, "--kv-dtype", "float16", "--max-batch", "3"])
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        import concurrent.futures as cf

        def ask(p):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": p}], max_tokens=24,
                                               temperature=0)
            return r.choices[0].message.content

        import httpx

        health = httpx.get(srv.url + "/health", timeout=30).json()["kv_cache"]
        assert health == {"dtype": "float16", "bytes_per_token": dec.verifier.fast.kv_bytes_per_token}
        assert 2 * health["bytes_per_token"] == Decoder(model).verifier.fast.kv_bytes_per_token
        assert ask(prompts[0]) == want[0]
        with cf.ThreadPoolExecutor(3) as pool:
            assert list(pool.map(ask, prompts)) == want
    finally:
        srv.kill()


def test_serve_load_checks_a_float16_cache_against_plain_decoding_with_the_same_cache():
    import os
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from serve_load import CONFIGS, reference_config

    assert reference_config("auto_kv16") == reference_config("ar_kv16") == "ar_kv16"
    assert reference_config("auto") == reference_config("one") == "ar"
    assert all(CONFIGS[c][2] == ("--kv-dtype", "float16") for c in ("auto_kv16", "ar_kv16"))


@pytest.mark.parametrize("weights", ["quantized", "float32"])
def test_a_model_whose_keys_float16_cannot_hold_is_refused_naming_the_fix(weights, tmp_path):
    """The first layer's norm scaled by 1e6: its keys and values reach ~1e5, which float16 cannot hold. A float16
    cache refuses them (the native chunks in the quantized format, torch's SDPA prefill in float32) with a
    message naming --kv-dtype float32; the float32 cache decodes the same model; the CLI exits 1 cleanly."""
    lm = _blockified(0)
    lm.model.model.layers[0].input_layernorm.weight.data *= 1e6
    prompt = np.random.default_rng(0).integers(3, TINY_VOCAB, 20).tolist()
    with pytest.raises(ValueError, match="float16's range.*--kv-dtype float32"):
        Decoder(lm, weights=weights, kv_dtype="float16").generate(prompt, method="ar", max_new_tokens=4)
    assert len(Decoder(lm, weights=weights).generate(prompt, method="ar", max_new_tokens=4).token_ids) == 4
    if weights != "float32":
        return
    from click.testing import CliRunner

    from lookupdec.cli import main
    from tests.conftest import char_tokenizer

    lm.model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    out = CliRunner().invoke(main, ["generate", "--model", str(tmp_path), "--prompt", "hello there", "--kv-dtype",
                                    "float16", "--max-new-tokens", "4"])
    assert out.exit_code == 1 and "--kv-dtype float32" in out.output and "Traceback" not in out.output
