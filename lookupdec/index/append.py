"""Add shards to an existing index, and merge small shards: new manifest versions, installed atomically.

The rule that keeps open readers working: **a file named by a manifest is never
modified, and never deleted while it is named by the current manifest or the
one before it.**

- An append writes new shard files (numbers no file in the directory uses),
  then the new manifest to ``manifest-next.tmp``, and renames it over
  ``manifest.json``: a reader opens either the old version or the new one,
  never a mix. A crash before the rename leaves files no manifest names; the
  next append or compaction removes them.
- A compaction writes each merged shard as new files, never touching the
  shards it replaces, then installs the new manifest the same way.
- Each new version keeps a copy of the one it replaces (``manifest-NNNNNN.json``)
  and then deletes every shard file that neither names, and older copies. So a
  reader that read the previous manifest but has not mapped its files yet still
  finds them; a reader with older files mapped keeps its maps (on Linux, and
  any POSIX system, unlinking a mapped file leaves the mapping valid).
- One writer at a time: appends and compactions take an exclusive ``flock`` on
  the index directory.

This module must not import torch.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import os
import re
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from lookupdec.errors import CorpusError, IndexFormatError, TokenizerMismatchError
from lookupdec.index.build import DEFAULT_SHARD_TOKENS, IndexSummary, _progress_bar, _resolve_tokenizer
from lookupdec.index.manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest, write_manifest
from lookupdec.index.outdir import fsync_dir, memory_failure, os_failure
from lookupdec.index.shards import ShardWriter, write_shard

_NEXT = "manifest-next.tmp"
_SHARD_FILE = re.compile(r"^shard-(\d+)\.")
_COPY = re.compile(r"^manifest-(\d{6})\.json$")


def append_to_index(
    sources: Iterable[str | os.PathLike] | str | os.PathLike,
    index_dir: str | os.PathLike,
    *,
    tokenizer: Any = None,
    text_field: str = "text",
    shard_tokens: int | None = None,
    skip_invalid: bool = False,
    progress: bool = True,
    jobs: int | None = None,
) -> IndexSummary:
    """Tokenize corpus files and add them to an existing index as new shards (a new manifest version).

    Args:
        sources: corpus files or directories, as for :func:`build_index`.
        index_dir: an index built by :func:`build_index`.
        tokenizer: as for :func:`build_index`; it must be the index's tokenizer.
        text_field / skip_invalid / progress / jobs: as for :func:`build_index`.
        shard_tokens: entries per new shard (default: the index's own shard size).
    Returns:
        An :class:`IndexSummary` of the appended part (its ``path`` is the index).
    Raises:
        IndexFormatError: ``index_dir`` is not an index.
        TokenizerMismatchError: the tokenizer is not the index's.
        CorpusError: a bad or empty corpus (the index is left as it was).

    Example:
        >>> append_to_index(["more.jsonl"], "chats.index").documents     # doctest: +SKIP
        120
    """
    from lookupdec.index.corpus import CorpusReader, batched_texts, prepare_tokenizer
    from lookupdec.index.parallel import ParallelEncoder, peak_rss

    path = Path(index_dir).expanduser().absolute()
    old = read_manifest(path)
    shard_tokens = shard_tokens or int(old.build.get("shard_tokens") or DEFAULT_SHARD_TOKENS)
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 2:
        raise ValueError(f"shard_tokens must be an integer >= 2, got {shard_tokens!r}")
    loaded = _resolve_tokenizer(tokenizer)
    if old.tokenizer is None or old.tokenizer.fingerprint != loaded.fingerprint:
        had = f"{old.tokenizer.name!r} (fingerprint {old.tokenizer.fingerprint[:12]})" if old.tokenizer else "no tokenizer"
        raise TokenizerMismatchError(
            f"cannot append to {path}: it was built with {had} but the corpus would be tokenized with "
            f"{loaded.name!r} (fingerprint {loaded.fingerprint[:12]}); pass the index's tokenizer (--tokenizer) "
            "or build a new index")
    reader = CorpusReader(sources, text_field=text_field, skip_invalid=skip_invalid)
    tok = prepare_tokenizer(loaded.tokenizer)
    t_start = time.perf_counter()
    with _writer_lock(path), ParallelEncoder(tok, 1 if jobs is None else jobs) as encoder:
        old = read_manifest(path)  # re-read under the lock: another writer may have gone first
        writer = ShardWriter(path, shard_tokens, first_number=_next_number(path))
        bar = _progress_bar(progress)
        try:
            for arrays in encoder.map(batched_texts(reader)):
                for arr in arrays:
                    if arr.size:
                        writer.add(arr)
                bar.update(0, writer.total_tokens)
            writer.finish()
            if writer.documents == 0:
                raise CorpusError("the appended corpus holds no text: nothing to add; check the files and the text field")
            rss = peak_rss(encoder.worker_pids())
            appends = list(old.build.get("appends", [])) + [{"sources": [str(p) for p in reader.files[:100]],
                                                              "n_sources": len(reader.files),
                                                              "documents": writer.documents}]
            new = replace(old, documents=old.documents + writer.documents, tokens=old.tokens + writer.total_tokens,
                          skipped=old.skipped + reader.skipped, shards=old.shards + tuple(writer.shards),
                          build={**old.build, "appends": appends}, created=_now(), version=old.version + 1)
            install_manifest(path, old, new)
        except BaseException as exc:
            writer.abort()
            _remove_unnamed(path, old)  # the new shard files: no manifest names them
            if isinstance(exc, MemoryError):
                raise memory_failure(shard_tokens) from None
            if isinstance(exc, OSError) and not isinstance(exc, (IndexFormatError, CorpusError)):
                raise os_failure(exc, path) from None
            raise
        finally:
            bar.close()
    return IndexSummary(path=path, documents=writer.documents, tokens=writer.total_tokens, shards=len(writer.shards),
                        bytes_on_disk=sum(s.tokens.bytes + s.sa.bytes for s in writer.shards),
                        seconds=time.perf_counter() - t_start, tokenize_seconds=0.0,
                        index_seconds=writer.index_seconds, skipped=reader.skipped, peak_rss_bytes=rss,
                        jobs=encoder.jobs)


def compact_index(index_dir: str | os.PathLike, *, shard_tokens: int | None = None) -> Manifest:
    """Merge runs of consecutive small shards into shards of at most ``shard_tokens`` entries.

    Consecutive shards are grouped greedily in order while their entries add up
    to at most the target; each group of two or more becomes one shard whose
    token stream is the group's streams concatenated (documents stay whole and
    in order) with its suffix array rebuilt. Other shards keep their files.

    Args:
        index_dir: an index.
        shard_tokens: largest merged shard (default: the index's shard size; the name
            ``build_index`` gives the same limit).
    Returns:
        The new :class:`Manifest` (the old one, unchanged, when nothing merges).
    Raises:
        IndexFormatError: not an index. ValueError: an invalid target.

    Example:
        >>> len(compact_index("chats.index").shards)      # doctest: +SKIP
        1
    """
    path = Path(index_dir).expanduser().absolute()
    old = read_manifest(path)
    target = shard_tokens or int(old.build.get("shard_tokens") or DEFAULT_SHARD_TOKENS)
    if isinstance(target, bool) or not isinstance(target, int) or target < 2:
        raise ValueError(f"shard_tokens must be an integer >= 2, got {target!r}")
    with _writer_lock(path):
        old = read_manifest(path)
        groups = plan_compaction([s.tokens.length for s in old.shards], target)
        if all(len(g) == 1 for g in groups):
            return old
        number = _next_number(path)
        shards: list[ShardEntry] = []
        try:
            for group in groups:
                if len(group) == 1:
                    shards.append(old.shards[group[0]])
                    continue
                members = [old.shards[i] for i in group]
                stream = np.concatenate([np.fromfile(path / s.tokens.file, dtype="<i4") for s in members])
                shards.append(write_shard(path, number, stream, sum(s.documents for s in members)))
                number += 1
                del stream
            new = replace(old, shards=tuple(shards), created=_now(), version=old.version + 1,
                          build={**old.build, "compacted_to": target})
            install_manifest(path, old, new)
        except BaseException as exc:
            _remove_unnamed(path, old)
            if isinstance(exc, MemoryError):
                raise memory_failure(target) from None
            if isinstance(exc, OSError) and not isinstance(exc, IndexFormatError):
                raise os_failure(exc, path) from None
            raise
    return new


def plan_compaction(lengths: list[int], target: int) -> list[list[int]]:
    """Groups of consecutive shard numbers whose lengths add up to at most ``target`` (greedy, in order).

    Example:
        >>> plan_compaction([3, 3, 5, 9, 1], 8)
        [[0, 1], [2], [3], [4]]
    """
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(lengths):
        if groups and size + n <= target:
            groups[-1].append(i)
            size += n
        else:
            groups.append([i])
            size = n
    return groups


def install_manifest(path: Path, old: Manifest, new: Manifest) -> None:
    """Install ``new`` over ``old`` atomically, keep ``old`` as a copy, delete what neither names."""
    write_manifest(path, old, f"manifest-{old.version:06d}.json")
    write_manifest(path, new, _NEXT)
    os.replace(path / _NEXT, path / MANIFEST_NAME)  # the atomic switch
    fsync_dir(path)
    keep = _named(old) | _named(new) | {MANIFEST_NAME, f"manifest-{old.version:06d}.json"}
    for entry in path.iterdir():
        if entry.name not in keep and (_SHARD_FILE.match(entry.name) or _COPY.match(entry.name)
                                       or entry.name == _NEXT):
            entry.unlink(missing_ok=True)


def _named(m: Manifest) -> set[str]:
    return {f for s in m.shards for f in (s.tokens.file, s.sa.file)}


def _remove_unnamed(path: Path, current: Manifest) -> None:
    """After a failed append or compaction: remove shard files the current manifest and its copies do not name."""
    keep = _named(current)
    for copy in path.glob("manifest-*.json"):
        try:
            keep |= _named(read_manifest_file(copy))
        except IndexFormatError:
            pass
    for entry in path.iterdir():
        if _SHARD_FILE.match(entry.name) and entry.name not in keep:
            entry.unlink(missing_ok=True)
    (path / _NEXT).unlink(missing_ok=True)


def read_manifest_file(file: Path) -> Manifest:
    import json

    try:
        return Manifest.from_dict(json.loads(file.read_text(encoding="utf-8")), str(file))
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"cannot read {file}: {exc}") from exc


def _next_number(path: Path) -> int:
    numbers = [int(m.group(1)) for p in path.iterdir() if (m := _SHARD_FILE.match(p.name))]
    return max(numbers, default=-1) + 1


@contextmanager
def _writer_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexFormatError(f"another append or compaction of {path} is running; wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
