"""benchmarks/weights_agreement.py and benchmarks/memory.py at tiny scale."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import save_tiny

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_first_divergence_rules():
    wa = _load("weights_agreement")
    assert wa.first_divergence([], []) == -1
    assert wa.first_divergence([4, 5], [4, 5]) == -1
    assert wa.first_divergence([4, 5], [4, 6]) == 1
    assert wa.first_divergence([4], [4, 6, 7]) == 1   # one output ended first
    assert wa.first_divergence([9, 5], [4, 5]) == 0


@pytest.mark.cpu  # float16 is a format of the fast forward, which is CPU code
def test_weights_agreement_runs_and_counts_what_it_compared(tmp_path):
    wa = _load("weights_agreement")
    out = tmp_path / "a.json"
    rc = wa.main(["--model", save_tiny(tmp_path / "m", 1, scale=1.0), "--n-specbench", "3", "--n-humaneval", "2",
                  "--max-new-tokens", "24", "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and len(data["rows"]) == 5
    s = data["summary"]
    assert s["specbench"]["generations"] == 3 and s["humaneval"]["generations"] == 2
    assert s["all"]["identical"] == sum(r["position"] < 0 for r in data["rows"])
    for r in data["rows"]:
        if r["position"] >= 0 and r["token32"] >= 0 and r["token16"] >= 0:
            # each format prefers its own token at the divergence
            assert r["gap32"] >= 0 and r["gap16"] >= 0


def test_memory_benchmark_rejects_non_gguf_models():
    mem = _load("memory")
    with pytest.raises(SystemExit):
        mem.main(["--model", "some/dir"])
