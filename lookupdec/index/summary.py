"""What an index build returns (its own module, so the local and Ray builds share it without importing each other)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class IndexSummary:
    """What a build produced and how long it took.

    Attributes:
        path: the index directory.
        documents: documents indexed (empty ones are not counted).
        tokens: corpus tokens (separators excluded).
        shards: number of shards.
        bytes_on_disk: bytes of all files in the index directory.
        seconds: wall time of the whole build.
        tokenize_seconds: time spent in the tokenizer (0 for token input).
        index_seconds: time spent building, writing and hashing suffix arrays.
        skipped: invalid corpus records skipped (``skip_invalid=True``).
        peak_rss_bytes: peak resident memory of the build: this process plus each
            tokenizer worker's own peak (a sum of peaks, so an upper bound); 0 if unknown.
        jobs: tokenizer processes used.
    """

    path: Path
    documents: int
    tokens: int
    shards: int
    bytes_on_disk: int
    seconds: float
    tokenize_seconds: float
    index_seconds: float
    skipped: int = 0
    peak_rss_bytes: int = 0
    jobs: int = 1

    @property
    def tokenize_tokens_per_s(self) -> float:
        return self.tokens / self.tokenize_seconds if self.tokenize_seconds > 0 else float("nan")

    @property
    def index_tokens_per_s(self) -> float:
        return self.tokens / self.index_seconds if self.index_seconds > 0 else float("nan")
