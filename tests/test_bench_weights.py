"""benchmarks/weights_agreement.py and benchmarks/memory.py at tiny scale."""
from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark, save_tiny

def test_first_divergence_rules():
    wa = load_benchmark("weights_agreement")
    assert wa.first_divergence([], []) == -1
    assert wa.first_divergence([4, 5], [4, 5]) == -1
    assert wa.first_divergence([4, 5], [4, 6]) == 1
    assert wa.first_divergence([4], [4, 6, 7]) == 1   # one output ended first
    assert wa.first_divergence([9, 5], [4, 5]) == 0


@pytest.mark.cpu  # float16 is a format of the fast forward, which is CPU code
def test_weights_agreement_runs_and_counts_what_it_compared(tmp_path):
    wa = load_benchmark("weights_agreement")
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
    mem = load_benchmark("memory")
    with pytest.raises(SystemExit):
        mem.main(["--model", "some/dir"])
