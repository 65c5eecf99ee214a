"""benchmarks/step_host.py times the real model's forwards from outside and refuses bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_host.py"


def _questions(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    lines = [{"question_id": 1, "category": "writing", "turns": ["Write two lines about the sea."]},
             {"question_id": 2, "category": "rag", "turns": ["Repeat: the cat sat on the mat, the cat sat."]}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.slow  # loads the real embedded model
def test_it_prints_one_row_per_method_with_steps_and_both_host_shares(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--questions", str(_questions(tmp_path)), "--methods", "ar,pld",
                          "--max-new-tokens", "8", "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| `")]
    assert [r[0].strip() for r in rows] == ["`ar`", "`pld`"]
    for r in rows:
        steps, between, forward = int(r[1]), r[3].split("/"), float(r[4])
        assert 2 <= steps <= 2 * 7  # two prompts of at most 8 tokens: the first comes from the prefill
        assert float(between[0]) > 0 and float(between[1]) > 0 and forward > 0
        assert 0 < float(r[5].strip().rstrip("%")) < 100 and 0 < float(r[6].strip().rstrip("%")) < 100


@pytest.mark.slow  # loads the real embedded model
def test_it_compares_each_method_with_and_without_the_one_call_step_prompt_by_prompt(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--questions", str(_questions(tmp_path)), "--methods", "ar",
                          "--max-new-tokens", "6", "--threads", "1", "--compare-torch-glue"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| `")]
    assert [r[0].strip() for r in rows] == ["`ar`", "`ar, torch glue`"]
    assert rows[0][1] == rows[1][1]  # the same steps: the same tokens either way
    assert all(float(r[7]) > 0 for r in rows)
    summary = [line for line in out.stdout.splitlines() if line.startswith("`ar`: the one-call step")]
    assert len(summary) == 1 and " of 2 prompts" in summary[0]


def test_bad_arguments_are_refused_with_a_message(tmp_path):
    q = str(_questions(tmp_path))
    cases = [(["--max-new-tokens", "0"], "must be at least 1"),
             (["--methods", "nope"], "unknown method"),
             (["--questions", str(tmp_path / "missing.jsonl")], "not found"),
             (["--weights", "float32", "--compare-torch-glue", "--max-new-tokens", "2"], "needs a weight format")]
    for extra, message in cases:
        args = [sys.executable, str(SCRIPT), "--questions", q, *extra] if "--questions" not in extra else \
            [sys.executable, str(SCRIPT), *extra]
        out = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and message in out.stderr, (extra, out.stderr)
