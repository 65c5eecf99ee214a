"""`lookupdec generate --json-schema / --regex / --grammar / --choice`: constrained output and clean errors."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from tests.conftest import save_tiny

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}},
          "required": ["ok", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("m"), 0)


def run(model_dir, *args):
    return CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "hello there", "--method", "pld",
                                     "--max-new-tokens", "40", "--json", *args])


def test_each_option_constrains_the_output(model_dir, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    lark = tmp_path / "g.lark"
    lark.write_text('start: "<" /[a-z]{2,4}/ ">"\n')
    r = run(model_dir, "--json-schema", str(schema))
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)
    jsonschema.validate(json.loads(row["text"]), SCHEMA)
    assert row["incomplete"] is False and row["stop_reason"] == "eos"
    r = run(model_dir, "--regex", r"[0-9]{3}-[0-9]{2}")
    assert r.exit_code == 0 and re.fullmatch(r"[0-9]{3}-[0-9]{2}", json.loads(r.output)["text"]), r.output
    r = run(model_dir, "--grammar", str(lark))
    assert r.exit_code == 0 and re.fullmatch(r"<[a-z]{2,4}>", json.loads(r.output)["text"]), r.output
    r = run(model_dir, "--choice", "alpha", "--choice", "beta gamma")
    assert r.exit_code == 0 and json.loads(r.output)["text"] in ("alpha", "beta gamma"), r.output


def test_an_unfinished_constraint_is_reported(model_dir):
    r = CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "hi", "--method", "ar",
                                  "--max-new-tokens", "3", "--regex", "[a-z]{10}"])
    assert r.exit_code == 0
    assert "does not complete the structured-output constraint" in r.output


@pytest.mark.parametrize("args, message", [
    (["--regex", "[a-"], "--regex"),
    (["--regex", "a", "--choice", "b"], "one structured-output option"),
    (["--json-schema", "/nonexistent/s.json"], "cannot read"),
    (["--choice", ""], "at least one"),
])
def test_bad_constraints_exit_nonzero_with_a_message_and_no_output(model_dir, args, message):
    r = run(model_dir, *args)
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output and '"text"' not in r.output


def test_a_schema_file_that_is_not_json_or_not_a_schema(model_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    r = run(model_dir, "--json-schema", str(bad))
    assert r.exit_code != 0 and "not valid JSON" in r.output
    bad.write_text(json.dumps({"type": "nosuchtype"}))
    r = run(model_dir, "--json-schema", str(bad))
    assert r.exit_code != 0 and "--json-schema" in r.output
