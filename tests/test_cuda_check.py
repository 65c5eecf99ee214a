"""benchmarks/cuda_check.sh: the GPU checks' runner (its parts run only on a machine with CUDA)."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, checkout_env


def test_cuda_check_runs_no_part_whose_limit_is_zero_and_names_each(tmp_path):
    env = checkout_env(SUITE_S="0", SERVE_S="0", PRED_S="0", PYTHON=sys.executable)
    out = tmp_path / "out"
    res = subprocess.run(["bash", "benchmarks/cuda_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert [line for line in res.stdout.splitlines() if line.endswith(": skipped")] == \
        ["suite: skipped", "serve: skipped", "predicted: skipped"]
    assert (out / "machine.txt").is_file() and not list(out.glob("*.log"))


def test_cuda_check_gives_each_part_its_own_limit(tmp_path):
    """A part that outruns its limit is stopped (exit 124) and the next part still runs."""
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/bash\ncase "$1 $2" in "-m pytest") sleep 30;; benchmarks/serve_load.py*) echo served;; esac\n')
    fake.chmod(0o755)
    env = checkout_env(SUITE_S="1", SERVE_S="20", PRED_S="0", PYTHON=str(fake))
    out = tmp_path / "out"
    res = subprocess.run(["bash", "benchmarks/cuda_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "suite: exit 124" in res.stdout and "serve: exit 0" in res.stdout and "served" in res.stdout
    assert "predicted: skipped" in res.stdout
