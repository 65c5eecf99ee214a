"""LLMA (references), REST (corpus datastores) and auto: exact, drafting, and the errors a user can hit."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder
from lookupdec.errors import IndexFormatError, TokenizerMismatchError
from lookupdec.index import build_index_from_tokens
from tests.conftest import batch_of, char_tokenizer, save_tiny, tiny_loaded

# A flat curve: every width costs about a plain step, so any tree with some chance pays.
FLAT = CostCurve((1, 128), (10.0, 10.5), 0, (0.0, 0.0), "test", "flat")
# A steep curve: each extra row costs a whole plain step, so no tree ever pays.
STEEP = CostCurve((1, 128), (10.0, 1280.0), 0, (0.0, 0.0), "test", "steep")


@pytest.fixture(scope="module")
def setup():
    lm = tiny_loaded(3)
    dec = Decoder(lm, cost_curve=FLAT)
    prompt = dec.encode("Tell me about the weather in the hills today.", chat_template=False)
    ref = dec.generate(prompt, method="ar", max_new_tokens=64)
    return lm, dec, prompt, ref


def test_llma_drafts_from_references_and_equals_ar(setup):
    lm, dec, prompt, ref = setup
    # The answer itself, inside a longer document, is the best reference there can be.
    answer = lm.tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    docs = ["some unrelated text about nothing much", "intro. " + answer + " outro."]
    for method in ("llma", "auto"):
        out = dec.generate(prompt, method=method, max_new_tokens=64, references=docs)
        assert out.token_ids == ref.token_ids, method
        assert out.accepted_by_source.get("llma", 0) > 10 and out.steps < ref.steps / 2, method
    # Unrelated references: still exact, and auto falls back to what else it has.
    out = dec.generate(prompt, method="auto", max_new_tokens=64, references=["zzzz qqqq"])
    assert out.token_ids == ref.token_ids


def test_rest_drafts_from_a_datastore_and_equals_ar(setup, tmp_path):
    lm, _, prompt, ref = setup
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 100, 200).tolist() for _ in range(20)] + [list(prompt[-5:]) + list(ref.token_ids)]
    build_index_from_tokens(docs, tmp_path / "i", tokenizer=lm.tokenizer)
    dec = Decoder(lm, indexes=str(tmp_path / "i"), cost_curve=FLAT)
    for method in ("rest", "auto"):
        out = dec.generate(prompt, method=method, max_new_tokens=64)
        assert out.token_ids == ref.token_ids, method
        assert out.accepted_by_source.get("rest", 0) > 10, method
    # Methods that do not draft from datastores simply do not use the decoder's.
    assert dec.generate(prompt, method="pld", max_new_tokens=64).token_ids == ref.token_ids


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_with_every_source_on_unscaled_weights_equals_ar(seed, tmp_path):
    """Unscaled random weights: near-ties between top tokens, where a wrong acceptance would show."""
    lm = tiny_loaded(seed, scale=1.0)
    rng = np.random.default_rng(seed)
    build_index_from_tokens([rng.integers(3, 100, 300).tolist() for _ in range(10)], tmp_path / "i",
                            tokenizer=lm.tokenizer)
    dec = Decoder(lm, indexes=str(tmp_path / "i"), cost_curve=FLAT)
    for plen in (3, 40):
        prompt = rng.integers(3, 100, plen).tolist()
        ref = dec.generate(prompt, method="ar", max_new_tokens=48)
        text = lm.tokenizer.decode(list(ref.token_ids[:20]), skip_special_tokens=True) or "x"
        out = dec.generate(prompt, method="auto", max_new_tokens=48, references=[text, "abc abc abc"])
        assert out.token_ids == ref.token_ids
        assert sum(s.draft_size for s in out.step_stats) > 0  # drafts were verified


def test_auto_drafts_nothing_when_no_tree_pays(setup):
    lm, _, prompt, ref = setup
    answer = lm.tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    dec = Decoder(lm, cost_curve=STEEP)
    out = dec.generate(prompt, method="auto", max_new_tokens=64, references=[answer])
    assert out.token_ids == ref.token_ids
    assert all(s.draft_size == 0 for s in out.step_stats) and out.steps == ref.steps


def test_sampling_through_auto_keeps_the_target_distribution():
    import torch

    from lookupdec.sampling import SamplingParams, target_probs
    from tests.test_sampling import assert_matches

    lm = tiny_loaded(7)
    dec = Decoder(lm, cost_curve=FLAT)
    params = SamplingParams(1.0, top_k=8)
    prompt = [10, 11, 12]
    with torch.no_grad():
        p1 = target_probs(lm.model(batch_of(lm.model, prompt)).logits[0, -1].cpu(), params)
        support = torch.nonzero(p1).flatten().tolist()
        p2 = {x: target_probs(lm.model(batch_of(lm.model, prompt + [x])).logits[0, -1].cpu(), params) for x in support}
    exact2 = sum(p1[x] * p2[x] for x in support).numpy()
    # References holding each likely first token followed by its likely successors: auto drafts them.
    refs = [lm.tokenizer.decode([x] + torch.topk(p2[x], 2).indices.tolist()) for x in support]
    counts1, counts2 = np.zeros(p1.shape[0]), np.zeros(p1.shape[0])
    accepted = 0
    for seed in range(1500):
        out = dec.generate(prompt, method="auto", max_new_tokens=3, temperature=1.0, top_k=8, seed=seed,
                           references=refs)
        counts1[out.token_ids[0]] += 1
        counts2[out.token_ids[1]] += 1
        accepted += out.step_stats[1].accepted
    assert accepted > 150  # speculation was really exercised
    assert_matches(counts1, p1.numpy())
    assert_matches(counts2, exact2)


def test_reference_errors(setup):
    _, dec, prompt, _ = setup
    with pytest.raises(ValueError, match="does not use references; use one of: auto, llma"):
        dec.generate(prompt, method="pld", references=["a document"])
    with pytest.raises(ValueError, match="empty"):
        dec.generate(prompt, method="llma", references=["  "])
    with pytest.raises(ValueError, match="empty list"):
        dec.generate(prompt, method="llma", references=[])
    with pytest.raises(ValueError, match="needs references"):
        dec.generate(prompt, method="llma")
    with pytest.raises(TypeError, match="list of documents"):
        dec.generate(prompt, method="llma", references="one string")
    with pytest.raises(ValueError, match="needs a corpus datastore"):
        dec.generate(prompt, method="rest")


def test_index_errors_name_the_problem(tmp_path):
    lm = tiny_loaded(0)
    with pytest.raises(IndexFormatError, match="does not exist"):
        Decoder(lm, indexes=str(tmp_path / "nope"))
    # An index built with another tokenizer: two ids swapped.
    other = char_tokenizer()
    vocab = other.get_vocab()
    from tokenizers import Tokenizer, models
    swapped = dict(vocab)
    swapped["a"], swapped["b"] = vocab["b"], vocab["a"]
    build_index_from_tokens([[5, 6, 7, 8]], tmp_path / "other", tokenizer=Tokenizer(models.WordLevel(swapped, "<unk>")))
    with pytest.raises(TokenizerMismatchError, match="rebuild the index"):
        Decoder(lm, indexes=str(tmp_path / "other"))
    # A damaged index: a truncated array file.
    build_index_from_tokens([[5, 6, 7, 8]], tmp_path / "ok", tokenizer=lm.tokenizer)
    sa = next((tmp_path / "ok").glob("*.sa.*"))
    sa.write_bytes(sa.read_bytes()[:-4])
    with pytest.raises(IndexFormatError, match="bytes"):
        Decoder(lm, indexes=str(tmp_path / "ok"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return save_tiny(d, 3)


def test_cli_references_index_and_per_request_references(model_dir, tmp_path):
    runner = CliRunner()
    base = ["generate", "--model", model_dir, "--no-chat-template", "--max-new-tokens", "40", "--json"]
    prompt = "Tell me about the weather in the hills today."
    r = runner.invoke(main, base + ["--prompt", prompt, "--method", "ar"])
    assert r.exit_code == 0, r.output
    ar = json.loads(r.stdout)
    doc = tmp_path / "doc.txt"
    doc.write_text("Before. " + ar["text"] + " After.")
    assert ar["new_tokens"] >= 30  # long enough for drafts to matter
    r = runner.invoke(main, base + ["--prompt", prompt, "--method", "llma", "--reference", str(doc)])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert row["token_ids"] == ar["token_ids"] and row["accepted_by_source"].get("llma", 0) > 5
    # Per-request references in --input, next to a request without any.
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": prompt, "references": [ar["text"]]}) + "\n" + json.dumps(prompt) + "\n")
    r = runner.invoke(main, base + ["--input", str(inp), "--method", "auto"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["token_ids"] for x in rows] == [ar["token_ids"]] * 2
    assert rows[0]["accepted_by_source"].get("llma", 0) > 0 and "llma" not in rows[1]["accepted_by_source"]
    # transformers' own kernels: the same greedy tokens on this model.
    r = runner.invoke(main, base + ["--prompt", prompt, "--method", "ar", "--hf-kernels"])
    assert r.exit_code == 0 and json.loads(r.stdout)["token_ids"] == ar["token_ids"]


def test_cli_errors_leave_no_partial_output(model_dir, tmp_path):
    runner = CliRunner()
    inp = tmp_path / "in.jsonl"
    inp.write_text('"short"\n"' + "x" * 400 + '"\n')   # the second prompt does not fit the context
    r = runner.invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--json", "--max-new-tokens", "8"])
    assert r.exit_code != 0 and "prompt 2" in r.output and "context" in r.output and r.stdout.count("{") == 0
    r = runner.invoke(main, ["generate", "--model", model_dir, "--prompt", "x", "--method", "pld",
                             "--reference", str(inp)])
    assert r.exit_code != 0 and "does not use references" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["generate", "--model", model_dir, "--prompt", "x", "--index", str(tmp_path / "none")])
    assert r.exit_code != 0 and "Traceback" not in r.output
    bad = tmp_path / "refs.jsonl"
    bad.write_text('{"prompt": "x", "references": "not a list"}\n')
    r = runner.invoke(main, ["generate", "--model", model_dir, "--input", str(bad)])
    assert r.exit_code != 0 and "refs.jsonl:1" in r.output


def test_cli_cost_curve_is_cached_and_remeasured(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["cost-curve", "--model", model_dir, "--json"])
    assert r.exit_code == 0, r.output
    first = CostCurve.from_json(r.stdout)
    assert list((tmp_path / "cache" / "costs").glob("*.json"))
    r = CliRunner().invoke(main, ["cost-curve", "--model", model_dir, "--json"])
    assert CostCurve.from_json(r.stdout) == first  # read from the cache
    r = CliRunner().invoke(main, ["cost-curve", "--model", model_dir, "--remeasure"])
    assert r.exit_code == 0 and "width" in r.output and first.key in r.output
