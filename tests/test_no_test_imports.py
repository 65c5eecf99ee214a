"""Neither the package nor the benchmarks import test code: what they share with tests lives under
benchmarks/ or in lookupdec/ (oracles stay test code, so an equivalence test never checks a rule against itself)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_of_tests_are_found_in_every_form():
    # The checker itself: each way of importing the tests package is caught, look-alikes are not.
    caught = ["import tests", "import tests.conftest", "from tests import conftest",
              "from tests.oracles.live import PyLiveIndex", "def f():\n    from tests.conftest import x"]
    for src in caught:
        assert imports_of_tests(src) == [1 if "def" not in src else 2], src
    for src in ["import testsuite", "from lookupdec.tests_helpers import x", "from .tests import y", "x = 'tests'"]:
        assert imports_of_tests(src) == [], src


def imports_of_tests(source: str) -> list[int]:
    """Line numbers of the statements in ``source`` that import the top-level ``tests`` package."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n == "tests" or n.startswith("tests.") for n in names):
            lines.append(node.lineno)
    return lines


def test_no_benchmark_imports_tests():
    files = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert len(files) > 10  # the benchmarks are really there
    offenders = {str(f.relative_to(ROOT)): imports_of_tests(f.read_text(encoding="utf-8")) for f in files}
    assert {f: ln for f, ln in offenders.items() if ln} == {}


def test_the_package_never_imports_tests():
    files = sorted((ROOT / "lookupdec").rglob("*.py"))
    assert len(files) > 20
    offenders = {str(f.relative_to(ROOT)): imports_of_tests(f.read_text(encoding="utf-8")) for f in files}
    assert {f: ln for f, ln in offenders.items() if ln} == {}
