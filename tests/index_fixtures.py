"""Shared helpers for the datastore tests: a tiny word-level tokenizer and corpus writers.

The tokenizer is built in-process with the ``tokenizers`` library (no model,
no download): one id per word of ``WORDS``, ``[UNK]`` = 0 for anything else.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

WORDS = "the cat sat on mat dog ran to a park and then home def return x y if else".split()


def tiny_tokenizer(words=WORDS) -> Tokenizer:
    """Word-level tokenizer: '[UNK]' -> 0, words[i] -> i + 1, split on whitespace."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    return tok


def ids(text: str, tok: Tokenizer | None = None) -> list[int]:
    return (tok or tiny_tokenizer()).encode(text, add_special_tokens=False).ids


def write_jsonl(path: Path, records, raw_lines=()) -> Path:
    """Write records (dicts) as JSONL, then any raw lines (for malformed input) verbatim."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")
    return path


def leftovers(parent: Path, name: str) -> list[str]:
    """Entries in ``parent`` that an index build of ``parent/name`` may have created (temp dirs included)."""
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))
