"""Build an index on a Ray cluster: Ray Data reads and tokenizes, Ray tasks build the shards.

1. **Read** with Ray Data, in corpus order (``preserve_order``): JSONL through
   ``read_text`` (each line parsed with the local reader's record rules),
   Parquet through ``read_parquet``; any other format one file per row,
   through the local :class:`CorpusReader`.
2. **Tokenize** on the workers (``map_batches`` tasks; each worker process
   loads the tokenizer once and keeps it).
3. **Cut** on the driver with the local build's own rule
   (:class:`~lookupdec.index.shards.ShardWriter`), so shard boundaries, and
   therefore every file, equal a local build's with the same shard size.
4. **Build** each shard's files on a worker (a Ray task, retried up to
   ``_RETRIES`` times if its worker dies) into the temporary directory next to
   the output, which must be on a filesystem the workers share. The driver
   writes the one manifest and renames the directory into place; on any failure
   the temporary directory is removed, so no half index ever opens.

``ray`` is imported only here, and only when a Ray build runs.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lookupdec.errors import CorpusError, LookupdecError
from lookupdec.index.outdir import BuildError, install, make_temp, os_failure
from lookupdec.index.shards import ShardWriter, write_shard

_RETRIES = 3
_INSTALL = "install it with: pip install 'lookupdec[ray]'"


def import_ray():
    """The ``ray`` module, or a clear error naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise LookupdecError(f"--ray needs Ray Data, which is not installed; {_INSTALL}") from None
    return ray


def _probe(address: str | None) -> None:
    """Fail in seconds, not minutes, when an explicit ``host:port`` does not answer (ray.init retries long)."""
    import socket

    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise LookupdecError(f"cannot reach the Ray cluster at {address}: {exc}; start one (`ray start --head`) or "
                             "pass its address to --ray") from None


class _Cutter(ShardWriter):
    """The local cut rule; a closed shard's stream goes to ``emit`` instead of a file."""

    def __init__(self, capacity: int, emit: Callable[[int, np.ndarray, int], None]):
        super().__init__(Path("."), capacity)
        self._emit = emit
        self._parts: list[np.ndarray] = []

    def _append(self, arr: np.ndarray) -> None:
        self._parts.append(arr)
        self._len += arr.size

    def _close_shard(self) -> None:
        self._emit(self._closed, np.concatenate(self._parts).astype(np.int32), self._docs)
        self._parts = []
        self._closed += 1
        self._len = self._docs = 0


