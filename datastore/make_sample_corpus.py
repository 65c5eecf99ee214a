"""Write a real code corpus as JSONL: the Python standard library's own sources.

Every machine with Python has it, so the datastore demo and tests need no
download. One record per ``.py`` file, ``{"text": <source>, "path": <path
relative to the stdlib>}``, in sorted path order (the same bytes for the same
Python version). ``site-packages`` and files that are not UTF-8 are left out,
and so are the test suites unless ``--include-tests`` is given (they are code
too: about 1.6 times as much again, unittest-style).

Usage:
    python datastore/make_sample_corpus.py -o datastore/sample/stdlib.jsonl [--max-files N] [--include-tests]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path

# Sub-trees that are not the stdlib at all, or generated.
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__", "lib2to3"}
# The stdlib's own test suites.
TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_files(root: Path, include_tests: bool = False) -> list[Path]:
    """The stdlib's ``.py`` files below ``root``, sorted by relative path."""
    skip = EXCLUDED_DIRS if include_tests else EXCLUDED_DIRS | TEST_DIRS
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith(".")]
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def write_corpus(out: Path, max_files: int | None = None, include_tests: bool = False) -> tuple[int, int]:
    """Write the corpus; returns (files written, characters written)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    files = chars = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for path in stdlib_files(root, include_tests):
            if max_files is not None and files >= max_files:
                break
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not text.strip():
                continue
            f.write(json.dumps({"text": text, "path": path.relative_to(root).as_posix()}, ensure_ascii=False) + "\n")
            files += 1
            chars += len(text)
    os.replace(tmp, out)  # a reader never sees a half-written corpus
    return files, chars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the Python standard library's sources as a JSONL corpus.")
    parser.add_argument("-o", "--output", required=True, type=Path, help="the .jsonl file to write")
    parser.add_argument("--max-files", type=int, default=None, help="stop after this many files (default: all)")
    parser.add_argument("--include-tests", action="store_true", help="add the stdlib's test suites")
    args = parser.parse_args(argv)
    if args.max_files is not None and args.max_files < 1:
        parser.error("--max-files must be >= 1")
    files, chars = write_corpus(args.output, args.max_files, args.include_tests)
    print(f"wrote {files} files ({chars / 1e6:.1f} M characters) from {sysconfig.get_paths()['stdlib']} to {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
