"""Parallel local builds: identical output whatever jobs is, memory sizes and plans, peak RSS reported."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lookupdec.index import build_index, open_index
from lookupdec.index.parallel import BYTES_PER_ENTRY, BASE_BYTES, ParallelEncoder, parse_size, plan_memory
from lookupdec.index.corpus import encode_texts
from tests.index_fixtures import WORDS, tiny_tokenizer, write_jsonl


def corpus(tmp_path, n=400, seed=0):
    rng = np.random.default_rng(seed)
    records = [{"text": " ".join(rng.choice(WORDS, rng.integers(1, 60)))} for _ in range(n)]
    return write_jsonl(tmp_path / "c.jsonl", records), records


def test_output_is_byte_identical_whatever_jobs_is(tmp_path):
    path, records = corpus(tmp_path)
    tok = tiny_tokenizer()
    s1 = build_index([path], tmp_path / "j1", tokenizer=tok, shard_tokens=2000, jobs=1, progress=False)
    s2 = build_index([path], tmp_path / "j2", tokenizer=tok, shard_tokens=2000, jobs=2, progress=False)
    assert s1.shards == s2.shards >= 4 and s2.jobs == 2
    files = sorted(p.name for p in (tmp_path / "j1").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "j2").iterdir())
    for name in files:
        if name != "manifest.json":
            assert (tmp_path / "j1" / name).read_bytes() == (tmp_path / "j2" / name).read_bytes(), name
    m1, m2 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("j1", "j2"))
    m1.pop("created"), m2.pop("created")
    assert m1 == m2
    # And the tokens are the corpus's, in order.
    idx = open_index(tmp_path / "j2", verify=True)
    stream = np.concatenate([s.tokens for s in idx._shards])
    expected = np.concatenate([np.append(tok.encode(r["text"], add_special_tokens=False).ids, -1) for r in records])
    assert stream.tolist() == expected.tolist()


def test_parallel_encoder_keeps_batch_order(tmp_path):
    tok = tiny_tokenizer()
    batches = [[f"the cat {w}" for w in WORDS[i:]] for i in range(len(WORDS))]
    with ParallelEncoder(tok, 2) as enc:
        got = [[a.tolist() for a in arrays] for arrays in enc.map(batches)]
    assert got == [[a.tolist() for a in encode_texts(tok, b)] for b in batches]


def test_summary_reports_peak_rss(tmp_path):
    path, _ = corpus(tmp_path, n=20)
    s = build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), jobs=1, progress=False)
    assert s.peak_rss_bytes > 10 * 2**20  # at least the interpreter itself


@pytest.mark.parametrize("text, expected", [("2G", 2 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                            ("1000", 1000), ("64k", 64 * 2**10), (4096, 4096)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "2X", "-1G", "0", "G", "two gigs", 0])
def test_parse_size_refuses_bad_strings(bad):
    with pytest.raises(ValueError, match="2G|positive"):
        parse_size(bad)


def test_max_memory_sets_the_shard_size_independently_of_jobs():
    limit = 2 * 2**30
    plans = [plan_memory(limit, None, jobs, 10**9) for jobs in (1, 2, 4)]
    assert len({p.shard_tokens for p in plans}) == 1
    assert plans[0].shard_tokens == (limit - BASE_BYTES) // 2 // BYTES_PER_ENTRY
    assert all(p.parallel_shards == 1 for p in plans)  # a derived shard takes half: no room for two
    small = plan_memory(limit, 10**7, 8, 10**9)  # explicit small shards: several build at once, within the limit
    assert 1 < small.parallel_shards <= 8
    assert BASE_BYTES + small.parallel_shards * BYTES_PER_ENTRY * 10**7 <= limit


def test_too_little_memory_is_refused_and_writes_nothing(tmp_path):
    path, _ = corpus(tmp_path, n=5)
    with pytest.raises(ValueError, match="too small"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), max_memory="100M", progress=False)
    with pytest.raises(ValueError, match="lower --shard-tokens"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), max_memory="1G", shard_tokens=10**9,
                    progress=False)
    with pytest.raises(ValueError, match="or --jobs"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), max_memory="1G", jobs=16, progress=False)
    with pytest.raises(ValueError, match="jobs"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), jobs=0, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]
