"""benchmarks/load_time.py: its argument checks and its cases (a real run loads the model several times: by hand)."""
from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


def test_load_time_refuses_no_repeats_and_names_a_failing_case(tmp_path):
    lt = load_benchmark("load_time")
    with pytest.raises(SystemExit):
        lt.main(["--repeats", "0"])
    # A case whose child fails stops the run with the child's error, not a time.
    with pytest.raises(SystemExit, match="(?s)load_model warm failed:.*GGUF file not found"):
        lt.run_case("load_model warm", str(tmp_path / "missing.gguf"), str(tmp_path / "cache"))
