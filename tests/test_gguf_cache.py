"""lookupdec.gguf_cache: a GGUF's config and tokenizer saved after the first load, read back only when they behave alike."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from lookupdec import gguf_cache
from lookupdec.models import embedded_model_file

QUESTIONS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "spec_bench_question.jsonl")


def _entries(root):
    return sorted((root / "gguf").glob("*/config.json"))


def _gguf_reads(monkeypatch):
    """Record every tokenizer or config that transformers builds from a GGUF file (the real call runs)."""
    from transformers import AutoConfig, AutoTokenizer

    seen = []
    for cls in (AutoConfig, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def spy(klass, *a, _original=original, **k):
            if k.get("gguf_file"):
                seen.append(klass.__name__)
            return _original(klass, *a, **k)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return seen


def test_the_key_follows_the_file_its_size_and_time(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"\0" * 60)
    shutil.copy(a, b)
    key = gguf_cache._key(str(a))
    assert gguf_cache._key(str(a)) == key and gguf_cache._key(str(b)) != key  # another path
    os.utime(a, ns=(1, 1))
    assert gguf_cache._key(str(a)) != key  # touched


@pytest.mark.slow
def test_a_second_load_reads_the_cache_and_tokenizes_every_question_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    path = embedded_model_file()
    built_config, built = gguf_cache.config_and_tokenizer(path)
    assert len(_entries(tmp_path)) == 1
    seen = _gguf_reads(monkeypatch)
    config, cached = gguf_cache.config_and_tokenizer(path)
    assert seen == []  # nothing was built from the GGUF file the second time
    assert config.to_dict() == built_config.to_dict() and cached.name_or_path == built.name_or_path
    with open(QUESTIONS) as f:
        turns = [t for line in f for t in json.loads(line)["turns"]]
    assert len(turns) == 560  # 480 questions, 80 of them with a second turn
    for text in turns:
        ids = built.encode(text, add_special_tokens=False)
        assert cached.encode(text, add_special_tokens=False) == ids
        chat = [{"role": "user", "content": text}]
        assert (cached.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
                == built.apply_chat_template(chat, tokenize=True, add_generation_prompt=True))
        assert cached.decode(ids) == built.decode(ids)


@pytest.mark.slow
def test_a_damaged_entry_is_read_from_the_file_again_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    path = embedded_model_file()
    _, built = gguf_cache.config_and_tokenizer(path)
    (entry,) = _entries(tmp_path)
    (entry.parent / "tokenizer.json").write_text("{not json")
    seen = _gguf_reads(monkeypatch)
    _, again = gguf_cache.config_and_tokenizer(path)
    assert "AutoTokenizer" in seen  # built from the file again
    assert again.encode("Hello  wörld 🙂") == built.encode("Hello  wörld 🙂")
    json.loads((entry.parent / "tokenizer.json").read_text())  # rewritten whole
    assert _entries(tmp_path) == [entry]


@pytest.mark.slow
def test_a_tokenizer_that_reads_back_differently_is_not_cached(tmp_path, monkeypatch):
    # Stands for a transformers release whose saved files lose a setting: here the chat template.
    from transformers import PreTrainedTokenizerBase

    original = PreTrainedTokenizerBase.save_pretrained

    def lossy(self, directory, *a, **k):
        out = original(self, directory, *a, **k)
        for name in ("chat_template.jinja", "chat_template.json"):
            if os.path.exists(os.path.join(directory, name)):
                os.remove(os.path.join(directory, name))
        cfg = os.path.join(directory, "tokenizer_config.json")
        data = json.load(open(cfg))
        data.pop("chat_template", None)
        json.dump(data, open(cfg, "w"))
        return out

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", lossy)
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    _, tok = gguf_cache.config_and_tokenizer(embedded_model_file())
    assert tok.chat_template  # the caller still gets the tokenizer built from the file
    assert _entries(tmp_path) == [] and not any((tmp_path / "gguf").glob(".tmp-*"))


@pytest.mark.slow
def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "file"))
    config, tok = gguf_cache.config_and_tokenizer(embedded_model_file())
    assert config.vocab_size == 49152 and tok.eos_token_id is not None


@pytest.mark.slow
def test_a_first_load_parses_the_file_once_and_builds_what_transformers_builds(tmp_path, monkeypatch):
    """Cold, the config and the tokenizer are built from one ``GGUFReader`` of the file (transformers' two
    loaders parse it once each otherwise); they behave as those two loaders' own, the slow oracle here."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    path = embedded_model_file()
    source, name = os.path.dirname(path), os.path.basename(path)
    parsed = []
    original = gguf.GGUFReader

    def counting(p, *a, **k):
        parsed.append(os.path.abspath(str(p)))
        return original(p, *a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    config, tokenizer = gguf_cache.config_and_tokenizer(path)
    assert parsed == [os.path.abspath(path)]
    assert gguf.GGUFReader is counting  # put back after the block
    parsed.clear()
    want = (AutoConfig.from_pretrained(source, gguf_file=name), AutoTokenizer.from_pretrained(source, gguf_file=name))
    assert len(parsed) == 2  # the oracle: each loader parses the file itself
    assert gguf_cache._behaviour(config, tokenizer) == gguf_cache._behaviour(*want)
