"""Building an index: round trips against the reference, shards, document boundaries, atomicity."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lookupdec.errors import CorpusError, IndexFormatError
from lookupdec.index import IndexSummary, Lookup, build_index, build_index_from_tokens, open_index
from lookupdec.index.manifest import FORMAT_NAME, FORMAT_VERSION
from tests.oracles.index import lookup_shards_reference
from lookupdec.tokenizer import tokenizer_fingerprint
from tests.index_fixtures import ids, leftovers, tiny_tokenizer, write_jsonl


def reference_for(index, context, **kw):
    """The slow reference over the index's own shards (read back from disk)."""
    shards = [(s.tokens, s.sa) for s in index._shards]
    args = dict(max_n=16, min_n=2, max_occurrences=5000, depth=10, budget=64) | kw
    return lookup_shards_reference(shards, context, args["max_n"], args["min_n"], args["max_occurrences"],
                                   args["depth"], args["budget"])


def assert_same(got: Lookup, ref) -> None:
    assert (got.match_len, got.occurrences, got.sampled) == (ref.match_len, ref.occurrences, ref.sampled)
    assert got.tree.tokens.tolist() == ref.tokens.tolist()
    assert got.tree.parents.tolist() == ref.parents.tolist()
    assert got.counts.tolist() == ref.counts.tolist()
    assert np.allclose(got.tree.scores, ref.counts / max(ref.sampled, 1))


