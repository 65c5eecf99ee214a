"""Remembered outputs: a persistent store of finished generations that later requests draft from.

What SuffixDecoding keeps in a global suffix tree, made durable and shared
between processes, from the index's own parts:

- ``log-<gen>.bin``: an append-only log of the generations not yet compacted,
  one framed record each: a 16-byte header (magic ``LKH1``, token count,
  CRC-32 of the payload, reserved) and the token ids as little-endian int32.
  An append is one ``write`` under an exclusive ``flock`` on ``lock``, then an
  fsync, so two processes appending at once lose nothing, and a process killed
  mid-append leaves at most a torn last record, which readers skip and the next
  appender cuts off.
- ``seg-<gen>/``: compacted segments, ordinary suffix-array index directories
  (``build_index_from_tokens``, the tokenizer recorded). When the log holds more
  than ``compact_tokens`` tokens, the appender that crosses the line folds it
  into a new segment and starts a new log.
- ``store.json``: the segments in age order, the current log, the budget and
  the tokenizer; replaced atomically (write, fsync, rename) and only under the
  lock, so it is never torn: after a kill at any moment the store opens, and
  the only loss is the generation being appended. Files a crashed compaction
  left behind (a segment or log no manifest names) are removed by the next one.

Bounded by a token budget with oldest-first eviction: after a compaction,
whole segments are dropped, oldest first, while the store holds more than
``budget_tokens``; so the store never holds more than the budget plus one
segment (``compact_tokens``) plus the uncompacted log (under ``compact_tokens``).
Readers that had a dropped segment open keep their mapping.

Readers (``HistoryStore.indexes``) see the segments through ``open_index`` and the
log through an in-memory index of its records (``lookupdec.index.memory``);
``refresh`` picks up what other processes appended or compacted since.

This module must not import torch.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from lookupdec.errors import IndexFormatError, LookupdecError, TokenizerMismatchError
from lookupdec.index.manifest import MAX_TOKEN

FORMAT = "lookupdec-history"
VERSION = 1
MANIFEST = "store.json"
LOCK = "lock"
MAGIC = b"LKH1"
_HEADER = struct.Struct("<4sIII")  # magic, tokens, crc32 of the payload, reserved
DEFAULT_BUDGET_TOKENS = 50_000_000
DEFAULT_COMPACT_TOKENS = 1_000_000


class HistoryError(LookupdecError, ValueError):
    """A history store cannot be created, opened or written."""


@dataclass
class _Manifest:
    tokenizer: dict | None
    budget_tokens: int
    compact_tokens: int
    log: str
    generation: int = 0
    segments: list[dict] = field(default_factory=list)  # {"dir", "tokens", "records"}, oldest first

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "tokenizer": self.tokenizer,
                           "budget_tokens": self.budget_tokens, "compact_tokens": self.compact_tokens,
                           "log": self.log, "generation": self.generation, "segments": self.segments}, indent=1)

    @classmethod
    def parse(cls, text: str, where: Path) -> "_Manifest":
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT or d.get("version") != VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            return cls(d["tokenizer"], int(d["budget_tokens"]), int(d["compact_tokens"]), str(d["log"]),
                       int(d["generation"]), [dict(s) for s in d["segments"]])
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise HistoryError(f"{where} is not a readable history manifest ({exc}); it was changed by something "
                               "other than lookupdec: remove the directory to start a new history") from None


def check_history_path(path: str | os.PathLike) -> Path:
    """Check that ``path`` can hold a history store (creating the directory), without opening one.

    Raises:
        HistoryError: a file, a directory that cannot be created or written, or
            one holding something other than a history store.
    """
    root = Path(path).expanduser()
    if root.exists() and not root.is_dir():
        raise HistoryError(f"history path {root} is a file; pass a directory (new or empty) for the history store")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / LOCK, "a"):
            pass
    except OSError as exc:
        raise HistoryError(f"cannot write the history store at {root}: {exc.strerror or exc}; "
                           "pass a writable directory (--history DIR)") from None
    if not (root / MANIFEST).exists():
        strangers = [p.name for p in root.iterdir() if p.name != LOCK]
        if strangers:
            raise HistoryError(f"{root} is not a history store: it holds {strangers[:3]}; pass a new or empty "
                               "directory")
    return root


def open_history(path: str | os.PathLike, *, tokenizer: Any = None, budget_tokens: int = DEFAULT_BUDGET_TOKENS,
                 compact_tokens: int = DEFAULT_COMPACT_TOKENS) -> "HistoryStore":
    """Open the history store at ``path``, creating it (and the directory) if needed.

    Args:
        path: the store's directory (new, empty, or an existing store).
        tokenizer: the tokenizer of the model whose outputs are stored (recorded
            at creation; an existing store refuses another one). None records none.
        budget_tokens: most tokens kept (oldest segments dropped first); an
            existing store takes the new value.
        compact_tokens: log size (tokens) at which the log becomes a segment.
    Returns:
        The HistoryStore.
    Raises:
        HistoryError: the path cannot be created or written, is a file, or holds
            something other than a history store.
        TokenizerMismatchError: the store was made with another tokenizer.

    Example:
        >>> store = open_history("/tmp/doc-history", budget_tokens=10_000)      # doctest: +SKIP
        >>> store.append([5, 6, 7, 8]); store.n_tokens                          # doctest: +SKIP
        4
    """
    if budget_tokens < 1 or compact_tokens < 1:
        raise ValueError(f"budget_tokens and compact_tokens must be >= 1, got {budget_tokens}, {compact_tokens}")
    root = check_history_path(path)
    record = None
    if tokenizer is not None:
        from lookupdec.tokenizer import _vocab_of, describe_tokenizer, tokenizer_fingerprint

        record = {"name": describe_tokenizer(tokenizer), "fingerprint": tokenizer_fingerprint(tokenizer),
                  "vocab_size": len(_vocab_of(tokenizer))}
    store = HistoryStore(root, tokenizer)
    with store._locked():
        if not (root / MANIFEST).exists():
            check_history_path(root)  # still empty now that the lock is held
            store._write_manifest(_Manifest(record, budget_tokens, compact_tokens, "log-000000.bin"))
        man = store._read_manifest()
        if record is not None and man.tokenizer is not None and man.tokenizer["fingerprint"] != record["fingerprint"]:
            raise TokenizerMismatchError(
                f"history store {root} holds outputs of tokenizer {man.tokenizer['name']!r} (vocab "
                f"{man.tokenizer['vocab_size']}), not {record['name']!r} (vocab {record['vocab_size']}); "
                "use another --history directory for this model")
        if man.budget_tokens != budget_tokens or man.compact_tokens != compact_tokens:
            man.budget_tokens, man.compact_tokens = budget_tokens, compact_tokens
            store._write_manifest(man)
    store.refresh()
    return store


class HistoryStore:
    """An open history store (use :func:`open_history`). See the module docstring."""

    def __init__(self, root: Path, tokenizer: Any = None) -> None:
        self.root = root
        self._tokenizer = tokenizer
        self._man: _Manifest | None = None
        self._segments: dict[str, Any] = {}   # dir -> opened SuffixIndex
        self._records: list[np.ndarray] = []  # the log's records read so far
        self._log_read = 0                     # bytes of the current log read so far
        self._log_index = None                 # memory index over _records (None: stale)

    # ------------------------------------------------------------- reading
    @property
    def n_tokens(self) -> int:
        """Tokens in the store as last refreshed (segments and log)."""
        seg = sum(int(s["tokens"]) for s in self._man.segments) if self._man else 0
        return seg + sum(int(r.size) for r in self._records)

    @property
    def n_segments(self) -> int:
        return len(self._man.segments) if self._man else 0

    def refresh(self) -> None:
        """Pick up what was appended or compacted (by any process) since the last refresh."""
        for _ in range(5):  # a compaction may swap the log between reading the manifest and the log
            man = self._read_manifest()
            if self._man is None or man.generation != self._man.generation or man.log != self._man.log:
                self._records, self._log_read, self._log_index = [], 0, None
            self._man = man
            try:
                self._read_log()
                break
            except FileNotFoundError:
                continue
        from lookupdec.index import open_index

        live = {s["dir"] for s in self._man.segments}
        for d in list(self._segments):
            if d not in live:
                del self._segments[d]
        for s in self._man.segments:
            if s["dir"] not in self._segments:
                try:
                    self._segments[s["dir"]] = open_index(self.root / s["dir"])
                except IndexFormatError:
                    continue  # evicted by another process between the manifest read and now

    def indexes(self) -> list:
        """What a drafter looks up: the segments (oldest first), then the log's records."""
        out = [self._segments[s["dir"]] for s in self._man.segments if s["dir"] in self._segments]
        if self._records:
            if self._log_index is None:
                from lookupdec.index.memory import memory_index

                self._log_index = memory_index(self._records)
            out.append(self._log_index)
        return out

    def _read_log(self) -> None:
        path = self.root / self._man.log
        with open(path, "rb") as f:
            f.seek(self._log_read)
            data = f.read()
        added = False
        for _, payload in _records(data):
            if payload is not None:
                self._records.append(payload)
                added = True
        self._log_read += _complete_prefix(data)
        if added:
            self._log_index = None

    # ------------------------------------------------------------- writing
    def append(self, token_ids: Sequence[int]) -> None:
        """Add one finished generation (its token ids); compacts and evicts when due.

        Raises:
            ValueError: a token id outside ``[0, 2^31 - 1]``.
            HistoryError: the store cannot be written (the message says why and what to do).
        """
        arr = np.asarray(list(token_ids), dtype=np.int64)
        if arr.size == 0:
            return
        if int(arr.min()) < 0 or int(arr.max()) > MAX_TOKEN:
            raise ValueError(f"token ids must lie in [0, {MAX_TOKEN}]")
        payload = arr.astype("<i4").tobytes()
        record = _HEADER.pack(MAGIC, int(arr.size), zlib.crc32(payload), 0) + payload
        try:
            with self._locked():
                man = self._read_manifest()
                log = self.root / man.log
                _cut_torn_tail(log)
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, record)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if _log_tokens(log) >= man.compact_tokens:
                    self._compact(man)
        except OSError as exc:
            raise HistoryError(f"cannot append to the history store {self.root}: {exc.strerror or exc}; "
                               "check that the directory is writable and the disk has space") from None
        self.refresh()

    def _compact(self, man: _Manifest) -> None:
        """Fold the log into a new segment, start a new log, evict over budget (lock held)."""
        from lookupdec.index import build_index_from_tokens

        log = self.root / man.log
        records = [p for _, p in _records(log.read_bytes()) if p is not None]
        gen = man.generation + 1
        seg = f"seg-{gen:06d}"
        self._remove_orphans(man)
        if records:
            build_index_from_tokens(records, self.root / seg, tokenizer=self._tokenizer, overwrite=True)
            man.segments.append({"dir": seg, "tokens": int(sum(r.size for r in records)), "records": len(records)})
        man.generation, man.log = gen, f"log-{gen:06d}.bin"
        dropped = []
        while len(man.segments) > 1 and sum(int(s["tokens"]) for s in man.segments) > man.budget_tokens:
            dropped.append(man.segments.pop(0)["dir"])
        self._write_manifest(man)
        # Only what the new manifest no longer names is deleted, after it is in place.
        log.unlink(missing_ok=True)
        for d in dropped:
            shutil.rmtree(self.root / d, ignore_errors=True)

    def _remove_orphans(self, man: _Manifest) -> None:
        named = {s["dir"] for s in man.segments} | {man.log, MANIFEST, LOCK}
        for p in self.root.iterdir():
            if p.name in named:
                continue
            if p.name.startswith(("seg-", ".seg-")) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.startswith(("log-", MANIFEST + ".tmp")):
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------- manifest and lock
    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / LOCK, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _read_manifest(self) -> _Manifest:
        path = self.root / MANIFEST
        try:
            return _Manifest.parse(path.read_text(encoding="utf-8"), path)
        except FileNotFoundError:
            raise HistoryError(f"{self.root} has no {MANIFEST}: it is not a history store (or it was removed); "
                               "open it with open_history to create one") from None

    def _write_manifest(self, man: _Manifest) -> None:
        tmp = self.root / f"{MANIFEST}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(man.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / MANIFEST)
        dfd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def __repr__(self) -> str:
        return f"HistoryStore({str(self.root)!r}, tokens={self.n_tokens}, segments={self.n_segments})"


# ------------------------------------------------------------------ log records
def _records(data: bytes):
    """(offset, payload) of each complete record in ``data``; payload None for a damaged one."""
    pos, n = 0, len(data)
    while pos + _HEADER.size <= n:
        magic, count, crc, _ = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + 4 * count
        if magic != MAGIC or end > n:
            return  # a torn or foreign tail: nothing after it is trusted
        payload = data[pos + _HEADER.size:end]
        yield pos, (np.frombuffer(payload, "<i4").astype(np.int64) if zlib.crc32(payload) == crc else None)
        pos = end


def _complete_prefix(data: bytes) -> int:
    """Bytes of ``data`` made of complete records."""
    end = 0
    for start, _ in _records(data):
        count = _HEADER.unpack_from(data, start)[1]
        end = start + _HEADER.size + 4 * count
    return end


def _cut_torn_tail(log: Path) -> None:
    """Truncate a log to its complete records (a killed appender's torn record goes; lock held)."""
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return
    good = _complete_prefix(data)
    if good < len(data):
        with open(log, "r+b") as f:
            f.truncate(good)


def _log_tokens(log: Path) -> int:
    return sum(int(p.size) for _, p in _records(log.read_bytes()) if p is not None)
