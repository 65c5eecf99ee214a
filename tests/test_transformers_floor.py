"""The oldest transformers release that pyproject.toml accepts passes the tests most bound to
transformers: its GGUF conversion of the embedded model and tokenizer, the grammar engine's
reading of that tokenizer, model forwards with a custom cache and tree masks, sliding-window
models, and greedy and seeded exactness. ``make setup`` installs that release beside the
project's own (``.venv/transformers-floor``); this test runs those files in a child pytest with
it first on the path. Releases differ: 5.17's GGUF tokenizer made the grammar engine misread
every space, which only a run under it showed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import checkout_env

ROOT = Path(__file__).resolve().parents[1]
FLOOR_DIR = Path(sys.prefix) / "transformers-floor"
FILES = ["test_grammar_tokenizer.py", "test_readme_structured.py", "test_constraints.py", "test_decoder_exact.py",
         "test_verify.py", "test_verify_extra.py", "test_attention_kinds.py", "test_models.py", "test_seeded.py"]


def declared_floor() -> str:
    (floor,) = re.findall(r'"transformers>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return floor


@pytest.mark.slow
def test_the_oldest_accepted_transformers_passes_the_transformers_bound_tests(tmp_path):
    if not FLOOR_DIR.is_dir():
        pytest.skip(f"no {FLOOR_DIR}: `make setup` installs transformers {declared_floor()} there")
    env = checkout_env(str(FLOOR_DIR), LOOKUPDEC_CACHE=str(tmp_path / "cache"))
    version = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Version(version) == Version(declared_floor())
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"tests/{f}" for f in FILES)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", run.stdout) and " failed" not in run.stdout
