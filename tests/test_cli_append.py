"""`build-index --jobs/--max-memory/--append` and `lookupdec compact` through click."""
from __future__ import annotations

import pytest

from lookupdec.index import open_index
from tests.index_fixtures import WORDS, leftovers, tiny_tokenizer, write_jsonl
from tests.test_cli_index import assert_failed, corpus, run, tok_path  # noqa: F401  (fixtures)


def test_append_compact_and_info_show_the_manifest_version(tmp_path, tok_path, corpus):
    out = tmp_path / "i"
    r = run("build-index", corpus, "-o", out, "--tokenizer", tok_path, "--shard-tokens", 8, "-q", "--jobs", 1)
    assert r.exit_code == 0, r.output
    assert "peak RSS:" in r.output
    more = write_jsonl(tmp_path / "more.jsonl", [{"text": "a dog ran to a park"}])
    r = run("build-index", more, "-o", out, "--tokenizer", tok_path, "--append", "-q", "--jobs", 1)
    assert r.exit_code == 0, r.output
    assert open_index(out).n_documents == 3
    r = run("index-info", out)
    assert "manifest:   version 2 (1 append(s))" in r.output, r.output
    r = run("compact", "--index", out, "--shard-tokens", 100)
    assert r.exit_code == 0 and "3 shards -> 1, manifest version 3" in r.output, r.output
    assert "version 3" in run("index-info", "--index", out, "--verify").output
    r = run("compact", out)
    assert r.exit_code == 0 and "nothing to merge" in r.output


@pytest.mark.parametrize("size", ["2X", "lots", "-1G", "0"])
def test_bad_max_memory_exits_1_and_leaves_nothing(tmp_path, tok_path, corpus, size):
    assert_failed(run("build-index", corpus, "-o", tmp_path / "i", "--tokenizer", tok_path, "--max-memory", size),
                  "--max-memory", "2G")
    assert leftovers(tmp_path, "i") == []


def test_append_onto_a_non_index_or_another_tokenizer(tmp_path, tok_path, corpus):
    (tmp_path / "plain").mkdir()
    assert_failed(run("build-index", corpus, "-o", tmp_path / "plain", "--tokenizer", tok_path, "--append"), "missing")
    assert list((tmp_path / "plain").iterdir()) == []
    out = tmp_path / "i"
    assert run("build-index", corpus, "-o", out, "--tokenizer", tok_path, "-q").exit_code == 0
    other = tmp_path / "other.json"
    tiny_tokenizer(WORDS[::-1]).save(str(other))
    assert_failed(run("build-index", corpus, "-o", out, "--tokenizer", other, "--append"), "cannot append", "--tokenizer")
    assert_failed(run("build-index", corpus, "-o", out, "--tokenizer", tok_path, "--append", "--overwrite"),
                  "--append")
    assert open_index(out, verify=True).manifest.version == 1
