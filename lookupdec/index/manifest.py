"""The index manifest: ``manifest.json``, what it records and how it is checked.

An index directory holds ``manifest.json`` and, per shard, two raw
little-endian arrays::

    shard-00000.tokens.i32   the token stream: doc SEP doc SEP ... doc SEP  (SEP = -1)
    shard-00000.sa.i32       its suffix array (.sa.i64 when the shard has >= 2^31 entries)

The manifest is the last file written before the directory is renamed into
place, and it records every file's length, byte size and SHA-256, so an index
that is incomplete, truncated or altered is refused when opened.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lookupdec.errors import IndexFormatError

FORMAT_NAME = "lookupdec-suffix-index"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SEP = -1  # document separator in token arrays; sorts below every token
MAX_TOKEN = 2**31 - 1  # the largest token id: ids are stored as int32
DTYPES = {"int32": 4, "int64": 8}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # array files live in the index directory itself
_REBUILD = "rebuild the index with `lookupdec build-index ... --overwrite`"


@dataclass(frozen=True)
class ArrayFile:
    """One raw array file of a shard.

    Attributes:
        file: file name inside the index directory.
        dtype: ``"int32"`` or ``"int64"`` (little-endian).
        length: number of elements.
        bytes: file size, ``length * itemsize``.
        sha256: hex digest of the file's bytes.
    """

    file: str
    dtype: str
    length: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardEntry:
    """One shard: a token array (documents + separators) and its suffix array.

    Attributes:
        tokens: the token stream file; ``tokens.length == n_tokens + documents``.
        sa: the suffix array file; ``sa.length == tokens.length``.
        documents: documents (or pieces of a document longer than a shard) in this shard.
        n_tokens: corpus tokens in this shard, separators excluded.
    """

    tokens: ArrayFile
    sa: ArrayFile
    documents: int
    n_tokens: int


@dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer an index was built with (``fingerprint`` decides identity)."""

    name: str
    fingerprint: str
    vocab_size: int


