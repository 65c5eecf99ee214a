"""Corpus reading: every format and every kind of bad input, with file and line in the message."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from lookupdec.errors import CorpusError
from lookupdec.index.corpus import CorpusReader, batched_texts, encode_texts, expand_sources, prepare_tokenizer
from tests.index_fixtures import tiny_tokenizer, write_jsonl


def read(paths, **kw):
    reader = CorpusReader(paths, **kw)
    return list(reader), reader


# ------------------------------------------------------------------ formats
def test_jsonl_text_field_default_and_named(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "the cat"}, {"text": "a dog", "body": "x y"}])
    assert read([p])[0] == ["the cat", "a dog"]
    q = write_jsonl(tmp_path / "b.jsonl", [{"body": "x y"}])
    assert read([q], text_field="body")[0] == ["x y"]


def test_sharegpt_ultrachat_and_plain_turn_lists_are_joined(tmp_path):
    p = write_jsonl(tmp_path / "chat.jsonl", [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},  # ShareGPT
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},  # UltraChat-200k
        {"id": 3, "data": ["u", "v"]},  # original UltraChat
    ])
    texts, reader = read([p])
    assert texts == ["hi\n\nhello", "q\n\na", "u\n\nv"]
    assert reader.documents == 3


def test_blank_lines_and_empty_texts_are_not_documents(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "the"}\n\n   \n{"text": ""}\n{"text": "cat"}\n')
    texts, reader = read([p])
    assert texts == ["the", "cat"] and reader.documents == 2 and reader.skipped == 0


def test_gzip_jsonl(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write('{"text": "the cat"}\n')
    assert read([p])[0] == ["the cat"]


def test_parquet_and_arrow_file_and_stream(tmp_path):
    table = pa.table({"text": ["the cat", "a dog", None], "n": [1, 2, 3]})
    pq.write_table(table.slice(0, 2), tmp_path / "a.parquet")
    feather.write_feather(table.slice(0, 2), tmp_path / "b.arrow")
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink:  # IPC stream format (HF datasets cache files)
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table.slice(0, 2))
    for name in ("a.parquet", "b.arrow", "c.arrow"):
        assert read([tmp_path / name])[0] == ["the cat", "a dog"], name


def test_parquet_chat_column(tmp_path):
    conv = [[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]]
    pq.write_table(pa.table({"conversations": conv}), tmp_path / "c.parquet")
    assert read([tmp_path / "c.parquet"])[0] == ["hi\n\nyo"]


def test_plain_text_files_and_directories(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.py").write_text("def x")
    (tmp_path / "d" / "sub" / "a.md").write_text("the cat")
    (tmp_path / "d" / ".hidden.txt").write_text("no")
    (tmp_path / "d" / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "notes.weird").write_text("y")  # an explicitly named file is read whatever its suffix
    texts, _ = read([tmp_path / "d", tmp_path / "notes.weird"])
    assert texts == ["def x", "the cat", "y"]


# ------------------------------------------------------------------ bad input
def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"text": "a"}, {"text": "b"}], raw_lines=['{"text": "c"', '{"text": "d"}'])
    with pytest.raises(CorpusError, match=r"bad\.jsonl:3: malformed JSON") as exc:
        read([p])
    assert "--skip-invalid" in str(exc.value)


def test_skip_invalid_skips_and_counts(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"text": "a"}, {"other": 1}], raw_lines=["{oops", "[1, 2]", '{"text": 5}', '{"text": "z"}'])
    texts, reader = read([p], skip_invalid=True)
    assert texts == ["a", "z"]
    assert reader.skipped == 4  # missing field, malformed, not an object, not text


def test_missing_text_field_names_field_and_line(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}, {"body": "b"}])
    with pytest.raises(CorpusError, match=r"a\.jsonl:2: no field 'text' \(fields: body\)"):
        read([p])
    with pytest.raises(CorpusError, match=r"a\.jsonl:1: no field 'body'"):
        read([p], text_field="body")


def test_missing_column_in_parquet(tmp_path):
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(CorpusError, match=r"a\.parquet: no column 'text' \(columns: content\)"):
        read([tmp_path / "a.parquet"])


def test_corrupt_parquet(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CorpusError, match=r"cannot read .*a\.parquet"):
        read([tmp_path / "a.parquet"])


def test_non_utf8_text_file_and_jsonl_line(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin1\.txt: not UTF-8 text \(byte 0xe9 at offset 3\)"):
        read([tmp_path / "latin1.txt"])
    assert read([tmp_path / "latin1.txt"], skip_invalid=True)[1].skipped == 1
    (tmp_path / "l.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"l\.jsonl:2: not UTF-8"):
        read([tmp_path / "l.jsonl"])


def test_a_json_escape_that_leaves_a_lone_surrogate_names_file_line_and_field(tmp_path):
    """JSON's "\\udcff" decodes to a lone surrogate, which no tokenizer encodes (it raised the tokenizer's
    opaque TypeError in the middle of a build)."""
    (tmp_path / "s.jsonl").write_text('{"text": "ok"}\n{"text": "ab \\udcff cd"}\n'
                                       '{"messages": [{"role": "user", "content": "\\ud800"}]}\n'
                                       '{"text": "paired \\ud83d\\ude00 is fine"}\n')
    with pytest.raises(CorpusError, match=r"s\.jsonl:2: field 'text': not valid Unicode .*character 3"):
        read([tmp_path / "s.jsonl"])
    texts, reader = read([tmp_path / "s.jsonl"], skip_invalid=True)
    assert texts == ["ok", "paired \U0001F600 is fine"] and reader.skipped == 2


def test_unreadable_file(tmp_path):
    p = tmp_path / "t.jsonl.gz"
    data = gzip.compress(b'{"text": "the cat"}\n' * 1000)
    p.write_bytes(data[: len(data) // 2])  # a truncated download
    with pytest.raises(CorpusError, match=r"cannot read .*t\.jsonl\.gz"):
        read([p])


def test_missing_file_and_no_files(tmp_path):
    with pytest.raises(CorpusError, match=r"corpus file .*nope\.jsonl does not exist"):
        expand_sources([tmp_path / "nope.jsonl"])
    with pytest.raises(CorpusError, match="no corpus files given"):
        expand_sources([])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="holds no corpus files"):
        expand_sources([tmp_path / "empty"])


# ------------------------------------------------------------------ tokenizing
def test_batches_respect_both_limits():
    texts = ["ab"] * 10
    assert [len(b) for b in batched_texts(texts, max_docs=4)] == [4, 4, 2]
    assert [len(b) for b in batched_texts(texts, max_docs=100, max_chars=6)] == [3, 3, 3, 1]


def test_encode_matches_single_encodes_and_ignores_truncation():
    tok = tiny_tokenizer()
    tok.enable_truncation(2)
    safe = prepare_tokenizer(tok)
    assert tok.truncation is not None  # the caller's tokenizer is not changed
    texts = ["the cat sat on the mat", "dog", "zebra the"]
    got = encode_texts(safe, texts)
    assert all(a.dtype == np.int32 for a in got)
    assert [a.tolist() for a in got] == [[1, 2, 3, 4, 1, 5], [6], [0, 1]]


def test_json_array_of_sharegpt_records_and_jsonl_named_json(tmp_path):
    records = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
               {"id": "b", "conversations": [{"from": "human", "value": "q"}]}]
    (tmp_path / "sharegpt.json").write_text(json.dumps(records, indent=1))
    assert read([tmp_path / "sharegpt.json"])[0] == ["hi\n\nyo", "q"]
    write_jsonl(tmp_path / "lines.json", [{"text": "the"}, {"text": "cat"}])  # JSONL under a .json name
    assert read([tmp_path / "lines.json"])[0] == ["the", "cat"]
    (tmp_path / "bad.json").write_text('[{"text": "a"},\n {"text": ')
    with pytest.raises(CorpusError, match=r"bad\.json:2: malformed JSON"):
        read([tmp_path / "bad.json"])
    (tmp_path / "miss.json").write_text('[{"text": "a"}, {"body": "b"}]')
    with pytest.raises(CorpusError, match=r"miss\.json: item 1: no field 'text'"):
        read([tmp_path / "miss.json"])
