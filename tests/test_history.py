"""The history store: durable, shared between processes, bounded; and drafting from it is exact."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from lookupdec.decoder import Decoder
from lookupdec.errors import TokenizerMismatchError
from lookupdec.index.history import MANIFEST, HistoryError, check_history_path, open_history
from tests.conftest import FLAT, char_tokenizer, checkout_env, save_tiny, tiny_loaded

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def all_tokens(store) -> list[list[int]]:
    """Every record as the store holds it: segments' documents and the log's records, oldest first."""
    from lookupdec.index.manifest import SEP

    out = []
    for idx in store.indexes():
        for shard in idx._shards:
            doc = []
            for t in shard.tokens.tolist():
                if t == SEP:
                    out.append(doc)
                    doc = []
                else:
                    doc.append(t)
    return out


def test_append_reopen_and_compaction_keep_every_record(tmp_path):
    store = open_history(tmp_path / "h", compact_tokens=50)
    recs = [list(range(i, i + 7)) for i in range(20)]
    for r in recs:
        store.append(r)
    # 140 tokens with compaction at 50: two segments and a log of the rest.
    assert store.n_segments == 2 and store.n_tokens == 140
    again = open_history(tmp_path / "h", compact_tokens=50)
    assert all_tokens(again) == recs
    # A lookup through the store finds what followed.
    hit = again.indexes()[0].lookup([3, 4, 5], max_n=3, min_n=2, depth=2)
    assert hit.match_len == 3 and hit.tree.tokens.tolist()[:2] == [6, 7]


def test_budget_drops_the_oldest_segments(tmp_path):
    store = open_history(tmp_path / "h", budget_tokens=100, compact_tokens=30)
    for i in range(40):
        store.append([1000 + i] * 5)
    # Never more than budget + one segment + the log below compact_tokens.
    assert store.n_tokens <= 100 + 30 + 30
    kept = [t for r in all_tokens(store) for t in r]
    assert 1000 + 39 in kept and 1000 not in kept  # the newest stays, the oldest went
    assert len([p for p in (tmp_path / "h").iterdir() if p.name.startswith("seg-")]) == store.n_segments


def test_a_torn_last_record_is_skipped_then_cut_off(tmp_path):
    store = open_history(tmp_path / "h")
    store.append([1, 2, 3])
    log = tmp_path / "h" / json.loads((tmp_path / "h" / MANIFEST).read_text())["log"]
    with open(log, "ab") as f:  # what a writer killed mid-write leaves
        f.write(b"LKH1\x05\x00\x00\x00garbage")
    assert all_tokens(open_history(tmp_path / "h")) == [[1, 2, 3]]
    store.append([4, 5])
    assert all_tokens(open_history(tmp_path / "h")) == [[1, 2, 3], [4, 5]]
    # A record whose payload was altered fails its checksum and is skipped.
    data = bytearray(log.read_bytes())
    data[16] ^= 0xFF
    log.write_bytes(bytes(data))
    assert all_tokens(open_history(tmp_path / "h")) == [[4, 5]]


APPENDER = """
import sys
from lookupdec.index.history import open_history
store = open_history(sys.argv[1], compact_tokens=int(sys.argv[3]))
tag = int(sys.argv[2])
for i in range(int(sys.argv[4])):
    store.append([tag, i] + [tag] * 30)
