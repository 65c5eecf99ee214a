"""benchmarks/attention_shapes.py times the native attention over decoder shapes, both scorings with
``--compare-attention`` (after checking they gave the same bits), float32 and float16 caches with
``--compare-kv`` (after checking the float16 one gave a float32 cache's bits), and refuses bad input."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention_shapes.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_it_times_each_shape_under_both_scorings(tmp_path):
    out_file = tmp_path / "attention.json"
    out = _run("--threads", "1", "--layers", "2", "--repeats", "1", "--shapes", "2x1@40,1x21@70",
               "--compare-attention", "--out", str(out_file))
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())
    assert result["threads"] == 1 and result["layers"] == 2 and result["heads"] == [9, 3, 64]
    assert set(result["shapes"]) == {"2x1@40", "1x21@70"}
    for shape in result["shapes"].values():
        assert shape["lanes_ms"] > 0 and shape["tiles_ms"] > 0 and shape["gmac_s"] > 0


def test_it_times_each_shape_over_float32_and_float16_caches(tmp_path):
    out_file = tmp_path / "kv.json"
    out = _run("--threads", "1", "--layers", "2", "--repeats", "1", "--shapes", "2x1@40,1x21@70", "--compare-kv",
               "--out", str(out_file))
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())
    assert set(result["shapes"]) == {"2x1@40", "1x21@70"}
    for shape in result["shapes"].values():
        assert shape["float32_ms"] > 0 and shape["float16_ms"] > 0


def test_bad_arguments_are_refused_with_a_message():
    for extra, message in [(["--shapes", "1x0@5"], "SEQUENCESxROWS@PAST"), (["--shapes", "3@4"], "SEQUENCESxROWS@PAST"),
                           (["--heads", "9,2,64"], "kv heads must divide"), (["--heads", "9,3"], "three integers"), (["--repeats", "0"], "at least 1"),
                           (["--compare-kv", "--compare-attention"], "one comparison a run")]:
        out = _run(*extra)
        assert out.returncode == 2 and message in out.stderr, (extra, out.stderr)
