"""Model loading and prompt encoding."""
from __future__ import annotations

import pytest

from lookupdec.decoder import Decoder
from lookupdec.errors import ContextTooLongError, ModelLoadError
from lookupdec.models import load_model
from lookupdec.prompts import encode_prompt
from tests.conftest import char_tokenizer, save_tiny, tiny_loaded, tiny_model


def test_encode_prompt_forms():
    tok = char_tokenizer()
    assert encode_prompt(tok, [7, 8, 9]) == [7, 8, 9]
    templ = tok.decode(encode_prompt(tok, "hi"))
    assert templ == "<s>user: hi\n<s>assistant: "
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert tok.decode(encode_prompt(tok, msgs)) == "<s>system: s\n<s>user: u\n<s>assistant: "
    assert tok.decode(encode_prompt(tok, "hi", chat_template=False)) == "hi"
    with pytest.raises(TypeError, match="got float"):
        encode_prompt(tok, 3.5)
    with pytest.raises(ValueError, match="empty"):
        encode_prompt(tok, [])


def test_token_ids_may_come_as_numpy_or_torch_integers():
    from types import SimpleNamespace

    import numpy as np
    import torch

    tok = char_tokenizer()
    for ids in [np.array([7, 8, 9]), np.array([7, 8, 9], np.uint16), torch.tensor([7, 8, 9]),
                [np.int64(7), np.int32(8), 9], (7, 8, 9)]:
        out = encode_prompt(tok, ids)
        assert out == [7, 8, 9] and all(type(t) is int for t in out), ids
    with pytest.raises(TypeError, match=r"must be 1-D, got 2 dimensions; pass one row"):
        encode_prompt(tok, torch.tensor([[7, 8, 9]]))  # what tokenizer(..., return_tensors="pt") gives
    for bad in [np.array([7.0, 8.0]), [7, 8.5], [True, False], torch.tensor([1.0]), SimpleNamespace(ndim=1)]:
        with pytest.raises(TypeError, match="token ids"):
            encode_prompt(tok, bad)


def test_local_directory_round_trip(tmp_path):
    model = tiny_model(0)
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert lm.eos_ids == (2,)
    assert lm.max_context == 256
    assert next(lm.model.parameters()).dtype.is_floating_point


def test_missing_models_give_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope.gguf"))
    # A file that is neither a directory nor named .gguf is named as such, not as a missing directory.
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ModelLoadError, match=r"model\.bin' is a file, not a model directory.*end in \.gguf"):
        load_model(str(weights))
    # A hub id that is not cached is never downloaded.
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_model("lookupdec-test/definitely-not-cached-model")
    with pytest.raises(ValueError, match="dtype"):
        load_model(None, dtype="int3")


@pytest.mark.slow
def test_a_truncated_gguf_file_is_named_damaged_not_missing_from_a_cache(tmp_path, monkeypatch):
    from lookupdec.models import embedded_model_file

    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "cache"))
    with open(embedded_model_file(), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(60_000_000))  # the header whole, the tensors cut short
    with pytest.raises(ModelLoadError, match="cut.gguf.*damaged or truncated.*fetch it again") as info:
        load_model(str(tmp_path / "cut.gguf"))
    assert "Hugging Face cache" not in str(info.value)


def test_devices_this_machine_lacks_are_refused_before_loading(tmp_path):
    import torch

    from lookupdec.models import check_device

    assert check_device("cpu") == "cpu"
    with pytest.raises(ModelLoadError, match="not a torch device.*cpu or cuda:0"):
        load_model(str(tmp_path / "never-read"), device="gpu")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ModelLoadError, match="cuda"):
        check_device(f"cuda:{n}")  # one past the last device (the first when there is none)


def test_prompt_longer_than_context_is_refused():
    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    with pytest.raises(ContextTooLongError, match=r"250 tokens.*max_new_tokens is 10.*256.*max_new_tokens to at most 6") as err:
        dec.generate([5, 6, 7, 8, 9] * 50, method="ar", max_new_tokens=10)
    # The lengths travel with the error, for callers that word it in their own terms (the server).
    assert (err.value.prompt_tokens, err.value.max_new_tokens, err.value.max_context) == (250, 10, 256)
    with pytest.raises(ContextTooLongError, match=r"260 tokens.*shorten the prompt to fewer than 256 tokens"):
        dec.generate([5, 6, 7, 8, 9] * 52, method="ar", max_new_tokens=1)  # no max_new_tokens would fit
    out = dec.generate([5, 6, 7, 8, 9] * 50, method="ar", max_new_tokens=6)
    assert out.new_tokens <= 6


