"""benchmarks/build_scale.py and ``benchmarks/datastore.py --index`` on a tiny index:
the corpus generator yields exactly the tokens asked for, and the latency run on an
index already built times every row and finds matches (no timing is asserted)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from build_scale import zipf_documents  # noqa: E402


def test_zipf_documents_yield_exactly_the_tokens_asked_for_and_repeat_with_the_seed():
    docs = list(zipf_documents(12_345, chunk=1000))
    assert sum(d.size for d in docs) == 12_345
    assert all(d.dtype == np.int32 and d.size and d.min() >= 0 and d.max() < 49152 for d in docs)
    again = list(zipf_documents(12_345, chunk=1000))
    assert all(np.array_equal(a, b) for a, b in zip(docs, again))


def test_build_then_time_an_existing_index(tmp_path):
    out, js = tmp_path / "z.index", tmp_path / "r.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/build_scale.py"), "--tokens", "30000",
                    "--shard-tokens", "8000", "-o", str(out)], check=True, cwd=ROOT, capture_output=True)
    subprocess.run([sys.executable, str(ROOT / "benchmarks/datastore.py"), "--index", str(out), "--lookups", "30",
                    "--warmup", "5", "--json", str(js)], check=True, cwd=ROOT, capture_output=True)
    r = json.loads(js.read_text())
    assert r["shards"] == 4
    # (The Python composition over shards is test code, tests/oracles/suffix_lookup.py, and no longer
    # timed: tests/test_index_lookup.py checks the native lookup against it.)
    for row in ("public", "one_call", "one_call_no_top"):
        assert r[f"lookup_{row}"]["mean_match_len"] > 1  # contexts come from the index: they match
    # every row looked the same contexts up: the same mean match length
    assert len({r[f"lookup_{row}"]["mean_match_len"] for row in ("public", "one_call", "one_call_no_top")}) == 1
