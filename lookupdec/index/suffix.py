"""SuffixIndex: an index directory opened by memory map, and its lookup.

Opening reads only ``manifest.json`` and maps the arrays, so it takes
milliseconds whatever the index size, and several processes share the pages.
A lookup is one native call (``_native.Shards.lookup``, GIL released) over
all the shards:

1. each shard finds its longest suffix of the context with length in
   ``[min_n, max_n]``; later shards only search for matches at least as long
   as the best so far;
2. ``match_len`` is the longest length over all shards; only shards holding a
   match of that length take part, and ``occurrences`` is their total count;
3. the ``max_occurrences`` samples are shared among those shards in proportion
   to their counts (shard s gets floor(M * c_s / C), the rest go one each to
   the largest remainders (M * c_s) mod C, ties to the lower shard), evenly
   spread inside each shard's suffix-array range; the ``depth`` tokens after
   each sampled occurrence (stopping at a document's end) are counted into one
   trie;
4. the ``budget`` best nodes of the trie, less any path through a token id
   outside the vocabulary, become the :class:`DraftTree`.

``tests/oracles/suffix_lookup.py`` keeps the same lookup composed in Python
from the per-shard kernels; tests check that both agree exactly.
"""
from __future__ import annotations

import array
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lookupdec.errors import IndexFormatError, TokenizerMismatchError
from lookupdec.index.manifest import MAX_TOKEN, SEP, ArrayFile, Manifest, read_manifest
from lookupdec.tree import DraftTree

_MAX_TRIE_NODES = 2**30  # the native lookup's largest trie
_REBUILD = "rebuild the index with `lookupdec build-index ... --overwrite`"


@dataclass(frozen=True)
class Lookup:
    """The result of :meth:`SuffixIndex.lookup`.

    Attributes:
        match_len: length of the longest context suffix found (0: no match).
        occurrences: how often that suffix occurs in the whole index.
        sampled: occurrences whose continuations were read (<= max_occurrences).
        tree: the continuations as a draft tree, each node scored with the share
            of the sampled occurrences that continue with its path
            (``counts / sampled``). Empty when there is no match.
        counts: int64 ``(len(tree),)``: how many sampled occurrences continue
            with the path to each node.
    """

    match_len: int
    occurrences: int
    sampled: int
    tree: DraftTree
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass(frozen=True)
class _Shard:
    tokens: np.ndarray  # int32 memmap: doc SEP doc SEP ...
    sa: np.ndarray  # int32 or int64 memmap, the suffix array of `tokens`


def open_index(path: str | os.PathLike, *, verify: bool = False) -> "SuffixIndex":
    """Open an index directory built by :func:`lookupdec.index.build_index`.

    Args:
        path: the index directory.
        verify: also check every file's SHA-256 and every suffix array's order
            (reads the whole index: seconds per GB).
    Returns:
        A :class:`SuffixIndex`.
    Raises:
        IndexFormatError: the directory, manifest or an array file is missing,
            truncated, corrupted, or of another format version. Without
            ``verify`` only cheap structural checks run (sizes, the final
            separator, a sample of suffix-array entries); a lookup on a damaged
            index that passes them still reads nothing outside its arrays and
            returns only token ids inside the index's vocabulary.

    Example:
        >>> idx = open_index("chats.index")                         # doctest: +SKIP
        >>> idx.lookup([504, 2734, 314], max_n=3).match_len          # doctest: +SKIP
        3
    """
    path = Path(path).expanduser()
    manifest = read_manifest(path)
    shards = []
    for entry in manifest.shards:
        shard = _Shard(_map(path, entry.tokens), _map(path, entry.sa))
        _check_structure(path, entry, shard)
        shards.append(shard)
    index = SuffixIndex(path, manifest, shards)
    if verify:
        index.verify()
    return index