def test_stop_strings_and_streaming():
    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    full = dec.generate("ab", method="ar", max_new_tokens=40)
    assert len(full.text) > 6
    stop = full.text[4:6]
    pieces = []
    out = dec.generate("ab", method="ar", max_new_tokens=40, stop=[stop], on_text=pieces.append)
    cut = full.text.find(stop)
    assert out.text == full.text[:cut] and out.stop_reason == "stop"
    assert "".join(pieces) == out.text
    assert out.token_ids == full.token_ids[:len(out.token_ids)]
    streamed = []
    out2 = dec.generate("ab", method="ar", max_new_tokens=40, on_text=streamed.append)
    assert "".join(streamed) == out2.text == full.text


@pytest.mark.slow
def test_embedded_model_greedy_pld_equals_ar_and_transformers(real_loaded):
    import torch

    prompts = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat.",
               "Write a Python function that returns the sum of a list."]
    plain = Decoder(real_loaded, hf_kernels=True)
    fast = Decoder(real_loaded, hf_kernels=False)
    accepted = 0
    for p in prompts:
        ids = plain.encode(p)
        with torch.no_grad():
            ref = real_loaded.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                             max_new_tokens=32, do_sample=False, top_p=None, top_k=None, temperature=None)
        ref_ids = tuple(ref[0, len(ids):].tolist())
        # transformers' kernels: ar and pld both equal transformers' greedy generate().
        assert plain.generate(p, method="ar", max_new_tokens=32).token_ids == ref_ids
        pld = plain.generate(p, method="pld", max_new_tokens=32)
        assert pld.token_ids == ref_ids
        # The fast kernels: pld equals ar run with the same kernels.
        fast_ar = fast.generate(p, method="ar", max_new_tokens=32)
        assert fast.generate(p, method="pld", max_new_tokens=32).token_ids == fast_ar.token_ids
        accepted += sum(s.accepted for s in pld.step_stats)
    assert accepted > 0  # pld really drafted and had drafts accepted (the first prompt repeats itself)


def test_a_missing_optional_package_is_a_message(monkeypatch):
    import lookupdec.models as models
    from lookupdec.errors import ModelLoadError

    def no_gguf(path, config, dtype, defer=False):
        raise ModuleNotFoundError("No module named 'gguf'", name="gguf")

    monkeypatch.setattr(models, "_load_gguf", no_gguf)
    with pytest.raises(ModelLoadError, match=r"needs a Python package that is not installed \(gguf\).*pip install gguf"):
        models.load_model()


def test_the_module_level_decoder_cache_is_bounded(tmp_path, monkeypatch):
    import lookupdec.oneshot as decoder_mod

    dirs = []
    for seed in range(3):
        dirs.append(save_tiny(tmp_path / f"m{seed}", seed))
    monkeypatch.setattr(decoder_mod, "_DEFAULT", decoder_mod.OrderedDict())
    for d in dirs + [dirs[0]]:
        decoder_mod.generate([5, 6], model=d, method="ar", max_new_tokens=2)
    kept = [k[0] for k in decoder_mod._DEFAULT]
    assert len(kept) == decoder_mod.DEFAULT_CACHE_SIZE == 2 and kept == [dirs[2], dirs[0]]  # LRU order


def test_the_default_device_comes_from_lookupdec_device_when_set(monkeypatch, tmp_path):
    import torch

    from lookupdec.models import check_device

    monkeypatch.setenv("LOOKUPDEC_DEVICE", "cpu")
    assert check_device(None) == "cpu"
    assert check_device("meta") == "meta"  # a device named outright wins over the variable
    monkeypatch.setenv("LOOKUPDEC_DEVICE", "gpu")
    with pytest.raises(ModelLoadError, match="LOOKUPDEC_DEVICE=.gpu. is not a torch device.*cpu or cuda:0"):
        load_model(str(tmp_path / "never-read"))
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    monkeypatch.setenv("LOOKUPDEC_DEVICE", f"cuda:{n}")
    with pytest.raises(ModelLoadError, match=f"LOOKUPDEC_DEVICE='cuda:{n}' asked for"):
        check_device(None)
    monkeypatch.delenv("LOOKUPDEC_DEVICE")
    assert check_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
