"""Damaged suffix indexes, for benchmarks/reliability.py and tests/test_index_corruption.py.

Benchmarks never import test code, so what both need lives here: ``corrupt``
damages one copy of an index in one of twelve ways, ``PROBE`` is a program that
opens each index named on its stdin and looks contexts up in it, and
``word_tokenizer`` is a minimal tokenizer to record in a small index (any
tokenizer other than the default model's does).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 128  # ids the small indexes hold are below this (tests/conftest.py's TINY_VOCAB is the same size)


def word_tokenizer(vocab: int = VOCAB):
    """A ``tokenizers.Tokenizer`` of ``vocab`` placeholder words ``<t0>``..: what a small index records.

    Example:
        >>> word_tokenizer(8).get_vocab_size()
        8
    """
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab)}, unk_token="<t0>"))


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


def corrupt(d: Path, rng: np.random.Generator, vocab: int = VOCAB) -> str:
    """Damage one copy of an index in one random way; return what was done.

    Args:
        d: an index directory (a copy: it is damaged in place).
        rng: picks the kind of damage (one of twelve) and where.
        vocab: the vocabulary size its tokenizer has (kind 5 writes ids at or past it).

    Returns:
        ``"kind N"``.
    """
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
        t[rng.integers(0, t.size - 1, 30)] = rng.integers(vocab, 2**31 - 1, 30)
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
