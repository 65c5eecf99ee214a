"""Appends and compaction: new manifest versions, old readers keep working, same lookups as a fresh build."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.errors import IndexFormatError, TokenizerMismatchError
from lookupdec.index import append_to_index, build_index, build_index_from_tokens, compact_index, open_index
from lookupdec.index.append import plan_compaction
from tests.index_fixtures import WORDS, tiny_tokenizer, write_jsonl


def texts(seed, n):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS[:8], rng.integers(3, 30))) for _ in range(n)]


def lookups(idx, contexts):
    out = []
    for ctx in contexts:
        r = idx.lookup(ctx, max_n=6, min_n=1, max_occurrences=100_000, depth=4, budget=64)
        out.append((r.match_len, r.occurrences, r.tree.tokens.tolist(), r.tree.parents.tolist(), r.counts.tolist()))
    return out


@pytest.fixture
def built(tmp_path):
    tok = tiny_tokenizer()
    a, b = texts(0, 60), texts(1, 40)
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in a])
    write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in b + ["unique words home park return"]])
    build_index([tmp_path / "a.jsonl"], tmp_path / "i", tokenizer=tok, shard_tokens=300, jobs=1, progress=False)
    return tmp_path, tok, a, b


def test_append_then_lookup_finds_the_new_documents_and_old_readers_keep_working(built):
    tmp_path, tok, a, b = built
    old_reader = open_index(tmp_path / "i")
    before = lookups(old_reader, [tok.encode(t).ids[:3] for t in a[:5]])
    new_ids = tok.encode("home park return").ids
    assert old_reader.lookup(new_ids[:2], max_n=2, min_n=2).match_len == 0
    s = append_to_index([tmp_path / "b.jsonl"], tmp_path / "i", tokenizer=tok, jobs=1, progress=False)
    assert s.documents == 41
    idx = open_index(tmp_path / "i", verify=True)
    assert idx.manifest.version == 2 and idx.n_documents == 101 and idx.n_shards == old_reader.n_shards + s.shards
    assert idx.lookup(new_ids[:2], max_n=2, min_n=2).tree.tokens.tolist()[:1] == [new_ids[2]]
    assert lookups(old_reader, [tok.encode(t).ids[:3] for t in a[:5]]) == before  # its files were untouched
    compact_index(tmp_path / "i", shard_tokens=10_000)
    compact_index(tmp_path / "i", shard_tokens=100_000)  # a no-op: nothing left to merge
    append_to_index([tmp_path / "b.jsonl"], tmp_path / "i", tokenizer=tok, jobs=1, progress=False)
    compact_index(tmp_path / "i", shard_tokens=100_000)  # now the original shard files are unlinked
    assert not (tmp_path / "i" / old_reader.manifest.shards[0].tokens.file).exists()
    assert lookups(old_reader, [tok.encode(t).ids[:3] for t in a[:5]]) == before  # its maps stay valid


def test_compact_gives_the_lookups_of_a_fresh_build_with_those_boundaries(built):
    tmp_path, tok, a, b = built
    append_to_index([tmp_path / "b.jsonl"], tmp_path / "i", tokenizer=tok, jobs=1, progress=False)
    before = open_index(tmp_path / "i")
    assert before.n_shards > 3
    m = compact_index(tmp_path / "i", shard_tokens=100_000)
    assert len(m.shards) == 1 and m.version == 3
    idx = open_index(tmp_path / "i", verify=True)
    docs = [tok.encode(t).ids for t in a + b + ["unique words home park return"]]
    fresh = build_index_from_tokens(docs, tmp_path / "fresh", tokenizer=tok, shard_tokens=100_000)
    fresh_idx = open_index(fresh.path)
    name = m.shards[0].tokens.file
    assert (tmp_path / "i" / name).read_bytes() == (fresh.path / "shard-00000.tokens.i32").read_bytes()
    assert (tmp_path / "i" / m.shards[0].sa.file).read_bytes() == (fresh.path / "shard-00000.sa.i32").read_bytes()
    rng = np.random.default_rng(5)
    flat = np.concatenate([np.asarray(d) for d in docs])
    contexts = [flat[s : s + rng.integers(1, 6)].tolist() for s in rng.integers(0, flat.size - 6, 40)]
    assert lookups(idx, contexts) == lookups(fresh_idx, contexts) == lookups(before, contexts)


def test_plan_compaction_groups_consecutive_small_shards():
    assert plan_compaction([3, 3, 5, 9, 1], 8) == [[0, 1], [2], [3], [4]]
    assert plan_compaction([1, 1, 1], 2) == [[0, 1], [2]]
    assert plan_compaction([10], 2) == [[0]]


def test_append_refuses_another_tokenizer_and_non_indexes(built, tmp_path):
    tmp_path, tok, a, b = built
    other = tiny_tokenizer(WORDS[::-1])
    manifest = (tmp_path / "i" / "manifest.json").read_bytes()
    with pytest.raises(TokenizerMismatchError, match="cannot append"):
        append_to_index([tmp_path / "b.jsonl"], tmp_path / "i", tokenizer=other, progress=False)
    with pytest.raises(IndexFormatError, match="does not exist|not"):
        append_to_index([tmp_path / "b.jsonl"], tmp_path / "nothing", tokenizer=tok, progress=False)
    (tmp_path / "plain").mkdir()
    with pytest.raises(IndexFormatError, match="missing"):
        append_to_index([tmp_path / "b.jsonl"], tmp_path / "plain", tokenizer=tok, progress=False)
    assert (tmp_path / "i" / "manifest.json").read_bytes() == manifest


def test_a_failed_append_leaves_the_index_as_it_was(built):
    tmp_path, tok, a, b = built
    files = sorted(p.name for p in (tmp_path / "i").iterdir())
    write_jsonl(tmp_path / "bad.jsonl", [{"text": t} for t in b], raw_lines=["{not json"])
    with pytest.raises(Exception, match="malformed JSON"):
        append_to_index([tmp_path / "bad.jsonl"], tmp_path / "i", tokenizer=tok, shard_tokens=50, jobs=1,
                        progress=False)
    assert sorted(p.name for p in (tmp_path / "i").iterdir()) == files
    assert open_index(tmp_path / "i", verify=True).manifest.version == 1
