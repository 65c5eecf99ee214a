"""benchmarks/drafting_glue.py runs its pieces and refuses nonsense counts."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "drafting_glue.py"


def test_it_times_every_piece_once_and_prints_a_row_each():
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1", "--number", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and not line.startswith("| piece")]
    assert [r.split("|")[1].strip().split(" ")[0] for r in rows] == ["score,", "Token", "ledger"]
    assert all(float(r.split("|")[2]) > 0 for r in rows)


def test_a_count_below_one_is_refused_with_a_message():
    out = subprocess.run([sys.executable, str(SCRIPT), "--number", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--repeats and --number must be at least 1" in out.stderr
