"""benchmarks/child_env.py: a child started by a benchmark imports the checkout and keeps the caller's PYTHONPATH."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT, load_benchmark


def test_a_child_imports_the_checkout_and_a_package_only_on_the_callers_pythonpath(tmp_path, monkeypatch):
    # A package reachable only through the caller's PYTHONPATH, as `pip install --target` leaves one.
    (tmp_path / "only_on_callers_path").mkdir()
    (tmp_path / "only_on_callers_path" / "__init__.py").write_text("MARK = 'kept'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    env = load_benchmark("child_env").checkout_env(EXTRA_SETTING="yes")
    code = ("import os, lookupdec, only_on_callers_path as p; "
            "print(os.path.dirname(os.path.dirname(lookupdec.__file__)), p.MARK, os.environ['EXTRA_SETTING'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    checkout, mark, extra = out.stdout.split()
    assert (os.path.realpath(checkout), mark, extra) == (os.path.realpath(ROOT), "kept", "yes")
