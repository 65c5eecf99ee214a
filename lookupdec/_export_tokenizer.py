"""Export a model's fast tokenizer to one ``tokenizer.json`` (run as a subprocess).

``lookupdec.tokenizer`` must not import torch, but turning a GGUF file (or a
directory holding only slow-tokenizer files) into a fast tokenizer needs
transformers, which imports torch. So that conversion runs here, in a child
process, once; the result is cached and later loads read the JSON directly.

Usage::

    python -m lookupdec._export_tokenizer --source DIR [--gguf-file NAME] --out PATH

The output is written to a temporary file next to ``PATH`` and renamed, so a
reader never sees a half-written file. Nothing is downloaded: the hub is put
in offline mode before transformers is imported.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile


def export(source: str, out: str, gguf_file: str | None = None) -> None:
    """Convert the tokenizer at ``source`` (with ``gguf_file``) to ``out`` (tokenizer.json).

    Raises:
        RuntimeError: the tokenizer has no fast (Rust) backend to export.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    kwargs = {"local_files_only": True}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tok = AutoTokenizer.from_pretrained(source, **kwargs)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise RuntimeError(f"the tokenizer at {source} has no fast backend to export")
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json.tmp", dir=out_dir)
    os.close(fd)
    try:
        backend.save(tmp)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="local model directory")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --source")
    parser.add_argument("--out", required=True, help="where to write tokenizer.json")
    args = parser.parse_args(argv)
    try:
        export(args.source, args.out, args.gguf_file)
    except Exception as exc:  # reported to the parent process through stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
