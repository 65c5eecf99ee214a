"""benchmarks/exactness.py runs end to end, and catches a method whose output differs from ar's."""
from __future__ import annotations

import json

import pytest

from tests.conftest import TEST_DEVICE, load_benchmark, save_tiny


@pytest.fixture(scope="module")
def ex():
    return load_benchmark("exactness")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return save_tiny(d, 0, scale=1.0)


def test_the_prompt_set_mixes_every_kind_and_length(ex):
    ps = ex.prompt_set(200)
    kinds = {p.kind.split(":")[0] for p in ps}
    assert kinds == {"specbench", "code", "repetitive", "completion"}
    assert max(p.max_new for p in ps) == 512 and min(p.max_new for p in ps) == 32
    assert any(p.references for p in ps) and any(not p.chat for p in ps)
    assert ex.prompt_set(50, seed=1) == ex.prompt_set(50, seed=1)
    # Even a short audit covers every Spec-Bench task (the question file is grouped by task).
    tasks = {p.kind.split(":")[1] for p in ex.prompt_set(24) if p.kind.startswith("specbench:")}
    assert tasks == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}


def test_the_audit_runs_every_method_and_writes_json(ex, model_dir, tmp_path):
    from lookupdec.methods import METHODS

    out = tmp_path / "a.json"
    # --draft-layers 1: the model's first layer drafts, so method draft is audited too.
    rc = ex.main(["--model", model_dir, "--n", "8", "--max-len", "16", "--width-prompts", "1", "--draft-layers", "1",
                  "--json", str(out)])
    data = json.loads(out.read_text())
    # The fast forward is CPU code: on a GPU (LOOKUPDEC_TEST_DEVICE) the audit runs transformers' forward.
    assert rc == 0 and data["config"]["backend"] == ("fast" if TEST_DEVICE == "cpu" else "hf")
    assert set(data["methods"]) == set(METHODS) - {"ar"}
    assert data["methods"]["pld"]["generations"] == 8 and data["methods"]["auto"]["tokens"] > 0
    assert data["methods"]["draft"]["generations"] == 8
    assert all(not m["mismatches"] for m in data["methods"].values())
    assert data["widths"]["root"]["compared"] > 0


def test_a_sampled_audit_compares_every_method_but_draft_with_sampled_ar(ex, model_dir, tmp_path):
    out = tmp_path / "s.json"
    rc = ex.main(["--model", model_dir, "--n", "6", "--max-len", "16", "--width-prompts", "0", "--draft-layers", "1",
                  "--temperature", "0.8", "--top-p", "0.95", "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and "draft" not in data["methods"] and data["methods"]["auto"]["generations"] == 6
    assert all(not m["mismatches"] for m in data["methods"].values())


def test_a_differing_output_is_reported_with_its_flip_gap(ex, model_dir):
    from lookupdec.decoder import Decoder

    dec = Decoder(model_dir)
    real = dec.generate

    def wrong_pld(prompt, method="auto", **kw):
        res = real(prompt, method=method, **kw)
        if method != "pld" or len(res.token_ids) < 3:
            return res
        from dataclasses import replace

        return replace(res, token_ids=res.token_ids[:2] + ((res.token_ids[2] + 1) % 100,) + res.token_ids[3:])

    dec.generate = wrong_pld
    tally = ex.audit(dec, ex.prompt_set(3, max_len=16), ["pld", "auto"], log=lambda s: None)
    assert len(tally["pld"].mismatches) == 3 and not tally["auto"].mismatches
    m = tally["pld"].mismatches[0]
    assert m.position == 2 and m.gap > 0


def test_draft_without_a_draft_model_is_a_usage_error(ex, model_dir):
    with pytest.raises(SystemExit) as e:
        ex.main(["--model", model_dir, "--n", "1", "--methods", "draft"])
    assert e.value.code == 2


@pytest.mark.cpu  # the quantized weight format and prefix reuse are the fast forward's
def test_second_turns_reuse_rows_the_methods_left_and_are_held_to_ar_without_reuse(ex):
    """Quantized (reuse on by default): every turn's reference is ar with the store set aside."""
    from lookupdec.decoder import Decoder
    from tests.test_quantized import _blockified

    dec = Decoder(_blockified(0), weights="quantized", draft_budget=24)
    prompts = [p for p in ex.prompt_set(40, max_len=24) if p.chat and len(p.text) < 100][:3]
    assert len(prompts) == 3
    seen = []
    real = dec.generate

    def watched(prompt, method="auto", **kw):
        res = real(prompt, method=method, **kw)
        seen.append((method, dec.prefixes is not None, res.cached_tokens))
        return res

    dec.generate = watched
    tally = ex.audit(dec, prompts, ["pld", "auto"], log=lambda s: None, second_turns=True)
    assert tally["pld"].generations == tally["auto"].generations == 6  # two turns of each prompt
    assert not any(t.mismatches for t in tally.values())
    assert all(not on for m, on, _ in seen if m == "ar") and all(on for m, on, _ in seen if m != "ar")
    # Each second turn found its first turn's prompt and answer kept (well beyond the system prompt).
    second = [cached for m, on, cached in seen if m == "pld"][1::2]
    assert min(second) > 24