def random_docs(rng, n_docs, vocab, max_len=40):
    # A small vocabulary and repeated phrases so that matches are long and frequent.
    phrases = [rng.integers(0, vocab, rng.integers(2, 6)) for _ in range(8)]
    docs = []
    for _ in range(n_docs):
        parts = [phrases[rng.integers(0, len(phrases))] if rng.random() < 0.6 else rng.integers(0, vocab, 2)
                 for _ in range(rng.integers(0, max_len // 4))]
        docs.append(np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32))
    return docs


# ------------------------------------------------------------------ round trips
def test_tiny_hand_computed_lookup(tmp_path):
    s = build_index_from_tokens([[1, 2, 3, 4], [1, 2, 3, 5], [7, 1, 2, 3, 4, 9]], tmp_path / "i")
    assert isinstance(s, IndexSummary) and (s.documents, s.tokens, s.shards) == (3, 14, 1)
    idx = open_index(tmp_path / "i")
    r = idx.lookup([0, 1, 2, 3], max_n=4, min_n=1)
    assert (r.match_len, r.occurrences, r.sampled) == (3, 3, 3)  # "1 2 3" occurs 3 times; "0 1 2 3" never
    # After "1 2 3": 4 twice (then 9 once, the first 4 ends its document), 5 once.
    assert r.tree.tokens.tolist() == [4, 5, 9] and r.tree.parents.tolist() == [-1, -1, 0]
    assert r.counts.tolist() == [2, 1, 1]
    assert idx.lookup([8, 8], max_n=4, min_n=1).match_len == 0  # no match: an empty tree, not None
    assert len(idx.lookup([8, 8]).tree) == 0


@pytest.mark.parametrize("seed", range(4))
def test_round_trip_equals_reference(tmp_path, seed):
    rng = np.random.default_rng(seed)
    docs = random_docs(rng, 30, vocab=6)
    build_index_from_tokens(docs, tmp_path / "i")
    idx = open_index(tmp_path / "i", verify=True)
    assert idx.n_documents == sum(1 for d in docs if d.size)
    assert idx.n_tokens == sum(d.size for d in docs)
    flat = np.concatenate(docs)
    for _ in range(25):
        start = rng.integers(0, flat.size - 5)
        ctx = flat[start : start + rng.integers(1, 12)].tolist() + ([int(rng.integers(0, 6))] if rng.random() < 0.3 else [])
        kw = dict(max_n=int(rng.integers(1, 8)), min_n=1, max_occurrences=int(rng.integers(1, 12)),
                  depth=int(rng.integers(1, 6)), budget=int(rng.integers(0, 20)))
        kw["min_n"] = int(rng.integers(1, kw["max_n"] + 1))
        got = idx.lookup(ctx, **kw)
        assert_same(got, reference_for(idx, ctx, **kw))
        assert got.tree.check() == ""  # the index wraps native arrays without validating them


@pytest.mark.parametrize("seed", range(3))
def test_shards_give_the_reference_lookup_across_shards(tmp_path, seed):
    rng = np.random.default_rng(100 + seed)
    docs = random_docs(rng, 40, vocab=5)
    s = build_index_from_tokens(docs, tmp_path / "i", shard_tokens=60)
    assert s.shards >= 3
    idx = open_index(tmp_path / "i", verify=True)
    assert all(e.tokens.length <= 60 for e in idx.manifest.shards)
    # One shard and many shards hold the same documents: totals agree.
    build_index_from_tokens(docs, tmp_path / "one")
    one = open_index(tmp_path / "one")
    flat = np.concatenate(docs)
    for _ in range(25):
        start = rng.integers(0, flat.size - 4)
        ctx = flat[start : start + rng.integers(1, 8)].tolist()
        kw = dict(max_n=6, min_n=1, max_occurrences=int(rng.integers(1, 30)), depth=int(rng.integers(1, 5)), budget=32)
        got = idx.lookup(ctx, **kw)
        assert_same(got, reference_for(idx, ctx, **kw))
        whole = one.lookup(ctx, **kw)
        assert (got.match_len, got.occurrences) == (whole.match_len, whole.occurrences)
        if got.occurrences <= kw["max_occurrences"]:  # every occurrence read: the same tree
            assert got.tree.tokens.tolist() == whole.tree.tokens.tolist()
            assert got.counts.tolist() == whole.counts.tolist()


def test_document_longer_than_a_shard_is_cut(tmp_path):
    doc = np.arange(1, 26, dtype=np.int32)
    s = build_index_from_tokens([doc, [1, 2]], tmp_path / "i", shard_tokens=10)
    idx = open_index(tmp_path / "i", verify=True)
    assert s.documents == 2 and s.tokens == 27
    assert [e.tokens.length for e in idx.manifest.shards] == [10, 10, 8, 3]  # 9 + 9 + 7 tokens, each piece with its separator
    assert idx.lookup([3, 4], depth=3).tree.tokens.tolist() == [5, 6, 7]


# ------------------------------------------------------------------ documents
def test_no_match_spans_two_documents(tmp_path):
    build_index_from_tokens([[1, 2, 3], [4, 5, 6], [3, 4, 9]], tmp_path / "i")
    idx = open_index(tmp_path / "i")
    # "3 4" exists only inside the third document, never across the end of the first.
    r = idx.lookup([2, 3, 4], max_n=3, min_n=2)
    assert (r.match_len, r.occurrences) == (2, 1) and r.tree.tokens.tolist() == [9]
    # "2 3" ends its document: a match with no continuation (the separator is not drafted).
    r = idx.lookup([1, 2, 3], max_n=3, min_n=3)
    assert r.match_len == 3 and len(r.tree) == 0


def test_build_from_corpus_files_records_tokenizer_and_counts(tmp_path):
    tok = tiny_tokenizer()
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat sat on the mat"}, {"text": "the cat ran to the park"}],
                         raw_lines=["not json"])
    (tmp_path / "d.txt").write_text("the dog sat on a mat")
    s = build_index([corpus, tmp_path / "d.txt"], tmp_path / "i", tokenizer=tok, skip_invalid=True, progress=False)
    assert (s.documents, s.tokens, s.skipped, s.shards) == (3, 18, 1, 1)
    assert s.tokenize_seconds > 0 and s.index_seconds > 0 and s.seconds >= s.index_seconds
    idx = open_index(tmp_path / "i", verify=True)
    m = idx.manifest
    assert m.tokenizer.fingerprint == tokenizer_fingerprint(tok) and m.tokenizer.vocab_size == tok.get_vocab_size()
    assert m.skipped == 1 and m.build["text_field"] == "text" and m.build["n_sources"] == 2
    r = idx.lookup(ids("and the cat"), max_n=2)
    assert r.match_len == 2 and r.occurrences == 2
    assert sorted(r.tree.tokens[r.tree.parents == -1].tolist()) == sorted(ids("sat ran"))
    assert s.bytes_on_disk == sum(f.stat().st_size for f in (tmp_path / "i").iterdir())


def test_manifest_contents(tmp_path):
    build_index_from_tokens([[1, 2], [3]], tmp_path / "i", tokenizer=tiny_tokenizer())
    raw = json.loads((tmp_path / "i" / "manifest.json").read_text())
    assert raw["format"] == FORMAT_NAME and raw["format_version"] == FORMAT_VERSION
    assert raw["documents"] == 2 and raw["tokens"] == 3 and raw["separator"] == -1
    (shard,) = raw["shards"]
    assert shard["tokens"] | {"sha256": None} == {"file": "shard-00000.tokens.i32", "dtype": "int32", "length": 5,
                                                  "bytes": 20, "sha256": None}
    assert shard["sa"]["file"] == "shard-00000.sa.i32" and len(shard["sa"]["sha256"]) == 64
    tokens = np.fromfile(tmp_path / "i" / "shard-00000.tokens.i32", dtype="<i4")
    assert tokens.tolist() == [1, 2, -1, 3, -1]  # every document is followed by the separator


# ------------------------------------------------------------------ bad input
def test_empty_corpus_is_refused_and_leaves_nothing(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", [{"text": ""}], raw_lines=["{bad"])
    with pytest.raises(CorpusError, match=r"holds no text \(1 invalid records skipped\)"):
        build_index([p], tmp_path / "i", tokenizer=tiny_tokenizer(), skip_invalid=True, progress=False)
    assert leftovers(tmp_path, "i") == []
    with pytest.raises(CorpusError, match="holds no text"):
        build_index_from_tokens([[], []], tmp_path / "i")
    assert leftovers(tmp_path, "i") == []


def test_failure_after_shards_were_written_leaves_nothing(tmp_path):
    tok = tiny_tokenizer()
    good = [{"text": "the cat sat on the mat " * 5}] * 20
    p = write_jsonl(tmp_path / "c.jsonl", good, raw_lines=['{"text": "x"'])
    with pytest.raises(CorpusError, match=r"c\.jsonl:21: malformed JSON"):
        build_index([p], tmp_path / "i", tokenizer=tok, shard_tokens=40, progress=False)
    assert leftovers(tmp_path, "i") == []


def test_interrupt_leaves_nothing(tmp_path):
    def docs():
        yield from [[1, 2, 3]] * 50
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_index_from_tokens(docs(), tmp_path / "i", shard_tokens=16)
    assert leftovers(tmp_path, "i") == []


def test_existing_output_is_refused_unless_overwrite(tmp_path):
    build_index_from_tokens([[1, 2, 3]], tmp_path / "i")
    with pytest.raises(IndexFormatError, match=r"i already exists; .* overwrite=True \(--overwrite\)"):
        build_index_from_tokens([[4, 5]], tmp_path / "i")
    assert open_index(tmp_path / "i").n_tokens == 3  # untouched
    build_index_from_tokens([[4, 5]], tmp_path / "i", overwrite=True)
    assert open_index(tmp_path / "i", verify=True).n_tokens == 2
    assert leftovers(tmp_path, "i") == ["i"]  # no temporary or old directory remains


def test_overwrite_never_deletes_a_directory_that_is_not_an_index(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(IndexFormatError, match="is not a lookupdec index"):
        build_index_from_tokens([[1, 2]], tmp_path / "home", overwrite=True)
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"


def test_a_failed_overwrite_keeps_the_old_index(tmp_path):
    build_index_from_tokens([[1, 2, 3]], tmp_path / "i")
    with pytest.raises(CorpusError):
        build_index_from_tokens([[]], tmp_path / "i", overwrite=True)
    assert open_index(tmp_path / "i", verify=True).n_tokens == 3


def test_bad_token_documents_and_parameters(tmp_path):
    with pytest.raises(ValueError, match=r"document 1 holds token id -1, outside \[0, 2147483647\]"):
        build_index_from_tokens([[1], [-1, 2]], tmp_path / "i")
    with pytest.raises(ValueError, match=r"document 0 holds token id 2147483648"):
        build_index_from_tokens([np.array([2**31], np.int64)], tmp_path / "i")
    with pytest.raises(ValueError, match="token id 50.*vocabulary has 20 ids"):
        build_index_from_tokens([[50]], tmp_path / "i", tokenizer=tiny_tokenizer())
    with pytest.raises(ValueError, match="1-D sequence of integer"):
        build_index_from_tokens([[[1, 2]]], tmp_path / "i")
    with pytest.raises(ValueError, match="shard_tokens must be an integer >= 2"):
        build_index_from_tokens([[1]], tmp_path / "i", shard_tokens=1)
    with pytest.raises(IndexFormatError, match="parent .* does not exist; choose an output path"):
        build_index_from_tokens([[1]], tmp_path / "no" / "i")
    (tmp_path / "f").write_text("x")
    with pytest.raises(IndexFormatError, match="parent .*f is a file, not a directory"):
        build_index_from_tokens([[1]], tmp_path / "f" / "i")
    assert leftovers(tmp_path, "i") == []


def test_largest_token_ids_round_trip(tmp_path):
    big = 2**31 - 1
    build_index_from_tokens([[big, big - 1, big], [big, big - 1, 7]], tmp_path / "i")
    r = open_index(tmp_path / "i", verify=True).lookup([big, big - 1], min_n=1)
    assert r.match_len == 2 and sorted(r.tree.tokens.tolist()) == [7, big]
