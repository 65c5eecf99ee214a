"""`lookupdec build-index` / `index-info` through click: output, and every bad input exits 1 leaving nothing."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from lookupdec.index import open_index
from tests.index_fixtures import WORDS, leftovers, tiny_tokenizer, write_jsonl


@pytest.fixture
def tok_path(tmp_path):
    path = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat sat on the mat"}, {"text": "the cat ran home"}])


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_failed(result, *fragments):
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


def test_build_then_info(tmp_path, tok_path, corpus):
    out = tmp_path / "i"
    r = run("build-index", corpus, "-o", out, "--tokenizer", tok_path, "--shard-tokens", 8, "-q")
    assert r.exit_code == 0, r.output
    for fragment in ("documents:  2", "tokens:     10", "shards:     2", "bytes/token", "tokenizing:", "indexing:"):
        assert fragment in r.output
    assert open_index(out, verify=True).n_tokens == 10
    r = run("index-info", out, "--verify")
    assert r.exit_code == 0, r.output
    for fragment in ("lookupdec-suffix-index v1", f"tokenizer:  {tok_path}", "vocabulary 20 ids", "documents:  2",
                     "tokens:     10", "shards:     2", "shard-00001.tokens.i32", "verified:"):
        assert fragment in r.output, r.output


def test_progress_bar_goes_to_stderr(tmp_path, tok_path, corpus):
    r = CliRunner().invoke(main, ["build-index", str(corpus), "-o", str(tmp_path / "i"), "--tokenizer", str(tok_path)])
    assert r.exit_code == 0 and "docs" in r.stderr and "tok/s" in r.stderr


def test_malformed_line_and_skip_invalid(tmp_path, tok_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "the cat"}], raw_lines=["{nope", '{"text": "a dog"}'])
    r = run("build-index", bad, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q")
    assert_failed(r, "bad.jsonl:2: malformed JSON", "--skip-invalid")
    assert leftovers(tmp_path, "i") == []
    r = run("build-index", bad, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q", "--skip-invalid")
    assert r.exit_code == 0 and "(1 invalid records skipped)" in r.output and "documents:  2" in r.output


@pytest.mark.parametrize("case", ["missing-field", "empty", "non-utf8", "missing-file"])
def test_bad_corpus_exits_1_and_leaves_nothing(tmp_path, tok_path, case):
    if case == "missing-field":
        src, message = write_jsonl(tmp_path / "c.jsonl", [{"body": "the cat"}]), "c.jsonl:1: no field 'text'"
    elif case == "empty":
        src, message = write_jsonl(tmp_path / "c.jsonl", [{"text": ""}]), "the corpus holds no text"
    elif case == "non-utf8":
        src, message = tmp_path / "c.txt", "c.txt: not UTF-8 text"
        src.write_bytes(b"the \xff cat")
    else:
        src, message = tmp_path / "nope.jsonl", "nope.jsonl does not exist"
    assert_failed(run("build-index", src, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q"), message)
    assert leftovers(tmp_path, "i") == []


def test_text_field_option(tmp_path, tok_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"body": "the cat"}])
    r = run("build-index", src, "-o", tmp_path / "i", "--tokenizer", tok_path, "--text-field", "body", "-q")
    assert r.exit_code == 0 and open_index(tmp_path / "i").n_tokens == 2


def test_existing_output_needs_overwrite(tmp_path, tok_path, corpus):
    assert run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q").exit_code == 0
    before = sorted(p.name for p in (tmp_path / "i").iterdir())
    assert_failed(run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q"),
                  "already exists", "--overwrite")
    assert sorted(p.name for p in (tmp_path / "i").iterdir()) == before
    assert run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q", "--overwrite").exit_code == 0
    assert leftovers(tmp_path, "i") == ["i"]


def test_unknown_tokenizer(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert_failed(run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", "nobody/none", "-q"),
                  "'nobody/none' is neither a local file")
    assert leftovers(tmp_path, "i") == []


@pytest.mark.parametrize("damage, message", [
    ("missing-array", "shard-00000.sa.i32 is missing"),
    ("truncated-array", "shard-00000.tokens.i32 has 44 bytes but the manifest says 48"),
    ("corrupted-array", "shard-00000.sa.i32 is corrupted"),
    ("truncated-manifest", "manifest.json is truncated or not valid JSON"),
    ("no-index", "does not exist"),
])
def test_index_info_on_damaged_index(tmp_path, tok_path, corpus, damage, message):
    out = tmp_path / "i"
    assert run("build-index", corpus, "-o", out, "--tokenizer", tok_path, "-q").exit_code == 0
    if damage == "missing-array":
        (out / "shard-00000.sa.i32").unlink()
    elif damage == "truncated-array":
        p = out / "shard-00000.tokens.i32"
        p.write_bytes(p.read_bytes()[:-4])
    elif damage == "corrupted-array":
        p = out / "shard-00000.sa.i32"
        sa = np.fromfile(p, "<i4")
        sa[[0, 1]] = sa[[1, 0]]
        sa.tofile(p)
    elif damage == "truncated-manifest":
        p = out / "manifest.json"
        p.write_bytes(p.read_bytes()[:50])
    else:
        out = tmp_path / "missing"
    assert_failed(run("index-info", out, "--verify"), message, "rebuild" if damage != "no-index" else "build-index")


def test_wrong_tokenizer_message_names_both(tmp_path, tok_path, corpus):
    # The CLI has no "serve" command here; the refusal is a library error, tested through the index's check.
    from lookupdec.errors import TokenizerMismatchError

    assert run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", tok_path, "-q").exit_code == 0
    idx = open_index(tmp_path / "i")
    with pytest.raises(TokenizerMismatchError, match=rf"built with tokenizer '{tok_path}'.*model uses bigger"):
        idx.check_tokenizer(tiny_tokenizer(WORDS + ["more"]), "bigger")


def test_help_lists_options_and_imports_no_torch():
    r = run("build-index", "--help")
    assert r.exit_code == 0
    for opt in ("--output", "--tokenizer", "--text-field", "--shard-tokens", "--overwrite", "--skip-invalid"):
        assert opt in r.output
    # --help stays light: the CLI imports torch only inside the commands that need it.
    code = ("import sys\nfrom lookupdec.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "for cmd in ('generate', 'build-index', 'cost-curve'):\n    try:\n        main([cmd, '--help'])\n"
            "    except SystemExit:\n        pass\nassert 'torch' not in sys.modules, 'torch was imported'\n")
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)