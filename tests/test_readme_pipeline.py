"""The README's RAG and summarization example runs as written, and its outputs are plain greedy outputs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = pytest.mark.slow


def pipeline_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## RAG and summarization pipelines", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_pipeline_example_runs_and_equals_greedy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = []
    env = {"print": lambda *a, **k: printed.append(a)}
    exec(compile(pipeline_block(), "README.md", "exec"), env)  # noqa: S102  (our own README's example)
    dec, requests = env["dec"], env["requests"]
    assert len(printed) == len(requests) == 2
    for req, (text, by_source) in zip(requests, printed):
        ar = dec.generate(req["question"], method="ar", max_new_tokens=64, remember=False)
        assert text == ar.text  # the pipeline changed only the time
    assert any(n for _, by_source in printed for n in by_source.values())  # something was drafted and accepted
    assert (tmp_path / "docs.index").is_dir() and dec.history.n_tokens > 0
