"""The project's Markdown links lead somewhere: every relative link names a file in the
checkout, and every #anchor names a heading of the file it points into (GitHub's slugs)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "benchmarks/RESULTS.md", "datastore/README.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_slug_follows_githubs_rule():
    assert slug("Spec-Bench in float32, with the peers: `auto` (issue 17, 2026-11-27)") == \
        "spec-bench-in-float32-with-the-peers-auto-issue-17-2026-11-27"


def test_a_broken_anchor_is_detected():
    text = "# Results\n\n## A run\n\nsee [it](#a-run) and [that](#another-run)\n"
    assert [link for link in relative_links(text) if link[1:] not in anchors(text)] == ["#another-run"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_leads_to_a_file_and_heading(doc):
    source = ROOT / doc
    broken = []
    for link in relative_links(source.read_text(encoding="utf-8")):
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{link}: no such heading in {target.relative_to(ROOT)}")
    assert not broken, f"{doc}: " + "; ".join(broken)