class SuffixIndex:
    """A read-only, memory-mapped suffix-array index (use :func:`open_index`).

    Lookups may run from several threads at once: each takes its own scratch
    buffers, and none holds the GIL while it reads the index.
    """

    def __init__(self, path: Path, manifest: Manifest, shards: Sequence[_Shard]):
        from lookupdec import _native

        self.path = Path(path)
        self._manifest = manifest
        self._shards = list(shards)
        vocab = manifest.tokenizer.vocab_size if manifest.tokenizer else 0
        # Token ids a lookup may return: the vocabulary's (a damaged file may hold others).
        self._token_limit = vocab if vocab > 0 else MAX_TOKEN + 1
        self._native = _native.Shards([(s.tokens, s.sa) for s in self._shards], self._token_limit)

    # ------------------------------------------------------------ properties
    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def n_tokens(self) -> int:
        """Corpus tokens (separators excluded)."""
        return self._manifest.tokens

    @property
    def n_documents(self) -> int:
        return self._manifest.documents

    @property
    def n_shards(self) -> int:
        return len(self._shards)

    @property
    def tokenizer_name(self) -> str | None:
        """Name of the tokenizer the index was built with (``None``: built from raw ids)."""
        return self._manifest.tokenizer.name if self._manifest.tokenizer else None

    @property
    def tokenizer_fingerprint(self) -> str | None:
        return self._manifest.tokenizer.fingerprint if self._manifest.tokenizer else None

    def __repr__(self) -> str:
        return f"SuffixIndex({str(self.path)!r}, tokens={self.n_tokens}, documents={self.n_documents}, shards={self.n_shards})"

    # ---------------------------------------------------------------- lookup
    def lookup(
        self,
        context: Sequence[int] | np.ndarray,
        max_n: int = 16,
        min_n: int = 2,
        max_occurrences: int = 5000,
        depth: int = 10,
        budget: int = 64,
    ) -> Lookup:
        """Continuations in the corpus of the longest matching suffix of ``context``.

        Args:
            context: token ids, oldest first (only the last ``max_n`` are read).
            max_n: longest suffix tried.
            min_n: shortest suffix accepted (>= 1).
            max_occurrences: at most this many occurrences are read, spread evenly
                over all of them so continuation frequencies stay representative.
            depth: tokens read after each occurrence (a document's end stops earlier).
            budget: nodes kept in the returned tree.
        Returns:
            A :class:`Lookup`; ``Lookup(0, 0, 0, DraftTree.empty())`` when nothing matches.
        Raises:
            ValueError: an invalid parameter, or a token id outside ``[0, 2^31 - 1]``.

        Example:
            >>> r = idx.lookup([10, 11, 12], max_n=4, min_n=2, depth=3)    # doctest: +SKIP
            >>> r.match_len, r.occurrences, r.tree.tokens.tolist()         # doctest: +SKIP
            (3, 2, [13, 14, 15])
        """
        _check_params(max_n, min_n, max_occurrences, depth, budget)
        ctx = _context_tail(context, max_n)
        if ctx.size < min_n:
            return _NO_MATCH
        best, occurrences, sampled, tokens, parents, counts, scores = self._native.lookup(
            ctx, max_n, min_n, max_occurrences, depth, budget)
        if best == 0:
            return _NO_MATCH
        # The native lookup guarantees the tree invariants (tests check it with `check()`).
        return Lookup(best, occurrences, sampled, DraftTree.trusted(tokens, parents, scores), counts)

    # ------------------------------------------------------------ tokenizer
    def check_tokenizer(self, tokenizer: Any, name: str | None = None) -> None:
        """Refuse to serve a model whose tokenizer differs from the index's.

        Args:
            tokenizer: a vocabulary fingerprint (:func:`lookupdec.tokenizer.tokenizer_fingerprint`),
                a ``tokenizers.Tokenizer``, or a transformers tokenizer.
            name: the model's / tokenizer's name, for the message.
        Raises:
            TokenizerMismatchError: the vocabularies differ, or the index records no tokenizer.

        Example:
            >>> idx.check_tokenizer(dec.tokenizer, "SmolLM2-135M-Instruct")   # doctest: +SKIP
        """
        from lookupdec.tokenizer import _vocab_of, tokenizer_fingerprint

        if isinstance(tokenizer, str):
            fingerprint, vocab = tokenizer, None
        else:
            fingerprint, vocab = tokenizer_fingerprint(tokenizer), len(_vocab_of(tokenizer))
        theirs = f"{name or 'the tokenizer in use'}" + (f" (vocab {vocab}, fingerprint {fingerprint[:12]})" if vocab else f" (fingerprint {fingerprint[:12]})")
        rec = self._manifest.tokenizer
        if rec is None:
            raise TokenizerMismatchError(
                f"index {self.path} was built from raw token ids with no tokenizer recorded, so it cannot be checked "
                f"against {theirs}; rebuild it with build_index_from_tokens(..., tokenizer=...) or `lookupdec build-index`"
            )
        if rec.fingerprint != fingerprint:
            raise TokenizerMismatchError(
                f"index {self.path} was built with tokenizer {rec.name!r} (vocab {rec.vocab_size}, fingerprint "
                f"{rec.fingerprint[:12]}) but the model uses {theirs}; rebuild the index with that model's tokenizer "
                "(`lookupdec build-index --tokenizer ...`) or use a model with the index's tokenizer"
            )

    # ---------------------------------------------------------------- verify
    def verify(self) -> None:
        """Check every file's SHA-256, every suffix array, and the separators (reads the whole index).

        Raises:
            IndexFormatError: naming the first damaged file.
        """
        from lookupdec import _native

        vocab = self._manifest.tokenizer.vocab_size if self._manifest.tokenizer else None
        for entry, shard in zip(self._manifest.shards, self._shards):
            for arr_entry in (entry.tokens, entry.sa):
                digest = _sha256(self.path / arr_entry.file)
                if digest != arr_entry.sha256:
                    raise IndexFormatError(f"{self.path / arr_entry.file} is corrupted (SHA-256 differs from the manifest); {_REBUILD}")
            tokens = shard.tokens
            if int(np.count_nonzero(tokens == SEP)) != entry.documents or (tokens.size and tokens[-1] != SEP):
                raise IndexFormatError(f"{self.path / entry.tokens.file}: separators disagree with the manifest; {_REBUILD}")
            low, high = int(tokens.min()), int(tokens.max())
            if low < SEP or (vocab and high >= vocab):
                raise IndexFormatError(f"{self.path / entry.tokens.file} holds token id {low if low < SEP else high}, "
                                       f"outside the tokenizer's vocabulary; {_REBUILD}")
            fault = _native.check_suffix_array(tokens, shard.sa)
            if fault:
                raise IndexFormatError(f"{self.path / entry.sa.file} is not the suffix array of {entry.tokens.file}: {fault}; {_REBUILD}")


