"""A benchmark's JSON report: printed, and written to ``--out`` when given (its folder made)."""
from __future__ import annotations

import json
from pathlib import Path


def print_and_write(report: dict, out: Path | None) -> None:
    """Print ``report`` as indented JSON; also write it, with a final newline, to ``out`` if set."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