def _shard_task(directory: str, number: int, stream: np.ndarray, documents: int, hook) -> dict:
    import resource

    if hook is not None:
        hook(number)
    entry = write_shard(Path(directory), number, stream, documents)
    return {"entry": entry, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


_TOKENIZERS: dict = {}  # per worker process: each loads a tokenizer once


def _tokenize(tokenizer_json: str):
    def tokenize(batch: dict) -> dict:
        from tokenizers import Tokenizer

        from lookupdec.index.corpus import encode_texts

        tok = _TOKENIZERS.get(tokenizer_json)
        if tok is None:
            tok = _TOKENIZERS.setdefault(tokenizer_json, Tokenizer.from_str(tokenizer_json))
        arrays = encode_texts(tok, [t or "" for t in batch["text"]])
        return {"ids": np.array([a.tobytes() for a in arrays], dtype=object), "bad": np.asarray(batch["bad"])}

    return tokenize


def _parse_lines(text_field: str, skip_invalid: bool):
    from lookupdec.index.corpus import CorpusReader

    def parse(batch: dict) -> dict:
        reader = CorpusReader.__new__(CorpusReader)
        reader.text_field, reader.skip_invalid, reader.skipped = text_field, skip_invalid, 0
        out_text, out_bad = [], []
        for line, path in zip(batch["text"], batch["path"]):
            if not line.strip():
                continue
            before = reader.skipped
            try:
                text = reader._record_text(json.loads(line), str(path))
            except json.JSONDecodeError as exc:
                reader._bad(f"{path}: malformed JSON ({exc.msg}) in line {line[:60]!r}; fix the line or pass "
                            "--skip-invalid")
                text = None
            out_text.append(text or "")
            out_bad.append(reader.skipped - before)
        return {"text": np.array(out_text, dtype=object), "bad": np.array(out_bad, dtype=np.int64)}

    return parse


def _read_files(text_field: str, skip_invalid: bool):
    from lookupdec.index.corpus import CorpusReader

    def read(row: dict) -> list[dict]:
        reader = CorpusReader([row["path"]], text_field=text_field, skip_invalid=skip_invalid)
        rows = [{"text": t, "bad": 0} for t in reader]
        return rows + [{"text": "", "bad": 1}] * reader.skipped

    return read


def _dataset(ray, files: list[Path], text_field: str, skip_invalid: bool):
    """Ray datasets of ``{"text", "bad"}`` rows, one per run of files of one kind, in corpus order."""
    import ray.data as rd

    def kind(p: Path) -> str:
        name = p.name.lower()
        return "jsonl" if name.endswith((".jsonl", ".ndjson")) else "parquet" if name.endswith(".parquet") else "other"

    groups: list[tuple[str, list[str]]] = []
    for f in files:
        k = kind(f)
        if groups and groups[-1][0] == k:
            groups[-1][1].append(str(f))
        else:
            groups.append((k, [str(f)]))
    parts = []
    for k, paths in groups:
        if k == "jsonl":
            parts.append(rd.read_text(paths, include_paths=True).map_batches(_parse_lines(text_field, skip_invalid),
                                                                             batch_format="numpy"))
        elif k == "parquet":
            def pick(batch, column=text_field):
                return {"text": np.array([v if isinstance(v, str) else "" for v in batch[column]], dtype=object),
                        "bad": np.zeros(len(batch[column]), np.int64)}

            parts.append(rd.read_parquet(paths, columns=[text_field]).map_batches(pick, batch_format="numpy"))
        else:
            parts.append(rd.from_items([{"path": p} for p in paths]).flat_map(_read_files(text_field, skip_invalid)))
    return parts  # read one after another: a union does not keep the order across its inputs


def _settle(ray, futures: list) -> None:
    """Wait until every shard task submitted has ended, failed or not, without cancelling any.

    `ray.cancel` races a task's own reply in Ray's core worker, and the loser aborts the whole driver process
    (a failed check, "Tried to complete task that was not pending"); a task left running would also write its
    shard into the folder about to be removed. Shard tasks are short, so waiting costs little."""
    if futures:
        ray.wait(futures, num_returns=len(futures), timeout=None, fetch_local=False)


def build_with_ray(reader, out: Path, loaded, tok, *, shard_tokens: int, overwrite: bool, address: str | None,
                   params: dict, _task_hook: Any = None):
    """The Ray engine of :func:`lookupdec.index.build_index` (see the module docstring).

    Returns:
        ``(manifest-less summary fields)``: see build_index.
    Raises:
        LookupdecError: Ray is not installed, the cluster cannot be reached, or a shard task failed.
    """
    import datetime as _dt

    from lookupdec import __version__
    from lookupdec.index.summary import IndexSummary
    from lookupdec.index.manifest import Manifest, TokenizerRecord, write_manifest
    from lookupdec.index.parallel import peak_rss

    ray = import_ray()
    started_here = False
    if not ray.is_initialized():
        _probe(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's forms vary by version
            raise LookupdecError(f"cannot reach the Ray cluster at {address or 'the default address'}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; start one "
                                 "(`ray start --head`) or pass its address to --ray") from None
        started_here = True
    t_start = time.perf_counter()
    tmp = make_temp(out)
    task = ray.remote(max_retries=_RETRIES)(_shard_task)
    futures = []
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # corpus order is what makes the shards equal a local build's
        cutter = _Cutter(shard_tokens, lambda n, s, d: futures.append(task.remote(str(tmp), n, s, d, _task_hook)))
        skipped = 0
        for ds in _dataset(ray, reader.files, reader.text_field, reader.skip_invalid):
            # Tasks, not actors: actors holding every CPU would starve the read tasks of a small cluster.
            ds = ds.map_batches(_tokenize(tok.to_str()), batch_format="numpy")
            for batch in ds.iter_batches(batch_size=256, batch_format="numpy"):
                skipped += int(np.sum(batch["bad"]))
                for raw in batch["ids"]:
                    if len(raw):
                        cutter.add(np.frombuffer(raw, dtype=np.int32))
        cutter.finish()
        if cutter.documents == 0:
            raise CorpusError("the corpus holds no text: nothing to index; check the files and the text field")
        results = ray.get(futures)
        shards = tuple(r["entry"] for r in results)
        manifest = Manifest(tokenizer=TokenizerRecord(loaded.name, loaded.fingerprint, loaded.vocab_size),
                            documents=cutter.documents, tokens=cutter.total_tokens, skipped=skipped, shards=shards,
                            build=params, lookupdec_version=__version__,
                            created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        size = write_manifest(tmp, manifest)
        install(tmp, out, overwrite)
    except BaseException as exc:
        _settle(ray, futures)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, LookupdecError):
            raise
        if isinstance(exc, OSError):
            raise os_failure(exc, out) from None
        if isinstance(exc, Exception):
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, CorpusError):
                raise CorpusError(str(cause)) from None
            first = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
            raise BuildError(f"the Ray build failed and left nothing behind: {first}; fix the cause and run it "
                             f"again (a worker that dies is retried {_RETRIES} times)") from None
        raise
    finally:
        if started_here:
            ray.shutdown()
    return IndexSummary(path=out, documents=cutter.documents, tokens=cutter.total_tokens, shards=len(shards),
                        bytes_on_disk=manifest.bytes_on_disk + size, seconds=time.perf_counter() - t_start,
                        tokenize_seconds=0.0, index_seconds=0.0, skipped=skipped,
                        peak_rss_bytes=peak_rss() + max((r["rss"] for r in results), default=0), jobs=1)