_NO_MATCH = Lookup(0, 0, 0, DraftTree.empty())
_SA_SAMPLES = 64  # suffix-array entries open_index checks per shard


def _check_structure(root: Path, entry, shard: _Shard) -> None:
    """What open_index can check in microseconds: the final separator and a sample of the suffix array."""
    n = shard.tokens.size
    if n == 0:
        return
    if int(shard.tokens[-1]) != SEP:
        raise IndexFormatError(f"{root / entry.tokens.file} does not end with a document separator: the file is "
                               f"damaged; {_REBUILD}")
    picks = np.unique(np.linspace(0, n - 1, min(n, _SA_SAMPLES)).astype(np.int64))
    sample = shard.sa[picks]
    if int(sample.min()) < 0 or int(sample.max()) >= n:
        raise IndexFormatError(f"{root / entry.sa.file} holds positions outside [0, {n}): the file is damaged; "
                               f"{_REBUILD}")


def _check_params(max_n: int, min_n: int, max_occurrences: int, depth: int, budget: int) -> None:
    if (type(max_n) is int and type(min_n) is int and type(max_occurrences) is int and type(depth) is int
            and type(budget) is int and 1 <= min_n <= max_n and max_occurrences >= 1 and depth >= 1
            and budget >= 0 and max_occurrences * depth <= _MAX_TRIE_NODES):
        return  # the common case, decided in a fraction of a microsecond
    for name, value, low in (("min_n", min_n, 1), ("max_n", max_n, 1), ("max_occurrences", max_occurrences, 1),
                             ("depth", depth, 1), ("budget", budget, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_n < min_n:
        raise ValueError(f"max_n ({max_n}) must be >= min_n ({min_n})")
    if max_occurrences * depth > _MAX_TRIE_NODES:
        raise ValueError(f"max_occurrences * depth = {max_occurrences * depth} exceeds {_MAX_TRIE_NODES} trie nodes; "
                         "lower max_occurrences or depth")


def _context_tail(context: Sequence[int] | np.ndarray, max_n: int) -> np.ndarray:
    """The last ``max_n`` tokens as a contiguous int32 array, validated (the hot path: a few µs)."""
    if type(context) is list and _C_INT32:  # the drafters' form, converted without numpy reductions
        try:
            ints = array.array("i", context[-max_n:])  # refuses non-integers and ids past 2^31 - 1
        except (TypeError, OverflowError):
            ints = None  # the general path below names the bad value
        if ints and min(ints) >= 0:
            return np.frombuffer(ints, dtype=np.int32)
    if not isinstance(context, np.ndarray):
        # Slice before converting: a long Python list costs only its tail.
        context = np.asarray(context[-max_n:] if isinstance(context, (list, tuple)) else context)
    if context.ndim != 1:
        raise ValueError(f"context must be a 1-D sequence of token ids, got shape {context.shape}")
    tail = context[-max_n:]
    if tail.size == 0:
        return _EMPTY_CONTEXT
    if tail.dtype != np.int32:
        if not np.issubdtype(tail.dtype, np.integer):
            raise ValueError(f"context must hold integer token ids, got dtype {tail.dtype}")
        if tail.dtype.itemsize >= 4 and int(tail.max()) > MAX_TOKEN:  # would wrap around in int32
            raise ValueError(f"context holds token id {int(tail.max())}, outside [0, {MAX_TOKEN}]")
        tail = tail.astype(np.int32)
    elif not tail.flags.c_contiguous:
        tail = np.ascontiguousarray(tail)
    low = int(tail.min())
    if low < 0:  # -1 would read as a document separator, anything lower is invalid
        raise ValueError(f"context holds token id {low}, outside [0, {MAX_TOKEN}]")
    return tail


_EMPTY_CONTEXT = np.zeros(0, dtype=np.int32)
_C_INT32 = array.array("i").itemsize == 4  # array's "i" is a C int: 32 bits on every supported platform


def _map(root: Path, entry: ArrayFile) -> np.ndarray:
    path = root / entry.file
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise IndexFormatError(f"{path} is missing: the index is incomplete; {_REBUILD}") from None
    except OSError as exc:
        raise IndexFormatError(f"cannot read {path}: {exc}; {_REBUILD}") from exc
    if size != entry.bytes:
        raise IndexFormatError(f"{path} has {size} bytes but the manifest says {entry.bytes} (truncated or replaced); {_REBUILD}")
    dtype = "<i4" if entry.dtype == "int32" else "<i8"
    if entry.length == 0:
        return np.zeros(0, dtype=dtype)
    try:
        # A plain ndarray view of the read-only map (it keeps the map alive): the native
        # calls then see an ordinary buffer, without np.memmap's subclass overhead.
        return np.memmap(path, dtype=dtype, mode="r", shape=(entry.length,)).view(np.ndarray)
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"cannot map {path}: {exc}; {_REBUILD}") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    except OSError as exc:
        raise IndexFormatError(f"cannot read {path}: {exc}; {_REBUILD}") from exc
    return h.hexdigest()
