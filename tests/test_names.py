"""One vocabulary for the library and the CLI: renamed arguments, transformers' names, and --batch."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from lookupdec import Decoder
from lookupdec.cli import main
from tests.conftest import save_tiny, tiny_loaded
from tests.index_fixtures import tiny_tokenizer, write_jsonl


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"), 0)


def test_earlier_names_still_work_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="hf_kernels"):
        dec = Decoder(tiny_loaded(0), fast_kernels=False)
    assert dec.verifier.backend == "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current names warn of nothing
        assert Decoder(tiny_loaded(0), hf_kernels=True).verifier.backend == "hf"
    with pytest.raises(TypeError, match="not both"), pytest.warns(DeprecationWarning):
        Decoder(tiny_loaded(0), indexes=[], index=[])
    with pytest.raises(TypeError, match="'fast'"):
        Decoder(tiny_loaded(0), fast=True)


def test_do_sample_has_transformers_meaning():
    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    prompt = [5, 6, 7, 8, 9]
    greedy = dec.generate(prompt, method="ar", max_new_tokens=12, chat_template=False).token_ids
    # do_sample=False decodes greedily whatever the temperature says
    assert dec.generate(prompt, method="ar", max_new_tokens=12, chat_template=False, temperature=1.5,
                        do_sample=False).token_ids == greedy
    # do_sample=True at temperature 0 samples at transformers' default temperature 1.0
    sampled = [dec.generate(prompt, method="ar", max_new_tokens=12, chat_template=False, do_sample=True,
                            seed=s).token_ids for s in range(4)]
    at_one = [dec.generate(prompt, method="ar", max_new_tokens=12, chat_template=False, temperature=1.0,
                           seed=s).token_ids for s in range(4)]
    assert sampled == at_one
    assert any(s != greedy for s in sampled)  # it did sample
    with pytest.raises(TypeError, match="do_sample"):
        dec.generate(prompt, method="ar", max_new_tokens=2, do_sample="yes")


def test_batch_option_prints_every_prompt_in_input_order_with_the_sequential_outputs(model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    # Lengths differ, so the batch finishes them out of order.
    inp.write_text("\n".join(json.dumps(p) for p in ["abcabcabc", "xy", "hello hello", "q", "abab abab abab"]))
    common = ["generate", "--model", model_dir, "--input", str(inp), "--method", "pld", "--max-new-tokens", "16",
              "--json", "--no-chat-template"]
    one = CliRunner().invoke(main, common)
    many = CliRunner().invoke(main, common + ["--batch", "3"])
    assert one.exit_code == 0 and many.exit_code == 0, (one.output, many.output)
    rows1 = [json.loads(x) for x in one.stdout.strip().splitlines()]
    rows3 = [json.loads(x) for x in many.stdout.strip().splitlines()]
    assert [r["token_ids"] for r in rows3] == [r["token_ids"] for r in rows1]
    assert len(rows3) == 5


def test_batch_text_mode_and_a_bad_prompt_fails_before_any_output(model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('"abc"\n"' + "x" * 400 + '"\n')
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--method", "ar",
                                  "--max-new-tokens", "8", "--batch", "2", "--no-chat-template"])
    assert r.exit_code != 0 and "prompt 2" in r.output and "context" in r.output
    assert r.stdout.strip() == "" or "Error" in r.stdout  # nothing generated was printed
    inp.write_text('"abc"\n"abd"\n')
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--method", "ar",
                                  "--max-new-tokens", "8", "--batch", "2", "--no-chat-template"])
    assert r.exit_code == 0 and r.stderr.count("new tokens") == 2
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "x", "--batch", "0"])
    assert r.exit_code != 0 and "--batch" in r.output


def test_every_index_command_takes_index_and_shard_tokens(tmp_path):
    tok = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(tok))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat sat on the mat"}, {"text": "the cat ran"}])
    more = write_jsonl(tmp_path / "m.jsonl", [{"text": "a dog ran home"}])
    out = tmp_path / "i"
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    assert run("build-index", corpus, "--index", out, "--tokenizer", tok, "-q").exit_code == 0
    assert run("build-index", more, "--index", out, "--tokenizer", tok, "-q", "--append").exit_code == 0
    r = run("compact", "--index", out, "--shard-tokens", 1000)
    assert r.exit_code == 0 and "2 shards -> 1" in r.output, r.output
    r = run("index-info", "--index", out)
    assert r.exit_code == 0 and "version 3" in r.output, r.output
    r = run("index-info", out, "--index", out)
    assert r.exit_code != 0 and "once" in r.output
    r = run("compact")
    assert r.exit_code != 0 and "missing the index directory" in r.output
