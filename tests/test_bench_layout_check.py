"""benchmarks/layout_check.py relinks the build's objects with the kernels moved by the padding asked for,
times products in each copy, and refuses bad input."""
import glob
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "layout_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("layout_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _symbol(so: str, name: str) -> int:
    out = subprocess.run(["nm", so], capture_output=True, text=True, check=True).stdout
    found = [int(line.split()[0], 16) for line in out.splitlines() if line.split()[-1] == name]
    assert len(found) == 1, f"{name} appears {len(found)} times in {so}"
    return found[0]


def test_each_copy_moves_every_kernel_by_its_padding_and_nothing_else(tmp_path):
    mod = _module()
    at = {}
    for pad in (0, 16, 48):
        so = glob.glob(str(mod.link(pad, tmp_path) / "lookupdec" / "_native*.so"))[0]
        # lk_qmatmul (quantized products) and lk_rms_norm sit in different objects; PyInit_ in the module
        at[pad] = {name: _symbol(so, name) for name in ("lk_qmatmul", "lk_rms_norm", "PyInit__native")}
    for pad in (16, 48):
        assert at[pad]["lk_qmatmul"] - at[0]["lk_qmatmul"] == pad
        assert at[pad]["lk_rms_norm"] - at[0]["lk_rms_norm"] == pad
        assert at[pad]["PyInit__native"] == at[0]["PyInit__native"]


@pytest.mark.slow  # two processes, each importing torch and timing ~30 MB of products
def test_it_times_both_products_in_every_copy(tmp_path):
    out_file = tmp_path / "layout.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--pads", "0,32", "--rounds", "1", "--iters", "2",
                          "--out", str(out_file)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())
    assert result["threads"] == 1 and result["rows"] == 1 and result["isa"] in ("avx512", "avx2", "c")
    assert set(result["lm_head_ms_by_pad"]) == {"0", "32"} == set(result["layers_ms_by_pad"])
    for runs in (*result["lm_head_ms_by_pad"].values(), *result["layers_ms_by_pad"].values()):
        assert len(runs) == 1 and runs[0] > 0


def test_bad_arguments_are_refused_with_a_message():
    cases = [(["--pads", "0,x"], "comma-separated byte counts"),
             (["--pads", "-16"], "must be >= 0"),
             (["--rounds", "0"], ">= 1"),
             (["--bf16", "--isa", "avx2"], "drop --isa")]
    for extra, message in cases:
        out = subprocess.run([sys.executable, str(SCRIPT), *extra], capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and message in out.stderr, (extra, out.stderr)
