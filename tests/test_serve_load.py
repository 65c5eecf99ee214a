"""benchmarks/serve_load.py end to end: real `lookupdec serve` processes on a tiny model, driven by
the benchmark's own `openai` client workers (slow: each run starts two servers)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from tests.conftest import ROOT, checkout_env, save_tiny  # noqa: E402

QUESTIONS = [{"question_id": i, "category": cat, "turns": turns}
             for i, (cat, turns) in enumerate([("writing", ["Write about tea.", "Now say it shorter."]),
                                               ("qa", ["What is a cat?"]), ("writing", ["Write about rain."]),
                                               ("qa", ["What is a dog?"])], 1)]


def _questions(tmp_path: Path) -> Path:
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return p


def _command(tmp_path: Path, *extra: str) -> list[str]:
    model = save_tiny(tmp_path / "model", 0, max_positions=512)
    return [sys.executable, "benchmarks/serve_load.py", "--model", model, "--questions", str(_questions(tmp_path)),
            "--per-category", "1", "--max-new-tokens", "24", "--configs", "ar,auto", "--out", str(tmp_path / "out"),
            *extra]


@pytest.mark.slow
def test_a_time_limit_reports_the_passes_done_each_checked_against_ar(tmp_path):
    res = subprocess.run(_command(tmp_path, "--concurrency", "1,2", "--time-limit", "0"), cwd=ROOT,
                         env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "serve_load.json").read_text())
    rows = doc["rows"]
    # The first pass always runs: concurrency 1, both configurations, both prompts, each answered.
    assert sorted((r["config"], r["concurrency"]) for r in rows) == [("ar", 1), ("auto", 1)]
    assert all(r["requests"] == 2 and r["tokens"] > 0 and r["exact"] is True for r in rows)
    assert "--time-limit 0 s reached after 1 of 2 passes" in doc["meta"]["stopped"]
    # Neither server starts from a drafting state that earlier runs on this machine saved.
    assert res.stderr.count("--fresh-state") == 2
    assert "Stopped early" in (tmp_path / "out" / "serve_load.md").read_text()


@pytest.mark.slow
def test_sigterm_stops_the_run_and_writes_what_it_gathered(tmp_path):
    proc = subprocess.Popen(_command(tmp_path, "--concurrency", "1,2", "--rounds", "200"), cwd=ROOT,
                            env=checkout_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 240
        for line in proc.stderr:  # wait for the first pass of both configurations
            if line.startswith("[auto] round 0 c=1") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest[-3000:]
    assert "stopped by SIGTERM" in rest
    doc = json.loads((tmp_path / "out" / "serve_load.json").read_text())
    assert "SIGTERM" in doc["meta"]["stopped"]
    assert len(doc["rows"]) >= 2 and len(doc["rows"]) < 2 * 2 * 200
    assert all(r["exact"] is not False for r in doc["rows"])


@pytest.mark.slow
def test_conversations_send_every_turn_with_the_answers_so_far(tmp_path):
    res = subprocess.run(_command(tmp_path, "--concurrency", "1", "--conversations"), cwd=ROOT,
                         env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "serve_load.json").read_text())
    assert doc["meta"]["conversations"] is True and doc["meta"]["requests"] == 3
    assert all(r["requests"] == 3 and r["exact"] is True for r in doc["rows"])  # the second turn checked too
    for config in ("ar", "auto"):
        sent = {(r["prompt"], r["turn"]): r for r in doc["requests"] if r["config"] == config}
        assert sorted(sent) == [(0, 0), (0, 1), (1, 0)]
        first, second = sent[0, 0], sent[0, 1]
        # The second turn's prompt holds the first turn's prompt and its answer, then the new user turn.
        assert first["tokens"] > 0 and second["prompt_tokens"] > first["prompt_tokens"] + first["tokens"]
