"""The README's structured-output example runs as written on the embedded model, and each output is exactly
constrained ``ar``'s and valid against its constraint."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = pytest.mark.slow


def example_block() -> str:
    section = README.read_text(encoding="utf-8").split("## Structured output", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_structured_example_runs_is_valid_and_equals_constrained_ar():
    printed = []
    env = {"print": lambda *a, **k: printed.append(a)}
    exec(compile(example_block(), "README.md", "exec"), env)  # noqa: S102  (our own README's example)
    dec, res, label, date = env["dec"], env["res"], env["label"], env["date"]
    assert len(printed) == 2
    jsonschema.validate(json.loads(res.text), env["schema"])
    assert res.stop_reason == "eos" and not res.incomplete
    assert label.text in ("science", "sports", "politics")
    assert re.fullmatch(r"[A-Z][a-z]+ [0-9]{1,2}, [0-9]{4}", date.text)
    ar = dec.generate(env["ask"], method="ar", references=None, grammar=env["schema"], max_new_tokens=80)
    assert ar.token_ids == res.token_ids
