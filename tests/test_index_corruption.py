"""Damaged indexes: every lookup is a clear error or harmless drafts, never a crash."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lookupdec.index import build_index_from_tokens, open_index
from lookupdec.errors import IndexFormatError
from tests.conftest import TINY_VOCAB, char_tokenizer

REPO = Path(__file__).resolve().parents[1]

# Opens each index named on stdin, looks 30 contexts up in it, and prints one JSON line per
# index: {"error": type, "message": ...} or {"lookups": n, "max_token": m, "valid": bool}.
PROBE = r"""
import json, sys
import numpy as np
from lookupdec.errors import LookupdecError
from lookupdec.index import open_index
rng = np.random.default_rng(0)
for line in sys.stdin:
    path = line.strip()
    try:
        idx = open_index(path)
        top, valid = -1, True
        for _ in range(30):
            ctx = rng.integers(0, 60, int(rng.integers(1, 20))).tolist()
            r = idx.lookup(ctx, max_n=8, min_n=1, max_occurrences=50, depth=6, budget=32)
            if len(r.tree):
                top = max(top, int(r.tree.tokens.max()))
                valid = valid and r.tree.check() == "" and int(r.tree.tokens.min()) >= 0
        print(json.dumps({"lookups": 30, "max_token": top, "valid": valid}), flush=True)
    except LookupdecError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
"""


def corrupt(d: Path, rng: np.random.Generator) -> str:
    """Damage one copy of an index in one random way; return what was done."""
    tokens = next(d.glob("*.tokens.i32"))
    sa = next(d.glob("*.sa.i*"))
    man = d / "manifest.json"
    kind = int(rng.integers(0, 12))
    if kind == 0:  # the reproduction of the crash: -2**30 in every 7th suffix-array entry
        a = np.fromfile(sa, np.int32)
        a[::7] = -2**30
        a.tofile(sa)
    elif kind == 1:  # random suffix-array values anywhere in int32
        a = np.fromfile(sa, np.int32)
        m = rng.random(a.size) < float(rng.uniform(0.01, 1.0))
        a[m] = rng.integers(-2**31, 2**31 - 1, int(m.sum()), dtype=np.int64).astype(np.int32)
        a.tofile(sa)
    elif kind == 2:  # entries swapped: still in range, no longer sorted
        a = np.fromfile(sa, np.int32)
        i, j = rng.integers(0, a.size, (2, 50))
        a[i], a[j] = a[j], a[i]
        a.tofile(sa)
    elif kind == 3:  # huge positions, just past the end
        a = np.fromfile(sa, np.int32)
        a[rng.integers(0, a.size, 20)] = a.size + rng.integers(0, 1000, 20)
        a.tofile(sa)
    elif kind == 4:  # negative tokens below the separator
        t = np.fromfile(tokens, np.int32)
        t[rng.integers(0, t.size - 1, 30)] = rng.integers(-2**31, -2, 30)
        t.tofile(tokens)
    elif kind == 5:  # token ids past the vocabulary
        t = np.fromfile(tokens, np.int32)
        t[rng.integers(0, t.size - 1, 30)] = rng.integers(TINY_VOCAB, 2**31 - 1, 30)
        t.tofile(tokens)
    elif kind == 6:  # separators removed or added
        t = np.fromfile(tokens, np.int32)
        seps = np.flatnonzero(t == -1)
        t[seps[: len(seps) // 2]] = 5
        t[rng.integers(0, t.size, 10)] = -1
        t.tofile(tokens)
    elif kind == 7:  # garbage manifest
        man.write_bytes(rng.bytes(int(rng.integers(0, 400))))
    elif kind == 8:  # a manifest field changed or of the wrong type
        m = json.loads(man.read_text())
        shard = m["shards"][0]
        field, value = [("length", shard["tokens"]["length"] + 5), ("dtype", "float32"), ("bytes", -1),
                        ("length", "many"), ("file", "../escape")][int(rng.integers(0, 5))]
        shard["tokens" if rng.random() < 0.5 else "sa"][field] = value
        man.write_text(json.dumps(m))
    elif kind == 9:  # vocabulary or counts altered
        m = json.loads(man.read_text())
        m[["tokens", "documents", "format_version"][int(rng.integers(0, 3))]] = int(rng.integers(-5, 10**9))
        man.write_text(json.dumps(m))
    elif kind == 10:  # a file truncated
        f = [tokens, sa, man][int(rng.integers(0, 3))]
        data = f.read_bytes()
        f.write_bytes(data[: int(rng.integers(0, len(data)))])
    else:  # a file missing
        [tokens, sa][int(rng.integers(0, 2))].unlink()
    return f"kind {kind}"


@pytest.mark.slow
def test_a_hundred_damaged_indexes_give_clear_errors_or_harmless_drafts(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 60, int(rng.integers(5, 80))).tolist() for _ in range(60)]
    build_index_from_tokens(docs, tmp_path / "good", tokenizer=char_tokenizer())
    paths, kinds = [], []
    for i in range(100):
        d = tmp_path / f"c{i:03d}"
        shutil.copytree(tmp_path / "good", d)
        kinds.append(corrupt(d, rng))
        paths.append(str(d))
    proc = subprocess.run([sys.executable, "-c", PROBE], input="\n".join(paths) + "\n", capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The same contexts (seed 5) in four processes at once, and once alone.
    procs = [subprocess.Popen([sys.executable, "-c", LOOKER, str(tmp_path / "i"), "5"], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env=env) for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    alone = json.loads(subprocess.run([sys.executable, "-c", LOOKER, str(tmp_path / "i"), "5"], capture_output=True,
                                      text=True, cwd=REPO, env=env, check=True).stdout)
    assert all(o == alone for o in outs)
    assert sum(1 for row in alone if row[0]) > 300  # the lookups found matches
