"""Writing shards: the cut rule, one shard's files, and a streaming writer.

- **One cut rule** (:class:`ShardWriter.add`): documents in corpus order fill a
  shard of ``capacity`` entries (tokens + one separator each); a document that
  does not fit in what is left closes the shard first; a document longer than a
  whole shard is cut into shard-sized pieces. Every engine (local, parallel,
  Ray, append) cuts with this rule, so equal inputs give equal shards.
- **Files named by number**: shard ``k`` is ``shard-{k:05d}.tokens.i32`` and
  ``.sa.i32`` (``.sa.i64`` at 2^31 entries or more); ``first_number`` lets an
  append continue after the numbers an index already uses.
- **Parallel suffix arrays**: a closed shard's suffix array is built on a
  thread (the native builder releases the GIL) while the next shard streams in;
  at most ``parallel`` are built at once, which is what bounds memory.

This module must not import torch.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lookupdec.index.manifest import SEP, ArrayFile, ShardEntry

_WRITE_CHUNK = 1 << 21  # entries buffered before a write to the shard file (8 MB)
_SEP_ARRAY = np.array([SEP], dtype=np.int32)


def shard_path(directory: Path, number: int, kind: str, dtype: str) -> Path:
    suffix = "i32" if dtype == "int32" else "i64"
    return Path(directory) / f"shard-{number:05d}.{kind}.{suffix}"


def write_suffix_array(directory: Path, number: int, tokens_entry: ArrayFile, documents: int) -> ShardEntry:
    """Build and write the suffix array of a written token file; returns the shard's entry."""
    from lookupdec import _native

    length = tokens_entry.length
    tokens = np.memmap(Path(directory) / tokens_entry.file, dtype="<i4", mode="r", shape=(length,))
    sa = _native.suffix_array(tokens)
    dtype = "int64" if sa.dtype == np.int64 else "int32"
    data = memoryview(np.ascontiguousarray(sa, dtype="<i8" if dtype == "int64" else "<i4")).cast("B")
    path = shard_path(directory, number, "sa", dtype)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    entry = ArrayFile(path.name, dtype, int(sa.size), data.nbytes, hashlib.sha256(data).hexdigest())
    del data, sa, tokens  # release the shard
    return ShardEntry(tokens_entry, entry, documents, length - documents)


def write_shard(directory: Path, number: int, stream: np.ndarray, documents: int) -> ShardEntry:
    """Write a whole token stream (docs + separators, in memory) as shard ``number``: the Ray workers' path."""
    data = np.ascontiguousarray(stream, dtype="<i4").tobytes()
    path = shard_path(directory, number, "tokens", "int32")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    entry = ArrayFile(path.name, "int32", len(data) // 4, len(data), hashlib.sha256(data).hexdigest())
    return write_suffix_array(directory, number, entry, documents)


class ShardWriter:
    """Streams documents into shard files; a full shard's suffix array is built on a worker thread.

    Args:
        directory: where the files go.
        capacity: entries (tokens + separators) per shard.
        parallel: suffix arrays built at the same time (memory: ~13 bytes per entry each).
        first_number: the number of the first shard written.
    Example:
        >>> w = ShardWriter(tmp, 1000); w.add(np.array([5, 6], np.int32)); w.finish(); w.shards   # doctest: +SKIP
    """

    def __init__(self, directory: Path, capacity: int, parallel: int = 1, first_number: int = 0):
        self.dir = Path(directory)
        self.capacity = capacity
        self.parallel = max(1, int(parallel))
        self.first_number = first_number
        self.shards: list[ShardEntry] = []
        self.documents = 0  # whole documents (a document cut into pieces counts once)
        self.total_tokens = 0
        self.index_seconds = 0.0
        self._closed = 0  # shards closed so far
        self._file = None
        self._pending: list[np.ndarray] = []
        self._pending_len = 0
        self._len = 0
        self._docs = 0
        self._hash = None
        self._pool = ThreadPoolExecutor(self.parallel) if self.parallel > 1 else None
        self._inflight: deque = deque()

    def add(self, doc: np.ndarray) -> None:
        self.documents += 1
        self.total_tokens += int(doc.size)
        # A document that fits in a shard is never cut: close the current shard first.
        if self._len and self._len + doc.size + 1 > self.capacity:
            self._close_shard()
        start = 0
        while start < doc.size:
            room = self.capacity - self._len - 1  # keep one entry for the separator
            if room <= 0:
                self._close_shard()
                continue
            piece = doc[start : start + room]
            self._append(piece)
            self._append(_SEP_ARRAY)
            self._docs += 1
            start += piece.size

    def finish(self) -> None:
        if self._len:
            self._close_shard()
        while self._inflight:
            self._collect()
        if self._pool is not None:
            self._pool.shutdown()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)  # threads must stop before the files go

    def _append(self, arr: np.ndarray) -> None:
        if self._file is None:
            self._file = open(shard_path(self.dir, self.first_number + self._closed, "tokens", "int32"), "wb")
            self._hash = hashlib.sha256()
        self._pending.append(arr)
        self._pending_len += arr.size
        self._len += arr.size
        if self._pending_len >= _WRITE_CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            data = np.concatenate(self._pending).astype("<i4", copy=False).tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._pending, self._pending_len = [], 0

    def _close_shard(self) -> None:
        self._flush()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        number = self.first_number + self._closed
        name = shard_path(self.dir, number, "tokens", "int32").name
        entry = ArrayFile(name, "int32", self._len, self._len * 4, self._hash.hexdigest())
        args = (self.dir, number, entry, self._docs)
        self._closed += 1
        self._len = self._docs = 0
        if self._pool is None:
            t0 = time.perf_counter()
            self.shards.append(write_suffix_array(*args))
            self.index_seconds += time.perf_counter() - t0
            return
        while len(self._inflight) >= self.parallel:  # the memory bound: wait for the oldest
            self._collect()
        self._inflight.append(self._pool.submit(_timed, *args))

    def _collect(self) -> None:
        shard, seconds = self._inflight.popleft().result()
        self.shards.append(shard)  # in order: futures are collected oldest first
        self.index_seconds += seconds


def _timed(*args) -> tuple[ShardEntry, float]:
    t0 = time.perf_counter()
    shard = write_suffix_array(*args)
    return shard, time.perf_counter() - t0
