"""`lookupdec serve`'s option errors: clean messages, non-zero exit, no traceback, nothing served."""
from __future__ import annotations

import socket

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
    r = runner.invoke(main, ["serve", "--model", str(tmp_path / "missing"), "--port", "0"])
    assert r.exit_code != 0 and "not found" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["serve", "--max-batch", "0"])
    assert r.exit_code != 0 and "--max-batch" in r.output
    r = runner.invoke(main, ["serve", "--method", "draft"])
    assert r.exit_code != 0 and "draft model" in r.output
    (tmp_path / "file").write_text("x")
    r = runner.invoke(main, ["serve", "--history", str(tmp_path / "file" / "h")])
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_an_empty_api_key_is_refused_rather_than_serving_without_one(tmp_path, monkeypatch):
    runner = CliRunner()
    for args, env in ((["--api-key", ""], {}), (["--api-key", "  "], {}), ([], {"LOOKUPDEC_API_KEY": ""})):
        r = runner.invoke(main, ["serve", "--model", str(tmp_path / "missing"), "--port", "0", *args], env=env)
        assert r.exit_code == 2 and "--api-key" in r.output and "is empty" in r.output, (args, env, r.output)


def test_an_address_that_cannot_be_listened_on_is_named_before_the_model_loads(tmp_path):
    runner = CliRunner()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The model does not exist either: the address is checked first, so that is not what is reported.
        r = runner.invoke(main, ["serve", "--model", str(tmp_path / "missing"), "--port", str(port)])
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output and "--port" in r.output, r.output
    r = runner.invoke(main, ["serve", "--model", str(tmp_path / "missing"), "--host", "256.1.1.1", "--port", "0"])
    assert r.exit_code == 1 and "cannot listen on 256.1.1.1" in r.output and "--host" in r.output, r.output
    assert "Traceback" not in r.output
