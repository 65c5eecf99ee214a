"""Parallel pieces of a local build: memory sizes, tokenizing on worker processes, peak RSS.

- **Memory.** ``parse_size("2G")`` reads a ``--max-memory`` value; :func:`plan_memory`
  turns it into a shard size and how many shards may build their suffix arrays at
  once. The shard size depends on the memory limit only, never on ``jobs``, so the
  output is the same whatever ``jobs`` is.
- **Tokenizing.** :class:`ParallelEncoder` sends ordered batches of documents to
  spawned worker processes (each loads the tokenizer once, from its JSON) and
  yields their token arrays back in corpus order, with at most ``2 * jobs``
  batches in flight, so memory stays bounded whatever the corpus size.
- **Peak RSS.** :func:`peak_rss` adds the peak resident set of this process and
  of each live worker (``VmHWM`` on Linux): an upper bound of the build's peak.

This module must not import torch.
"""
from __future__ import annotations

import os
import re
import resource
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

#: Bytes of memory per shard entry while its suffix array is built: the token file's
#: pages (4), the int32 suffix array (4), and SA-IS working space (about 5).
BYTES_PER_ENTRY = 13
#: Memory set aside for the main process and each tokenizer worker (the tokenizer, a batch in flight).
BASE_BYTES = 256 * 2**20
WORKER_BYTES = 192 * 2**20
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"2G"``, ``"512M"``, ``"1.5GiB"`` or ``1000000`` (binary units).

    Raises:
        ValueError: not a positive size; the message shows the accepted forms.

    Example:
        >>> parse_size("2G")
        2147483648
    """
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), flags=re.IGNORECASE)
        if not m:
            raise ValueError(f"cannot read the memory size {text!r} (--max-memory); write a number of bytes with an optional unit, "
                             "e.g. 2G, 512M or 1.5G")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ValueError(f"the memory size must be positive, got {text!r}; e.g. --max-memory 2G")
    return value


@dataclass(frozen=True)
class MemoryPlan:
    """How a build uses its memory.

    Attributes:
        shard_tokens: entries (tokens + separators) per shard.
        parallel_shards: shards whose suffix arrays may be built at the same time.
    """

    shard_tokens: int
    parallel_shards: int

    def __post_init__(self):
        if self.shard_tokens < 2 or self.parallel_shards < 1:
            raise ValueError(f"invalid memory plan {self}")


def plan_memory(max_memory: int | None, shard_tokens: int | None, jobs: int, default_shard_tokens: int) -> MemoryPlan:
    """The shard size and suffix-array parallelism for a memory limit.

    Rule: without ``shard_tokens``, a shard takes half the memory left after the
    main process (``BASE_BYTES``), at ``BYTES_PER_ENTRY`` bytes per entry, capped
    at the default; it never depends on ``jobs``. The memory left after the main
    process and ``jobs`` tokenizer workers (``WORKER_BYTES`` each) then holds
    ``parallel_shards`` shard builds.
    Without ``max_memory``, half the machine's physical memory is the limit for
    the parallelism (the shard size stays ``shard_tokens`` or the default).

    Raises:
        ValueError: ``max_memory`` too small for the workers plus one shard.

    Example:
        >>> plan_memory(2**30, None, 1, 10**8).shard_tokens
        30973321
    """
    jobs = max(1, int(jobs))
    overhead = BASE_BYTES + (WORKER_BYTES * jobs if jobs > 1 else 0)
    if max_memory is None:
        size = shard_tokens or default_shard_tokens
        budget = _physical_memory() // 2 - overhead
        return MemoryPlan(size, max(1, min(jobs, budget // (BYTES_PER_ENTRY * size))))
    budget = max_memory - overhead
    # The shard size must not depend on jobs (outputs are identical whatever jobs is): a derived
    # shard takes half of what the main process leaves; the other half is for tokenizer workers.
    if shard_tokens is None:
        shard_tokens = min(default_shard_tokens, (max_memory - BASE_BYTES) // 2 // BYTES_PER_ENTRY)
    if shard_tokens < 1000:
        need = overhead + BYTES_PER_ENTRY * max(shard_tokens, 1000)
        raise ValueError(f"--max-memory {max_memory / 2**20:,.0f} MiB is too small: the build needs about "
                         f"{need / 2**20:,.0f} MiB for {jobs} job(s) and one shard; raise --max-memory, lower --jobs "
                         "or --shard-tokens")
    if BYTES_PER_ENTRY * shard_tokens > budget:
        raise ValueError(f"--shard-tokens {shard_tokens:,} needs about {BYTES_PER_ENTRY * shard_tokens / 2**20:,.0f} MiB "
                         f"per shard, more than --max-memory leaves after {jobs} job(s) ({budget / 2**20:,.0f} MiB); lower "
                         "--shard-tokens or --jobs, or raise --max-memory")
    return MemoryPlan(int(shard_tokens), max(1, min(jobs, budget // (BYTES_PER_ENTRY * shard_tokens))))


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


# ------------------------------------------------------------------ tokenizing
_WORKER_TOKENIZER = None


def _init_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    # One thread per worker: the workers are the parallelism (the Rust pool would oversubscribe the cores).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)


def _encode_packed(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """In a worker: the batch's token ids, concatenated, and each document's length (cheap to pickle)."""
    from lookupdec.index.corpus import encode_texts

    arrays = encode_texts(_WORKER_TOKENIZER, texts)
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    return flat.astype(np.int32, copy=False), lengths


class ParallelEncoder:
    """Tokenize ordered batches of documents on ``jobs`` spawned processes (``jobs == 1``: in this process).

    Args:
        tokenizer: a prepared ``tokenizers.Tokenizer`` (see ``corpus.prepare_tokenizer``).
        jobs: worker processes.
    Example:
        >>> with ParallelEncoder(tok, jobs=2) as enc:                    # doctest: +SKIP
        ...     for arrays in enc.map(batched_texts(reader)): ...
    """

    def __init__(self, tokenizer, jobs: int):
        if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
            raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
        self.tokenizer = tokenizer
        self.jobs = int(jobs)
        self._pool = None

    def __enter__(self) -> "ParallelEncoder":
        if self.jobs > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            # Spawned, not forked: the parent may hold threads (the tokenizer's pool, tqdm).
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                             initargs=(self.tokenizer.to_str(),))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def worker_pids(self) -> list[int]:
        return list(getattr(self._pool, "_processes", None) or {}) if self._pool is not None else []

    def map(self, batches: Iterable[Sequence[str]]) -> Iterator[list[np.ndarray]]:
        """The token arrays of each batch, in order; at most ``2 * jobs`` batches in flight."""
        from lookupdec.index.corpus import encode_texts

        if self._pool is None:
            for batch in batches:
                yield encode_texts(self.tokenizer, batch)
            return
        pending: deque = deque()
        for batch in batches:
            pending.append(self._pool.submit(_encode_packed, list(batch)))
            if len(pending) >= 2 * self.jobs:
                yield _unpack(pending.popleft().result())
        while pending:
            yield _unpack(pending.popleft().result())


def _unpack(packed: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    flat, lengths = packed
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [flat[bounds[i] : bounds[i + 1]] for i in range(lengths.size)]


# ------------------------------------------------------------------ memory used
def peak_rss(worker_pids: Iterable[int] = ()) -> int:
    """Peak resident bytes of this process plus the peaks of the given live processes (an upper bound).

    Example:
        >>> peak_rss() > 0
        True
    """
    total = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    for pid in worker_pids:
        total += _vm_hwm(pid)
    return total


def _vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
