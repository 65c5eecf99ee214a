"""`lookupdec serve`'s option errors: clean messages, non-zero exit, no traceback, nothing served."""
from __future__ import annotations

from click.testing import CliRunner

from lookupdec.cli import main


def test_serve_help_names_the_options():
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0
    for opt in ("--model", "--index", "--history", "--host", "--port", "--max-batch", "--max-queue", "--api-key",
                "--method"):
        assert opt in r.output, opt


def test_serve_errors_are_clean(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["serve", "--model", str(tmp_path / "missing"), "--port", "1"])
    assert r.exit_code != 0 and "not found" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["serve", "--max-batch", "0"])
    assert r.exit_code != 0 and "--max-batch" in r.output
    r = runner.invoke(main, ["serve", "--method", "draft"])
    assert r.exit_code != 0 and "draft model" in r.output
    (tmp_path / "file").write_text("x")
    r = runner.invoke(main, ["serve", "--history", str(tmp_path / "file" / "h")])
    assert r.exit_code != 0 and "Traceback" not in r.output
