"""Damaged indexes: every lookup is a clear error or harmless drafts, never a crash."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lookupdec.index import build_index_from_tokens, open_index
from lookupdec.errors import IndexFormatError
from tests.conftest import TINY_VOCAB, char_tokenizer, checkout_env, load_benchmark

REPO = Path(__file__).resolve().parents[1]
# corrupt() and PROBE live in benchmarks/damage.py: benchmarks/reliability.py uses them too.
damage = load_benchmark("damage")
PROBE = damage.PROBE


@pytest.mark.slow
def test_a_hundred_damaged_indexes_give_clear_errors_or_harmless_drafts(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 60, int(rng.integers(5, 80))).tolist() for _ in range(60)]
    build_index_from_tokens(docs, tmp_path / "good", tokenizer=char_tokenizer())
    paths, kinds = [], []
    for i in range(100):
        d = tmp_path / f"c{i:03d}"
        shutil.copytree(tmp_path / "good", d)
        kinds.append(damage.corrupt(d, rng, vocab=TINY_VOCAB))
        paths.append(str(d))
    proc = subprocess.run([sys.executable, "-c", PROBE], input="\n".join(paths) + "\n", capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=checkout_env())
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # no crash, no uncaught exception
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 100
    errors = [r for r in rows if "error" in r]
    served = [r for r in rows if "lookups" in r]
    for r in errors:
        assert r["error"] == "IndexFormatError" and "rebuild" in r["message"], r
    for r in served:
        assert r["valid"] and r["max_token"] < TINY_VOCAB, r  # harmless drafts only
    # Both outcomes happen: some damage is caught on opening, some only makes lookups wrong.
    assert len(errors) >= 30 and len(served) >= 10, (len(errors), len(served))


def test_open_checks_the_final_separator_and_a_sample_of_the_suffix_array(tmp_path):
    build_index_from_tokens([[5, 6, 7], [8, 9]], tmp_path / "i")
    sa = next((tmp_path / "i").glob("*.sa.i32"))
    good = sa.read_bytes()
    a = np.fromfile(sa, np.int32)
    a[::2] = -2**30
    a.tofile(sa)
    with pytest.raises(IndexFormatError, match="positions outside"):
        open_index(tmp_path / "i")
    sa.write_bytes(good)
    tok = next((tmp_path / "i").glob("*.tokens.i32"))
    t = np.fromfile(tok, np.int32)
    t[-1] = 4
    t.tofile(tok)
    with pytest.raises(IndexFormatError, match="does not end with a document separator"):
        open_index(tmp_path / "i")


LOOKER = r"""
import json, sys
import numpy as np
from lookupdec.index import open_index
idx = open_index(sys.argv[1])
rng = np.random.default_rng(int(sys.argv[2]))
out = []
for _ in range(400):
    ctx = rng.integers(3, 60, int(rng.integers(1, 12))).tolist()
    r = idx.lookup(ctx, max_n=8, min_n=1, max_occurrences=64, depth=6, budget=16)
    out.append([r.match_len, r.occurrences, r.tree.tokens.tolist(), r.counts.tolist()])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_four_processes_looking_up_one_index_agree(tmp_path):
    rng = np.random.default_rng(1)
    build_index_from_tokens([rng.integers(3, 60, int(rng.integers(5, 300))).tolist() for _ in range(400)],
                            tmp_path / "i", shard_tokens=20_000)
    env = checkout_env()
    # The same contexts (seed 5) in four processes at once, and once alone.
    procs = [subprocess.Popen([sys.executable, "-c", LOOKER, str(tmp_path / "i"), "5"], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env=env) for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    alone = json.loads(subprocess.run([sys.executable, "-c", LOOKER, str(tmp_path / "i"), "5"], capture_output=True,
                                      text=True, cwd=REPO, env=env, check=True).stdout)
    assert all(o == alone for o in outs)
    assert sum(1 for row in alone if row[0]) > 300  # the lookups found matches
