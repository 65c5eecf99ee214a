"""Read corpus files as a stream of documents, and tokenize them in batches.

Formats, chosen by file name:

- ``.jsonl`` / ``.ndjson`` (optionally ``.gz``): one JSON object per line. The
  document is the string under ``text_field`` (default ``"text"``). Chat
  records are accepted too: a list of turns under ``text_field`` or, when the
  default ``"text"`` is absent, under ``"conversations"`` (ShareGPT:
  ``{"from", "value"}``), ``"messages"`` (UltraChat-200k / OpenAI:
  ``{"role", "content"}``) or ``"data"`` (original UltraChat: plain strings).
  The turns' texts are joined with a blank line into one document, so a
  lookup may continue from a question into its answer.
- ``.json``: a JSON array of such records (ShareGPT's own files), or, when the
  file does not start with ``[``, JSONL under another name.
- ``.parquet``, ``.arrow`` / ``.feather`` / ``.ipc`` (Arrow IPC file or stream,
  e.g. a Hugging Face ``datasets`` cache file): the same column rules, read in
  record batches through pyarrow.
- anything else (``.txt``, ``.md``, ``.py``, ...): one document per file,
  UTF-8. A directory stands for the corpus files below it (sorted, hidden
  entries skipped).

Every failure is a :class:`~lookupdec.errors.CorpusError` naming the file and,
where there is one, the line (JSONL) or row (tables). With
``skip_invalid=True``, bad records (malformed JSON, no text, not UTF-8) are
skipped and counted instead.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

from lookupdec.decoder_args import unicode_problem
from lookupdec.errors import CorpusError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
#: Suffixes a directory walk takes as plain-text documents (explicitly named files of any suffix are read).
TEXT_SUFFIXES = (
    ".txt", ".md", ".rst", ".tex", ".html", ".xml", ".csv", ".yaml", ".yml", ".toml", ".ini", ".cfg",
    ".py", ".pyi", ".pyx", ".pxd", ".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".rs", ".go", ".java", ".kt",
    ".scala", ".js", ".ts", ".jsx", ".tsx", ".rb", ".php", ".pl", ".lua", ".sh", ".sql", ".swift", ".m", ".r",
    ".jl", ".hs", ".ml", ".cs", ".zig",
)  # fmt: skip
#: Fields tried, in order, for chat records when the default text field is absent.
CHAT_FIELDS = ("conversations", "messages", "conversation", "data")
#: Keys holding a turn's text inside a chat turn object.
TURN_FIELDS = ("value", "content", "text")
DEFAULT_TEXT_FIELD = "text"
_SKIP_HINT = "or pass skip_invalid=True (--skip-invalid) to skip such records"


class CorpusReader:
    """Iterate over the documents (non-empty strings) of corpus files, in order.

    Attributes (updated while iterating):
        files: the corpus files, directories expanded.
        documents: documents yielded so far.
        skipped: invalid records skipped so far (only with ``skip_invalid``).

    Args:
        sources: files or directories.
        text_field: JSON field / table column holding the text (or a list of chat turns).
        skip_invalid: skip and count bad records instead of raising.
    Raises:
        CorpusError: a source is missing, or (while iterating) a record is bad.

    Example:
        >>> reader = CorpusReader(["chats.jsonl"], skip_invalid=True)   # doctest: +SKIP
        >>> texts = list(reader); reader.skipped                          # doctest: +SKIP
        0
    """

    def __init__(self, sources: Iterable[str | os.PathLike], *, text_field: str = DEFAULT_TEXT_FIELD, skip_invalid: bool = False):
        if not text_field:
            raise ValueError("text_field must be a non-empty field name")
        self.files: list[Path] = expand_sources(sources)
        self.text_field = text_field
        self.skip_invalid = skip_invalid
        self.documents = 0
        self.skipped = 0

    def __iter__(self) -> Iterator[str]:
        for path in self.files:
            name = path.name.lower()
            base = name[:-3] if name.endswith(".gz") else name
            if base.endswith(JSONL_SUFFIXES) or (base.endswith(".json") and not _starts_with(path, b"[")):
                texts = self._jsonl(path)
            elif base.endswith(".json"):
                texts = self._json_array(path)
            elif name.endswith(TABLE_SUFFIXES):
                texts = self._table(path)
            else:
                texts = self._plain(path)
            for text in texts:
                if text:  # an empty document adds no tokens; it is not counted
                    self.documents += 1
                    yield text

    # ------------------------------------------------------------ per format
    def _bad(self, message: str) -> None:
        """Raise ``message`` as a CorpusError, or count a skip under ``skip_invalid``."""
        if not self.skip_invalid:
            raise CorpusError(message)
        self.skipped += 1

    def _jsonl(self, path: Path) -> Iterator[str]:
        try:
            handle = gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")
        except OSError as exc:
            raise CorpusError(f"cannot read {path}: {exc.strerror or exc}") from exc
        with handle:
            lineno = 0
            try:
                for raw in handle:
                    lineno += 1
                    try:
                        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                    except UnicodeDecodeError as exc:
                        self._bad(f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                                  f"convert the file to UTF-8 {_SKIP_HINT}")
                        continue
                    if not line.strip():
                        continue  # blank lines separate nothing and are not records
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        self._bad(f"{path}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno}); fix the line {_SKIP_HINT}")
                        continue
                    text = self._record_text(record, f"{path}:{lineno}")
                    if text is not None:
                        yield text
            except (OSError, EOFError) as exc:  # e.g. a truncated .gz, an I/O error mid-file
                raise CorpusError(f"cannot read {path} (after line {lineno}): {exc}") from exc

    def _json_array(self, path: Path) -> Iterator[str]:
        try:
            raw = gzip.open(path, "rb").read() if path.name.lower().endswith(".gz") else path.read_bytes()
            records = json.loads(raw.decode("utf-8-sig"))
        except (OSError, EOFError) as exc:
            raise CorpusError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{path}: not UTF-8 (byte offset {exc.start}); convert the file to UTF-8") from exc
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno}); "
                              "a .json file must hold one array of records (or be JSONL)") from exc
        if not isinstance(records, list):
            raise CorpusError(f"{path}: expected a JSON array of records, got {type(records).__name__}")
        for i, record in enumerate(records):
            text = self._record_text(record, f"{path}: item {i}")
            if text is not None:
                yield text

    def _record_text(self, record: Any, where: str) -> str | None:
        if not isinstance(record, dict):
            self._bad(f"{where}: expected a JSON object, got {type(record).__name__}; {_SKIP_HINT}")
            return None
        field = self.text_field
        if field not in record and field == DEFAULT_TEXT_FIELD:
            field = next((f for f in CHAT_FIELDS if isinstance(record.get(f), list)), field)
        if field not in record:
            keys = ", ".join(sorted(map(str, record))[:10]) or "none"
            self._bad(f"{where}: no field {self.text_field!r} (fields: {keys}); "
                      f"name the text field with text_field= (--text-field) {_SKIP_HINT}")
            return None
        return self._value_text(record[field], f"{where}: field {field!r}")

    def _value_text(self, value: Any, where: str) -> str | None:
        if isinstance(value, str):
            return self._unicode(value, where)
        if isinstance(value, list):
            turns = [_turn_text(t) for t in value]
            if all(t is not None for t in turns):
                return self._unicode("\n\n".join(turns), where)
            self._bad(f"{where}: a chat turn has no text (expected strings or objects with one of {TURN_FIELDS}); {_SKIP_HINT}")
            return None
        self._bad(f"{where}: expected text or a list of chat turns, got {type(value).__name__}; {_SKIP_HINT}")
        return None

    def _unicode(self, text: str, where: str) -> str | None:
        """``text``, unless it holds a lone surrogate (JSON's unpaired ``\\udXXX`` escapes), which no
        tokenizer encodes."""
        problem = unicode_problem(text)
        if problem:
            self._bad(f"{where}: not valid Unicode ({problem}: an unpaired \\udXXX escape); {_SKIP_HINT}")
            return None
        return text

    def _table(self, path: Path) -> Iterator[str]:
        import pyarrow as pa

        try:
            names, batches = _open_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise CorpusError(f"cannot read {path} as {path.suffix[1:]}: {exc}") from exc
        column = self.text_field
        if column not in names and column == DEFAULT_TEXT_FIELD:
            column = next((c for c in CHAT_FIELDS if c in names), column)
        if column not in names:
            raise CorpusError(f"{path}: no column {self.text_field!r} (columns: {', '.join(names[:10])}); "
                              "name the text column with text_field= (--text-field)")
        row = 0
        try:
            for batch in batches(column):
                for value in batch.column(batch.schema.get_field_index(column)).to_pylist():
                    row += 1
                    text = self._value_text(value, f"{path}: row {row}, column {column!r}")
                    if text is not None:
                        yield text
        except (OSError, pa.ArrowException) as exc:
            raise CorpusError(f"cannot read {path} (after row {row}): {exc}") from exc

    def _plain(self, path: Path) -> Iterator[str]:
        try:
            raw = gzip.open(path, "rb").read() if path.name.lower().endswith(".gz") else path.read_bytes()
        except (OSError, EOFError) as exc:
            raise CorpusError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
        try:
            yield raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            self._bad(f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                      f"convert it to UTF-8 or leave it out, {_SKIP_HINT}")


def expand_sources(sources: Iterable[str | os.PathLike]) -> list[Path]:
    """Check that every source exists and expand directories into their corpus files.

    Raises:
        CorpusError: no sources, a missing source, or a directory with no corpus files.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files: list[Path] = []
    given = [Path(s).expanduser() for s in sources]
    if not given:
        raise CorpusError("no corpus files given; name at least one JSONL, Parquet, Arrow or text file")
    for src in given:
        if src.is_dir():
            found = [p for p in _walk(src) if _is_corpus_file(p)]
            if not found:
                raise CorpusError(f"directory {src} holds no corpus files (JSONL, Parquet, Arrow or text)")
            files.extend(found)
        elif src.exists():
            files.append(src)
        else:
            raise CorpusError(f"corpus file {src} does not exist")
    return files


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


def _is_corpus_file(path: Path) -> bool:
    # .json is not taken from directories: in a code tree it is config, not a record array.
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return name.endswith(JSONL_SUFFIXES + TABLE_SUFFIXES + TEXT_SUFFIXES)


def _starts_with(path: Path, prefix: bytes) -> bool:
    """True if the file's first non-blank bytes are ``prefix`` (False if unreadable: the reader reports that)."""
    try:
        with (gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")) as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except (OSError, EOFError):
        return False
    return head.startswith(prefix)


def _turn_text(turn: Any) -> str | None:
    if isinstance(turn, str):
        return turn
    if isinstance(turn, dict):
        for key in TURN_FIELDS:
            if isinstance(turn.get(key), str):
                return turn[key]
    return None


def _open_table(path: Path):
    """Column names and a ``batches(column)`` iterator factory for a Parquet or Arrow IPC file."""
    import pyarrow as pa

    if path.name.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        return list(pf.schema_arrow.names), lambda col: pf.iter_batches(columns=[col], batch_size=1024)
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_file(source)
        return list(reader.schema.names), lambda col: (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        source.seek(0)  # not the IPC file format; Hugging Face datasets write the stream format
        stream = pa.ipc.open_stream(source)
        return list(stream.schema.names), lambda col: iter(stream)


# ----------------------------------------------------------------- tokenizing
def batched_texts(texts: Iterable[str], *, max_docs: int = 256, max_chars: int = 1_000_000) -> Iterator[list[str]]:
    """Group documents into batches of at most ``max_docs`` documents or about ``max_chars`` characters.

    Batches are big enough for the tokenizer's thread pool to pay off and small
    enough that one batch's token arrays stay a few MB.
    """
    batch: list[str] = []
    chars = 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if len(batch) >= max_docs or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def prepare_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer itself, or a copy with truncation and padding off (they would corrupt a datastore)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of each text as int32 arrays (no special tokens added), tokenized in parallel.

    ``tokenizer`` should have gone through :func:`prepare_tokenizer`.

    Example:
        >>> [a.tolist() for a in encode_texts(tok, ["a b", "b"])]     # doctest: +SKIP
        [[0, 1], [1]]
    """
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # _fast skips offsets
    return [np.asarray(e.ids, dtype=np.int32) for e in encode(list(texts), add_special_tokens=False)]
