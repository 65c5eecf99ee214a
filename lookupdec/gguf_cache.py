"""A GGUF model's transformers config and tokenizer, kept as plain files after the first load.

transformers builds both from the GGUF metadata, each of its two loaders parsing the whole of it
(for the embedded model about 2 s apiece, most of it the vocabulary and its merges). The first
load shares one parse between them (``_one_reader``: 7.2 -> 4.75 s for the embedded model) and
saves what it built under::

    $LOOKUPDEC_CACHE/gguf/<key>/      (else ~/.cache/lookupdec/gguf/<key>/; XDG_CACHE_HOME respected)

where ``<key>`` (``lookupdec.tokenizer.source_key``) hashes the file's path, size and modification
time and the versions of transformers and tokenizers, so a changed file or another release builds
them again. An entry is written only if what reads back from it behaves as what was built: the
same config, vocabulary, special tokens, chat template, and the same ids and text for ``PROBES``
(with and without special tokens, and through the chat template). Otherwise, or where the cache cannot be written, every load reads
the file as before. An entry that no longer loads is rebuilt.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from lookupdec.tokenizer import cache_root, source_key

log = logging.getLogger(__name__)

CACHE_VERSION = 1
# Text a tokenizer read back from the cache must split and join exactly as the one built from the file.
PROBES = (
    "Hello world!",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\r\nwindows line",
    "  leading spaces, ünïcödé, emoji 🙂, CJK 日本語, Ελληνικά and \u00a0no-break space",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|endoftext|>",
    "<s></s><unk><pad>[INST] numbers 1234567890 3.14159e-10 0x1F and symbols ~!@#$%^&*()_+{}|:\"<>?",
    "",
)
_CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, ünïcödé 🙂"},
                 {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again?"}]


def _key(path: str) -> str:
    import tokenizers
    import transformers

    return source_key(Path(path), f"gguf{CACHE_VERSION}|{transformers.__version__}|{tokenizers.__version__}")


def _read(directory, source: str):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    config._name_or_path = tokenizer.name_or_path = source  # as read from the file (cost curves key on it)
    return config, tokenizer


def _behaviour(config, tokenizer) -> tuple:
    """What a config and tokenizer must agree on to stand in for each other."""
    texts = []
    for text in PROBES:
        for special in (False, True):
            ids = tokenizer.encode(text, add_special_tokens=special)
            texts.append((ids, tokenizer.decode(ids), tokenizer.decode(ids, skip_special_tokens=True)))
    chat = None
    if tokenizer.chat_template:
        chat = (tokenizer.apply_chat_template(_CONVERSATION, tokenize=False, add_generation_prompt=True),
                tokenizer.apply_chat_template(_CONVERSATION[:2], tokenize=False, add_generation_prompt=False))
    special = {name: getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                                   "unk_token_id", "all_special_ids")}
    added = {i: str(t) for i, t in tokenizer.added_tokens_decoder.items()}
    return (config.to_dict(), type(tokenizer).__name__, tokenizer.get_vocab(), added, special,
            tokenizer.chat_template, chat, texts)


def _store(entry: Path, config, tokenizer, source: str) -> None:
    """Save ``config`` and ``tokenizer`` as ``entry`` if what reads back behaves the same; else nothing."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    try:
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if _behaviour(*_read(tmp, source)) != _behaviour(config, tokenizer):
            log.info("the config and tokenizer of %s do not read back alike from files: not cached", source)
            return
        shutil.rmtree(entry, ignore_errors=True)  # a damaged entry
        os.replace(tmp, entry)  # an entry appears whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _one_reader(path: str):
    """Within it, the ``gguf`` package's ``GGUFReader`` parses the file ``path`` once: transformers' config
    and tokenizer loaders each open their own reader of it (about 2 s apiece for the embedded model's
    metadata, most of it the 49,152-token vocabulary and its merges) and only read from it. Readers
    of any other file, or with other arguments, are built as usual; loaders that imported the class
    before the block keep their own (then nothing is shared, and nothing changes)."""
    import gguf

    original, target, shared = gguf.GGUFReader, os.path.abspath(path), []

    def reader(p, *args, **kwargs):
        if args or kwargs or os.path.abspath(str(p)) != target:
            return original(p, *args, **kwargs)
        if not shared:
            shared.append(original(p))
        return shared[0]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def config_and_tokenizer(path: str):
    """The transformers config and tokenizer of the GGUF file ``path``, from the cache when it has them.

    Returns:
        ``(config, tokenizer)``, equal in behaviour to ``AutoConfig`` / ``AutoTokenizer``
        ``.from_pretrained(dir, gguf_file=name)``.
    Raises:
        What those raise for the file (the cache itself never raises).
    """
    from transformers import AutoConfig, AutoTokenizer

    source, name = os.path.dirname(path), os.path.basename(path)
    entry = cache_root() / "gguf" / _key(path)
    if entry.is_dir():
        try:
            return _read(entry, source)
        except Exception as exc:  # noqa: BLE001  (a damaged or half-removed entry: read the file, write it again)
            log.info("cached config and tokenizer %s unreadable (%s): reading %s", entry, exc, path)
    with _one_reader(path):
        config = AutoConfig.from_pretrained(source, gguf_file=name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name, local_files_only=True)
    try:
        _store(entry, config, tokenizer, source)
    except Exception as exc:  # noqa: BLE001  (a read-only or full disk: load from the file every time)
        log.info("could not cache the config and tokenizer of %s: %s", path, exc)
    return config, tokenizer
