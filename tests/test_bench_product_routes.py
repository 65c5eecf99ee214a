"""benchmarks/product_routes.py times every layer product of the embedded model through the tall tiles
and the scratch tile, and refuses bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "product_routes.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a process that loads the embedded model and runs its 120 layer products
def test_it_times_both_routes_for_each_row_count(tmp_path):
    from lookupdec import _native

    out_file = tmp_path / "routes.json"
    out = _run("--threads", "1", "--rows", "5,9", "--repeats", "1", "--out", str(out_file))
    if _native.qmatmul_isa() == "c":
        assert out.returncode != 0 and "AVX-512 or AVX2" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())
    assert result["products_isa"] == _native.qmatmul_isa() and result["threads"] == 1
    assert result["products"] == 30 * 4  # the embedded model's 30 layers, four products each
    assert result["tall_rows"] >= 8
    assert set(result["ms"]) == {"5", "9"}
    for times in result["ms"].values():
        assert set(times) == {"tall", "scratch"} and min(times.values()) > 0


def test_bad_arguments_are_refused_with_a_message():
    for extra, message in [(["--rows", "0"], "at least 1"), (["--rows", "5,x"], "comma-separated integers"),
                           (["--repeats", "0"], "at least 1"), (["--isa", "sse"], "invalid choice")]:
        out = _run(*extra)
        assert out.returncode == 2 and message in out.stderr, (extra, out.stderr)
