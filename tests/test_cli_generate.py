"""`lookupdec generate` on a tiny model saved to a temporary directory."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from tests.conftest import save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return save_tiny(d, 0)


def test_json_output_one_object_per_prompt(model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('"abcabc"\n{"prompt": "xyz"}\n{"messages": [{"role": "user", "content": "q"}]}\n')
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--method", "ar",
                                  "--max-new-tokens", "12", "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert {"text", "token_ids", "new_tokens", "steps", "mean_accepted", "tokens_per_s", "method"} <= set(row)
        assert row["new_tokens"] == len(row["token_ids"]) <= 12 and row["method"] == "ar"


@pytest.mark.cpu  # prefix reuse lives in the fast forward's cache
def test_prompts_of_an_input_reuse_an_earlier_prompts_rows_when_asked_and_say_so(model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('"a shared preamble, then one question"\n"a shared preamble, then another"\n')
    rows = {}
    for mb in ("0", "8"):
        r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--method", "pld",
                                      "--max-new-tokens", "12", "--json", "--prefix-cache-mb", mb])
        assert r.exit_code == 0, r.output
        rows[mb] = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [r["token_ids"] for r in rows["8"]] == [r["token_ids"] for r in rows["0"]]
    assert [r["cached_tokens"] for r in rows["0"]] == [0, 0]
    assert rows["8"][0]["cached_tokens"] == 0 and rows["8"][1]["cached_tokens"] >= len("a shared preamble, then ")
    bad = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "hi", "--prefix-cache-mb", "-1"])
    assert bad.exit_code == 2 and "--prefix-cache-mb" in bad.output


def test_streams_text_then_stats_line(model_dir):
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "hello", "--method", "ar",
                                  "--max-new-tokens", "10", "--no-chat-template", "--temperature", "0.7", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert "new tokens" in r.stderr and "tokens/s" in r.stderr and "tokens/step" in r.stderr
    r2 = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "hello", "--method", "ar",
                                   "--max-new-tokens", "10", "--no-chat-template", "--temperature", "0.7", "--seed", "1",
                                   "--json"])
    assert json.loads(r2.stdout)["text"] == r.stdout.rstrip("\n")  # streamed text = the result's text


def test_errors_are_clean(model_dir, tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"])
    assert r.exit_code != 0 and "not found" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["generate", "--model", model_dir, "--prompt", "x" * 300, "--max-new-tokens", "10",
                             "--method", "ar"])
    assert r.exit_code != 0 and "context" in r.output and "Traceback" not in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"ok"\n{not json\n')
    r = runner.invoke(main, ["generate", "--model", model_dir, "--input", str(bad)])
    assert r.exit_code != 0 and "bad.jsonl:2" in r.output
    r = runner.invoke(main, ["generate", "--model", model_dir])
    assert r.exit_code != 0 and "exactly one of" in r.output
    r = runner.invoke(main, ["generate", "--model", model_dir, "--prompt", "x", "--temperature", "0.7",
                             "--seed", str(2 ** 64)])
    assert r.exit_code != 0 and "seed must be an integer" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x", "refrences": ["a"]}', "unknown field 'refrences'"),
    ('{"messages": "hi"}', '"messages" must be a list of'),
    ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', 'exactly one of "prompt" or "messages"'),
    ('{"references": ["a"]}', 'exactly one of "prompt" or "messages"'),
    ('{"prompt": "ab \\udcff"}', "not valid Unicode"),
    ('{"messages": [{"role": "user", "content": 7}]}', "message 0's content must be a string"),
])
def test_a_bad_input_line_is_named_by_file_and_line_before_anything_is_generated(model_dir, tmp_path, line, message):
    inp = tmp_path / "in.jsonl"
    inp.write_text('"fine"\n' + line + "\n")
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(inp), "--method", "ar",
                                  "--max-new-tokens", "4", "--json"])
    assert r.exit_code == 1 and "in.jsonl:2" in r.output and message in r.output, r.output
    assert "Traceback" not in r.output and r.stdout == ""  # the good first line was not generated either


def test_an_unreadable_input_file_names_the_problem_and_the_fix(model_dir, tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'"fine"\n"caf\xe9"\n')  # Latin-1, not UTF-8: the bad byte is on line 2
    for path, message in [(latin, "not UTF-8 (byte 0xe9 on line 2); convert the file to UTF-8"),
                          (tmp_path / "missing.jsonl", "No such file or directory; pass a readable file")]:
        r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--input", str(path), "--method", "ar"])
        assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, r.output
        assert r.stdout == ""


def test_method_help_names_every_registered_method():
    from lookupdec.methods import METHODS

    r = CliRunner().invoke(main, ["generate", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for name in METHODS:
        assert f"{name}:" in text, name


def test_every_weights_option_offers_exactly_the_librarys_weight_formats():
    """The CLI spells the formats out (no torch at import); each --weights must offer what the library takes."""
    from lookupdec.weights import WEIGHTS_CHOICES

    for name in ("generate", "cost-curve", "serve"):
        option = next(p for p in main.commands[name].params if p.name == "weights")
        assert tuple(option.type.choices) == WEIGHTS_CHOICES, name


def test_every_kv_dtype_option_offers_exactly_the_librarys_cache_element_types():
    from lookupdec.kvcache import KV_DTYPES

    for name in ("generate", "cost-curve", "serve"):
        option = next(p for p in main.commands[name].params if p.name == "kv_dtype")
        assert tuple(option.type.choices) == tuple(KV_DTYPES), name
