"""Build a suffix-array index directory from corpus files or token arrays.

Layout and manifest: see :mod:`lookupdec.index.manifest`. How a build stays
safe and bounded:

- **Nothing half-written.** Everything is written into a hidden temporary
  sibling directory (:mod:`lookupdec.index.outdir`); the manifest goes in last
  and the directory is renamed to its final name only when complete. Any
  failure (including Ctrl-C) removes the temporary directory; one left by a
  killed build is removed by the next build into the same place.
  ``overwrite=True`` moves the old index aside, renames the new one in, then
  deletes the old one.
- **Bounded memory.** Documents stream into the current shard's token file on
  disk; when the next document would not fit in ``shard_tokens`` entries, the
  shard is closed, memory-mapped, its suffix array built and written, and both
  are released before the next shard starts. Peak memory is about one shard's
  suffix array plus the native builder's working space, whatever the corpus size.
- **No match spans two documents.** Each document is followed by the
  separator SEP (-1), which no query contains. A document longer than a whole
  shard is cut into shard-sized pieces (matches across a cut are lost).
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from lookupdec.errors import CorpusError, LookupdecError
from lookupdec.index.manifest import MAX_TOKEN, Manifest, TokenizerRecord, write_manifest
from lookupdec.index.outdir import install, make_temp, memory_failure, os_failure, prepare_out
from lookupdec.index.shards import ShardWriter
from lookupdec.index.summary import IndexSummary  # noqa: F401  (re-exported: build's result)

#: Default shard size in token-array entries (tokens + one separator per document):
#: 100M entries = 400 MB of tokens + 400 MB of int32 suffix array per shard, so a
#: build needs roughly 1 GB of RAM at a time, and a lookup touches a few shards.
DEFAULT_SHARD_TOKENS = 100_000_000


def build_index(
    sources: Iterable[str | os.PathLike] | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tokenizer: Any = None,
    text_field: str = "text",
    shard_tokens: int | None = None,
    overwrite: bool = False,
    skip_invalid: bool = False,
    progress: bool = True,
    jobs: int | None = None,
    max_memory: int | str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> IndexSummary:
    """Tokenize corpus files and build a sharded suffix-array index in ``out_dir``.

    Args:
        sources: JSONL / Parquet / Arrow / text files or directories (see
            :mod:`lookupdec.index.corpus` for the formats).
        out_dir: the index directory to create.
        tokenizer: ``None`` (the embedded default model's tokenizer), a name or
            path for :func:`lookupdec.tokenizer.load_tokenizer`, a
            ``tokenizers.Tokenizer``, or a ``LoadedTokenizer``.
        text_field: JSON field / table column with the text or chat turns.
        shard_tokens: maximum entries (tokens + separators) per shard; ``None``
            derives it from ``max_memory`` (or uses the default).
        overwrite: replace an existing index at ``out_dir``.
        skip_invalid: skip and count bad records instead of failing.
        progress: show a progress bar on stderr.
        jobs: tokenizer processes. ``None`` or 1: this process, whose fast-tokenizer
            batch encoding already uses every core (measured faster than worker
            processes on a 2-core machine); N > 1: N spawned worker processes. The
            output is byte-identical whatever ``jobs`` is.
        max_memory: a memory limit (bytes or a size like ``"2G"``) that sets the
            shard size (when ``shard_tokens`` is not given) and how many shards
            build their suffix arrays at once.
        engine: ``"local"``, or ``"ray"``: read and tokenize with Ray Data and build
            the shards in Ray tasks (``pip install 'lookupdec[ray]'``; the output
            path must be shared with the workers). Same files as a local build.
        ray_address: the Ray cluster to join (``None``: ``ray.init``'s default).
    Returns:
        An :class:`IndexSummary`.
    Raises:
        CorpusError: a missing, unreadable, malformed or empty corpus.
        IndexFormatError: ``out_dir`` exists (without ``overwrite``) or is not an index.
        BuildError: the output cannot be written (permissions, a full disk) or the
            shard does not fit in memory; the message names the fix.
        ModelLoadError: the tokenizer cannot be found.
        ValueError: an empty ``text_field``, an invalid ``shard_tokens``, ``jobs``,
            or ``max_memory``.

    Example:
        >>> s = build_index(["chats.jsonl"], "chats.index")      # doctest: +SKIP
        >>> s.documents, s.tokens, s.shards                        # doctest: +SKIP
        (1000, 412345, 1)
    """
    from lookupdec.index.corpus import CorpusReader, batched_texts, prepare_tokenizer
    from lookupdec.index.parallel import ParallelEncoder, parse_size, plan_memory

    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    # Default: one process; the fast tokenizer's batch encoding already runs on every core and measured
    # faster here than worker processes (benchmarks/build_throughput.py).
    jobs = 1 if jobs is None else jobs
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}; e.g. --jobs 2")
    if shard_tokens is not None:
        _check_shard_tokens(shard_tokens)
    plan = plan_memory(None if max_memory is None else parse_size(max_memory), shard_tokens, int(jobs),
                       DEFAULT_SHARD_TOKENS)
    shard_tokens = plan.shard_tokens
    out = prepare_out(out_dir, overwrite)
    if not isinstance(text_field, str) or not text_field.strip():
        raise ValueError(f"text_field must name a JSON field or table column, got {text_field!r}; "
                         "pass e.g. --text-field text")
    reader = CorpusReader(sources, text_field=text_field, skip_invalid=skip_invalid)  # checks files exist
    loaded = _resolve_tokenizer(tokenizer)
    tok = prepare_tokenizer(loaded.tokenizer)
    timer = {"tokenize": 0.0}
    encoder = ParallelEncoder(tok, int(jobs))

    def documents() -> Iterator[np.ndarray]:
        # With workers, "tokenizing" is the time the build waits for them.
        t0 = time.perf_counter()
        for arrays in encoder.map(batched_texts(reader)):
            timer["tokenize"] += time.perf_counter() - t0
            yield from arrays
            t0 = time.perf_counter()

    params = {
        "sources": [str(p) for p in reader.files[:100]],
        "n_sources": len(reader.files),
        "text_field": text_field,
        "skip_invalid": skip_invalid,
        "shard_tokens": shard_tokens,
    }
    if engine == "ray":
        from lookupdec.index.ray_build import build_with_ray

        return build_with_ray(reader, out, loaded, tok, shard_tokens=shard_tokens, overwrite=overwrite,
                              address=ray_address, params=params)
    record = TokenizerRecord(loaded.name, loaded.fingerprint, loaded.vocab_size)
    with encoder:
        summary = _build(
            documents(), out, tokenizer=record, shard_tokens=shard_tokens, overwrite=overwrite,
            progress=progress, params=params, skipped=lambda: reader.skipped, validate=False,
            parallel=plan.parallel_shards, pids=encoder.worker_pids,
        )
    return replace(summary, tokenize_seconds=timer["tokenize"], jobs=int(jobs))


def build_index_from_tokens(
    documents: Iterable[Sequence[int] | np.ndarray],
    out_dir: str | os.PathLike,
    *,
    tokenizer: Any = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    progress: bool = False,
) -> IndexSummary:
    """Build an index from documents that are already token ids.

    Args:
        documents: each a 1-D sequence of token ids in ``[0, 2^31 - 1]``.
        out_dir: the index directory to create.
        tokenizer: the tokenizer that produced the ids, recorded so the index
            refuses other tokenizers: a ``tokenizers.Tokenizer``, a
            ``LoadedTokenizer``, a transformers tokenizer, or ``None`` (no
            tokenizer recorded; :meth:`SuffixIndex.check_tokenizer` then refuses
            every tokenizer).
        shard_tokens / overwrite / progress: as :func:`build_index`.
    Returns:
        An :class:`IndexSummary` (``tokenize_seconds`` is 0).
    Raises:
        ValueError: a document is not 1-D or holds an id outside ``[0, 2^31 - 1]``
            (or beyond the tokenizer's vocabulary).
        CorpusError: no tokens at all.
        IndexFormatError: ``out_dir`` exists (without ``overwrite``) or is not an index.

    Example:
        >>> build_index_from_tokens([[5, 6, 7], [5, 6, 9]], "tiny.index").tokens   # doctest: +SKIP
        6
    """
    out = prepare_out(out_dir, overwrite)
    _check_shard_tokens(shard_tokens)
    record = None if tokenizer is None else _tokenizer_record(tokenizer)
    params = {"shard_tokens": shard_tokens, "sources": ["<token arrays>"]}
    return _build(iter(documents), out, tokenizer=record, shard_tokens=shard_tokens, overwrite=overwrite,
                  progress=progress, params=params, skipped=lambda: 0, validate=True)


# ------------------------------------------------------------------ the build
def _build(docs: Iterator, out: Path, *, tokenizer: TokenizerRecord | None, shard_tokens: int, overwrite: bool,
           progress: bool, params: dict, skipped, validate: bool, parallel: int = 1, pids=lambda: []) -> IndexSummary:
    from lookupdec.index.parallel import peak_rss

    from lookupdec import __version__

    t_start = time.perf_counter()
    tmp = make_temp(out)  # a hidden sibling on the same filesystem, so the final rename is atomic
    bar = _progress_bar(progress)
    writer = ShardWriter(tmp, shard_tokens, parallel)
    try:
        limit = tokenizer.vocab_size if tokenizer is not None and tokenizer.vocab_size > 0 else None
        n = 0
        for i, doc in enumerate(docs):
            arr = _as_tokens(doc, i, limit) if validate else doc
            if arr.size:
                writer.add(arr)
                n += 1
                if n % 256 == 0:
                    bar.update(n - bar.n, writer.total_tokens)
        bar.update(n - bar.n, writer.total_tokens)
        writer.finish()
        rss = peak_rss(pids())  # before the workers exit
        if writer.documents == 0:
            hint = f" ({skipped()} invalid records skipped)" if skipped() else ""
            raise CorpusError(f"the corpus holds no text{hint}: nothing to index; check the files and the text field")
        manifest = Manifest(
            tokenizer=tokenizer,
            documents=writer.documents,
            tokens=writer.total_tokens,
            skipped=skipped(),
            shards=tuple(writer.shards),
            build=params,
            lookupdec_version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        manifest_bytes = write_manifest(tmp, manifest)
        install(tmp, out, overwrite)
    except BaseException as exc:  # Ctrl-C included: leave nothing behind
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, MemoryError):
            raise memory_failure(shard_tokens) from None
        if isinstance(exc, OSError) and not isinstance(exc, LookupdecError):
            raise os_failure(exc, out) from None
        raise
    finally:
        bar.close()
    return IndexSummary(
        path=out,
        documents=writer.documents,
        tokens=writer.total_tokens,
        shards=len(writer.shards),
        bytes_on_disk=manifest.bytes_on_disk + manifest_bytes,
        seconds=time.perf_counter() - t_start,
        tokenize_seconds=0.0,
        index_seconds=writer.index_seconds,
        skipped=manifest.skipped,
        peak_rss_bytes=rss,
    )


# ------------------------------------------------------------------ helpers
def _check_shard_tokens(shard_tokens: int) -> None:
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, (int, np.integer)) or shard_tokens < 2:
        raise ValueError(f"shard_tokens must be an integer >= 2 (tokens + separators per shard), got {shard_tokens!r}")


def _as_tokens(doc: Any, i: int, vocab_size: int | None) -> np.ndarray:
    arr = np.asarray(doc)
    if arr.size == 0:
        return np.zeros(0, np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"document {i} must be a 1-D sequence of integer token ids, got shape {arr.shape} dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    top = MAX_TOKEN if vocab_size is None else vocab_size - 1
    if lo < 0 or hi > top:
        bad = lo if lo < 0 else hi
        raise ValueError(f"document {i} holds token id {bad}, outside [0, {top}]"
                         + ("" if vocab_size is None else f" (the tokenizer's vocabulary has {vocab_size} ids)"))
    return arr.astype(np.int32, copy=False)


def _resolve_tokenizer(tokenizer: Any):
    from tokenizers import Tokenizer

    from lookupdec.tokenizer import LoadedTokenizer, describe_tokenizer, resolve_tokenizer, tokenizer_fingerprint

    if isinstance(tokenizer, LoadedTokenizer):
        return tokenizer
    if isinstance(tokenizer, Tokenizer):
        return LoadedTokenizer(tokenizer, describe_tokenizer(tokenizer), tokenizer_fingerprint(tokenizer),
                               tokenizer.get_vocab_size(with_added_tokens=True))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):  # a transformers fast tokenizer
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        return LoadedTokenizer(backend, name, tokenizer_fingerprint(tokenizer), len(tokenizer.get_vocab()))
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return resolve_tokenizer(tokenizer)
    raise TypeError(f"tokenizer must be None, a name or path, or a tokenizers.Tokenizer, got {type(tokenizer).__name__}")


def _tokenizer_record(tokenizer: Any) -> TokenizerRecord:
    """The identity to record for any tokenizer form (LoadedTokenizer, tokenizers, transformers, vocab mapping)."""
    from lookupdec.tokenizer import _vocab_of, describe_tokenizer, tokenizer_fingerprint

    if all(hasattr(tokenizer, a) for a in ("name", "fingerprint", "vocab_size")):  # LoadedTokenizer / TokenizerRecord
        return TokenizerRecord(tokenizer.name, tokenizer.fingerprint, int(tokenizer.vocab_size))
    if isinstance(tokenizer, (str, os.PathLike)):
        from lookupdec.tokenizer import resolve_tokenizer

        loaded = resolve_tokenizer(tokenizer)
        return TokenizerRecord(loaded.name, loaded.fingerprint, loaded.vocab_size)
    return TokenizerRecord(describe_tokenizer(tokenizer), tokenizer_fingerprint(tokenizer), len(_vocab_of(tokenizer)))


class _Bar:
    """A tqdm bar over documents with the token count and rate as postfix (or nothing)."""

    def __init__(self, enabled: bool):
        self.n = 0
        self._bar = None
        self._t0 = time.perf_counter()
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(unit=" docs", desc="indexing", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)

    def update(self, docs: int, tokens: int) -> None:
        self.n += docs
        if self._bar is not None:
            rate = tokens / max(time.perf_counter() - self._t0, 1e-9)
            self._bar.set_postfix_str(f"{tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)
            self._bar.update(docs)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _progress_bar(enabled: bool) -> _Bar:
    return _Bar(enabled)
