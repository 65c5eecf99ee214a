"""Tokenizer loading without torch, fingerprints, and the exported default tokenizer."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from lookupdec.errors import ModelLoadError
from lookupdec.tokenizer import DEFAULT_GGUF, DEFAULT_PACKAGE, load_tokenizer, resolve_tokenizer, tokenizer_fingerprint
from tests.index_fixtures import tiny_tokenizer


def test_fingerprint_depends_on_vocab_only_and_every_form_agrees():
    tok = tiny_tokenizer()
    fp = tokenizer_fingerprint(tok)
    assert len(fp) == 64
    assert tokenizer_fingerprint(tok.get_vocab(with_added_tokens=True)) == fp  # a plain mapping
    # Same vocabulary, different insertion order and pre-tokenizer: same identity.
    same = tiny_tokenizer()
    same.pre_tokenizer = None
    assert tokenizer_fingerprint(same) == fp
    # One id moved: a different vocabulary.
    words = "the cat sat on mat dog ran to a park and then home def return x y else if".split()
    assert tokenizer_fingerprint(tiny_tokenizer(words)) != fp


def test_fingerprint_rejects_non_tokenizers():
    with pytest.raises(TypeError, match="cannot fingerprint int"):
        tokenizer_fingerprint(3)


def test_loads_tokenizer_json_file_and_directory(tmp_path):
    tok = tiny_tokenizer()
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    for source in (tmp_path / "model" / "tokenizer.json", tmp_path / "model", str(tmp_path / "model")):
        loaded = resolve_tokenizer(source)
        assert loaded.fingerprint == tokenizer_fingerprint(tok)
        assert loaded.vocab_size == tok.get_vocab_size()
        assert loaded.name == str(source)
        assert loaded.tokenizer.encode("the cat", add_special_tokens=False).ids == [1, 2]


def test_unknown_hub_id_is_a_clear_error_without_download(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty hub cache
    with pytest.raises(ModelLoadError, match=r"'nobody/no-such-model' is neither a local file .* never downloads"):
        load_tokenizer("nobody/no-such-model")


def test_directory_without_tokenizer_and_bad_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="holds no tokenizer"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read tokenizer file"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_loading_a_tokenizer_json_does_not_import_torch(tmp_path):
    tiny_tokenizer().save(str(tmp_path / "tokenizer.json"))
    code = textwrap.dedent(f"""
        import sys
        from lookupdec.tokenizer import load_tokenizer
        tok = load_tokenizer({str(tmp_path / 'tokenizer.json')!r})
        assert tok.encode("the cat", add_special_tokens=False).ids == [1, 2]
        assert "torch" not in sys.modules and "transformers" not in sys.modules, "torch was imported"
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_exported_default_tokenizer_encodes_like_transformers_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "cache"))
    loaded = resolve_tokenizer(None)
    cached = list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))
    assert len(cached) == 1  # exported once, into the cache named by LOOKUPDEC_CACHE
    assert loaded.vocab_size == 49152
    # The export ran in a child process: loading the default never imports torch here.
    code = ("import sys; from lookupdec.tokenizer import load_tokenizer; load_tokenizer(); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "LOOKUPDEC_CACHE": str(tmp_path / "cache")})

    from transformers import AutoTokenizer

    loc = importlib.util.find_spec(DEFAULT_PACKAGE).submodule_search_locations[0]
    hf = AutoTokenizer.from_pretrained(loc, gguf_file=DEFAULT_GGUF)
    samples = [
        "Hello world!",
        "def f(x):\n    return x ** 2  # square\n",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "  leading spaces, ünïcödé, emoji 🙂 and\ttabs\n\n",
        "",
    ]
    for text in samples:
        assert loaded.tokenizer.encode(text, add_special_tokens=False).ids == hf.encode(text, add_special_tokens=False), text
    assert tokenizer_fingerprint(hf) == loaded.fingerprint  # the index check accepts the model's own tokenizer
    # A second load reads the cache (no second export).
    assert resolve_tokenizer(None).fingerprint == loaded.fingerprint
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))) == 1