@dataclass(frozen=True)
class Manifest:
    """Everything ``manifest.json`` says about an index.

    Attributes:
        tokenizer: ``None`` for an index built from raw token ids without a tokenizer.
        documents: documents indexed (empty documents are not counted).
        tokens: corpus tokens, separators excluded.
        skipped: invalid corpus records skipped during the build.
        shards: the shards, in corpus order.
        build: build parameters (shard size, text field, sources, ...), for the record.
        lookupdec_version / created: who built it and when (UTC, ISO 8601).
        version: the manifest version: 1 when built, one more for every append or compaction.
    """

    tokenizer: TokenizerRecord | None
    documents: int
    tokens: int
    skipped: int
    shards: tuple[ShardEntry, ...]
    build: dict = field(default_factory=dict)
    lookupdec_version: str = ""
    created: str = ""
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    separator: int = SEP
    byte_order: str = "little"
    version: int = 1

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of all array files (the manifest itself is a few KB more)."""
        return sum(s.tokens.bytes + s.sa.bytes for s in self.shards)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shards"] = [asdict(s) for s in self.shards]
        # Put the identifying fields first so `head manifest.json` is informative.
        order = ["format", "format_version", "version", "lookupdec_version", "created", "tokenizer", "documents", "tokens",
                 "skipped"]
        return {**{k: d[k] for k in order}, **{k: v for k, v in d.items() if k not in order}}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Manifest":
        """Validate a parsed manifest. ``where`` names the file in error messages.

        Raises:
            IndexFormatError: wrong format or version, or a missing / ill-typed field.
        """
        if not isinstance(d, dict):
            raise IndexFormatError(f"{where} is not a JSON object; {_REBUILD}")
        fmt = d.get("format")
        if fmt != FORMAT_NAME:
            raise IndexFormatError(f"{where} is not a lookupdec index manifest (format {fmt!r}, expected {FORMAT_NAME!r}); {_REBUILD}")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise IndexFormatError(
                f"{where} has format version {version!r}, but this lookupdec ({_pkg_version()}) reads version "
                f"{FORMAT_VERSION}; {_REBUILD}, or use the lookupdec version that built it"
            )
        if d.get("separator", SEP) != SEP or d.get("byte_order", "little") != "little":
            raise IndexFormatError(f"{where}: unsupported separator or byte order; {_REBUILD}")
        tok = d.get("tokenizer")
        tokenizer = None
        if tok is not None:
            tokenizer = TokenizerRecord(
                name=_field(tok, "name", str, f"{where} tokenizer"),
                fingerprint=_field(tok, "fingerprint", str, f"{where} tokenizer"),
                vocab_size=_field(tok, "vocab_size", int, f"{where} tokenizer"),
            )
            if tokenizer.vocab_size > MAX_TOKEN + 1:
                raise IndexFormatError(f"{where} tokenizer: field 'vocab_size' is out of range "
                                       f"({tokenizer.vocab_size}: ids are int32); {_REBUILD}")
        shards_raw = _field(d, "shards", list, where)
        shards = tuple(_shard(s, f"{where} shard {i}") for i, s in enumerate(shards_raw))
        m = cls(
            tokenizer=tokenizer,
            documents=_field(d, "documents", int, where),
            tokens=_field(d, "tokens", int, where),
            skipped=_field(d, "skipped", int, where),
            shards=shards,
            build=d.get("build") if isinstance(d.get("build"), dict) else {},
            lookupdec_version=str(d.get("lookupdec_version", "")),
            created=str(d.get("created", "")),
            version=_field(d, "version", int, where) if "version" in d else 1,
        )
        if not shards:
            raise IndexFormatError(f"{where} lists no shards; {_REBUILD}")
        if m.tokens != sum(s.n_tokens for s in shards) or m.documents > sum(s.documents for s in shards):
            raise IndexFormatError(f"{where}: totals disagree with the shard list; {_REBUILD}")
        return m


def read_manifest(index_dir: Path) -> Manifest:
    """Read and validate ``index_dir/manifest.json``.

    Raises:
        IndexFormatError: the directory or manifest is missing, unreadable, not JSON, or invalid.
    """
    path = Path(index_dir) / MANIFEST_NAME
    if Path(index_dir).exists() and not Path(index_dir).is_dir():
        raise IndexFormatError(f"{index_dir} is a file, not an index directory; pass the directory "
                               "`lookupdec build-index -o DIR` wrote")
    if not Path(index_dir).is_dir():
        raise IndexFormatError(f"index directory {index_dir} does not exist; build one with `lookupdec build-index`")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise IndexFormatError(f"{path} is missing: {index_dir} is not a (complete) lookupdec index; {_REBUILD}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"cannot read {path}: {exc}; {_REBUILD}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{path} is truncated or not valid JSON ({exc.msg} at line {exc.lineno}); {_REBUILD}") from exc
    return Manifest.from_dict(data, str(path))


def write_manifest(index_dir: Path, manifest: Manifest, name: str = MANIFEST_NAME) -> int:
    """Write ``manifest.json`` (or ``name``), flushed to disk; returns its size in bytes."""
    data = (json.dumps(manifest.to_dict(), indent=2) + "\n").encode("utf-8")
    path = Path(index_dir) / name
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data)


def _field(d: Any, key: str, typ: type, where: str) -> Any:
    value = d.get(key) if isinstance(d, dict) else None
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok or (typ is int and value < 0):
        raise IndexFormatError(f"{where}: field {key!r} is missing or invalid ({value!r}); {_REBUILD}")
    return value


def _array(d: Any, where: str) -> ArrayFile:
    a = ArrayFile(
        file=_field(d, "file", str, where),
        dtype=_field(d, "dtype", str, where),
        length=_field(d, "length", int, where),
        bytes=_field(d, "bytes", int, where),
        sha256=_field(d, "sha256", str, where),
    )
    if not _SAFE_NAME.match(a.file):
        raise IndexFormatError(f"{where}: file name {a.file!r} is not a plain file name; {_REBUILD}")
    if a.dtype not in DTYPES or a.bytes != a.length * DTYPES[a.dtype]:
        raise IndexFormatError(f"{where}: {a.file} has dtype {a.dtype!r} and {a.bytes} bytes for {a.length} entries; {_REBUILD}")
    return a


def _shard(d: Any, where: str) -> ShardEntry:
    s = ShardEntry(
        tokens=_array(_field(d, "tokens", dict, where), where),
        sa=_array(_field(d, "sa", dict, where), where),
        documents=_field(d, "documents", int, where),
        n_tokens=_field(d, "n_tokens", int, where),
    )
    if s.tokens.dtype != "int32" or s.sa.length != s.tokens.length or s.tokens.length != s.n_tokens + s.documents:
        raise IndexFormatError(f"{where}: array lengths disagree ({s.tokens.file}: {s.tokens.length}, "
                               f"{s.sa.file}: {s.sa.length}, {s.n_tokens} tokens + {s.documents} separators); {_REBUILD}")
    return s


def _pkg_version() -> str:
    from lookupdec import __version__

    return __version__