"""


def _appender(path, tag, compact, n):
    return subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(tag), str(compact), str(n)],
                            cwd=REPO, env=checkout_env())


def test_two_processes_appending_at_once_lose_nothing(tmp_path):
    open_history(tmp_path / "h")
    procs = [_appender(tmp_path / "h", tag, 2000, 150) for tag in (7, 9)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    recs = all_tokens(open_history(tmp_path / "h"))
    assert len(recs) == 300
    for tag in (7, 9):
        # Each process's records, all of them, whole, in its own order.
        assert [r[1] for r in recs if r[0] == tag] == list(range(150))
        assert all(r[2:] == [tag] * 30 for r in recs if r[0] == tag)


@pytest.mark.slow
def test_kill_9_at_random_moments_during_appends_and_compactions(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "h"
    open_history(path)
    seen = 0
    for trial in range(12):
        p = _appender(path, trial + 1, 97, 400)  # compacts every few records
        time.sleep(float(rng.uniform(0.2, 1.0)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        store = open_history(path, compact_tokens=97)  # always opens
        recs = all_tokens(store)
        # No torn record is served: every appender record is whole (the 999 ones are this loop's own).
        assert all(len(r) == 32 and r[2:] == [r[0]] * 30 for r in recs if r[0] != 999)
        mine = [r[1] for r in recs if r[0] == trial + 1]
        assert mine == list(range(len(mine)))  # a prefix of what this process appended
        assert len(recs) >= seen
        seen = len(recs)
        store.append([999, trial])  # the store still takes appends
        seen += 1
    assert seen > 12


def test_errors_name_the_problem_and_the_fix(tmp_path, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(HistoryError, match="is a file"):
        open_history(f)
    with pytest.raises(HistoryError, match="cannot write.*writable directory"):
        open_history(f / "sub")  # a directory cannot be made under a file
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(HistoryError, match="not a history store"):
        open_history(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    # Permission denied on append (root ignores file modes, so the failure is injected).
    store = open_history(tmp_path / "h")
    real_open = os.open

    def deny(path, *a, **k):
        if str(path).endswith(".bin"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(HistoryError, match="Permission denied.*writable"):
        store.append([1, 2])
    monkeypatch.undo()
    # A store made for one tokenizer refuses another.
    from tokenizers import Tokenizer, models

    open_history(tmp_path / "t", tokenizer=char_tokenizer())
    vocab = dict(char_tokenizer().get_vocab())
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    with pytest.raises(TokenizerMismatchError, match="another --history directory"):
        open_history(tmp_path / "t", tokenizer=Tokenizer(models.WordLevel(vocab, "<unk>")))
    with pytest.raises(HistoryError, match="is a file"):
        check_history_path(f)
    # A manifest whose number no int holds (JSON's Infinity) is named, not an OverflowError.
    h = tmp_path / "big"
    open_history(h)
    manifest = next(p for p in h.iterdir() if p.suffix == ".json")
    data = json.loads(manifest.read_text())
    for value in (float("inf"), "many"):
        manifest.write_text(json.dumps({**data, "budget_tokens": value}))
        with pytest.raises(HistoryError, match="not a readable history manifest"):
            open_history(h)


def test_history_and_auto_draft_from_earlier_outputs_and_equal_ar(tmp_path):
    lm = tiny_loaded(3)
    dec = Decoder(lm, cost_curve=FLAT, history=str(tmp_path / "h"))
    texts = ("Tell me about the weather in the hills today.", "Tell me about the weather.")
    prompts = [dec.encode(t, chat_template=False) for t in texts]
    refs = [dec.generate(p, method="ar", max_new_tokens=48) for p in prompts]
    assert all(len(r.token_ids) >= 10 for r in refs)
    for method in ("history", "auto"):
        for p, ref in zip(prompts, refs):
            out = dec.generate(p, method=method, max_new_tokens=48)
            assert out.token_ids == ref.token_ids, method
            # The same request again: most of its answer is drafted from the remembered one (in
            # auto, Token Recycling proposes the same repeated tokens and a merged path is credited
            # to the source that scored it best).
            got = out.accepted_by_source.get("history", 0)
            if method == "auto":
                got += out.accepted_by_source.get("recycle", 0)
            assert got >= len(ref.token_ids) // 2, method
    # Another process (a new Decoder on the same directory) sees the remembered outputs.
    other = Decoder(tiny_loaded(3), cost_curve=FLAT, history=str(tmp_path / "h"))
    assert other.history.n_tokens == dec.history.n_tokens > 0
    with pytest.raises(ValueError, match="needs a history store"):
        Decoder(lm, cost_curve=FLAT).generate(prompts[0], method="history")


def test_cli_history_option(tmp_path):
    d = save_tiny(tmp_path / "tiny", 3)
    base = ["generate", "--model", d, "--no-chat-template", "--max-new-tokens", "40", "--json",
            "--prompt", "Tell me about the weather in the hills today."]
    r1 = CliRunner().invoke(main, base + ["--history", str(tmp_path / "h")])
    assert r1.exit_code == 0, r1.output
    r2 = CliRunner().invoke(main,
                            base + ["--history", str(tmp_path / "h"), "--method", "history"])
    assert r2.exit_code == 0, r2.output
    a, b = json.loads(r1.stdout), json.loads(r2.stdout)
    assert a["token_ids"] == b["token_ids"] and b["accepted_by_source"].get("history", 0) > 10
    bad = tmp_path / "file"
    bad.write_text("x")
    r = CliRunner().invoke(main, base + ["--history", str(bad)])
    assert r.exit_code != 0 and "is a file" in r.output and "Traceback" not in r.output
