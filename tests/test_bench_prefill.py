"""benchmarks/prefill.py times both prefill paths and the public call with and without prefix reuse,
and refuses bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prefill.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a process that loads the embedded model twice and decodes a few prompts
def test_it_times_both_paths_and_reuse_on_first_and_second_turns(tmp_path):
    out_file = tmp_path / "prefill.json"
    out = _run("--threads", "1", "--lengths", "9,130", "--repeats", "1", "--every", "80", "--answer-tokens", "8",
               "--out", str(out_file))
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())
    assert result["threads"] == 1 and result["device"]
    assert set(result["paths"]) == {"quantized", "float32"}
    assert result["paths"]["quantized"]["default"] == "chunks" and result["paths"]["float32"]["default"] == "sdpa"
    for part in result["paths"].values():
        assert set(part["ms"]) == {"9", "130"}
        assert all(set(t) == {"sdpa", "chunks"} and min(t.values()) > 0 for t in part["ms"].values())
    cases = {r["case"] for r in result["reuse"]}
    assert cases == {"first turn", "second turn"}  # question 1 (every 80th from 0) is MT-bench's: two turns
    for r in result["reuse"]:
        assert 0 < r["reused_tokens"] < r["prompt_tokens"] and set(r["ms"]) == {"reuse", "none"}
        if r["case"] == "second turn":  # the first turn's prompt and answer were kept
            assert r["reused_tokens"] > 8


def test_bad_arguments_are_refused_with_a_message(tmp_path):
    for extra, message in [(["--lengths", "0"], "at least 1"), (["--lengths", "5,x"], "comma-separated integers"),
                           (["--repeats", "0"], "at least 1"), (["--weights", "int3"], "choose from"),
                           (["--questions", str(tmp_path / "none.jsonl")], "cannot read")]:
        out = _run(*extra)
        assert out.returncode == 2 and message in out.stderr, (extra, out.stderr)
