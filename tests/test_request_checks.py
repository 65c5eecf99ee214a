"""A request's text and callbacks, and a Decoder's settings, are checked with the input named, before any model work."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from lookupdec.decoder import Decoder
from tests.conftest import tiny_loaded

LONE = "ab \udcff"  # a lone surrogate: what surrogateescape decoding or JSON's "\udcff" gives


@pytest.fixture(scope="module")
def dec():
    return Decoder(tiny_loaded(0))


@pytest.mark.parametrize("where, kwargs", [
    ("the prompt", dict(prompt=LONE)),
    ("message 1's content", dict(prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": LONE}])),
    ("references\\[1\\]", dict(references=["fine", LONE])),
    ("prediction", dict(prediction=LONE)),
    ("stop\\[0\\]", dict(stop=LONE)),
])
def test_text_that_is_not_valid_unicode_is_refused_by_name(dec, monkeypatch, where, kwargs):
    calls = []
    monkeypatch.setattr(dec.verifier, "prefill", lambda *a, **k: calls.append(1))
    kwargs = {"prompt": "hello", "method": "auto", **kwargs}
    with pytest.raises(ValueError, match=f"{where} is not valid Unicode .*character 3.*UTF-8"):
        dec.generate(kwargs.pop("prompt"), max_new_tokens=4, **kwargs)
    assert not calls  # refused before the prompt's forward


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": 5}], "message 0's content must be a string, got int"),
    ([{"role": "user", "content": "x"}, {"role": None, "content": "y"}], "message 1's role must be a string"),
])
def test_chat_messages_of_the_wrong_types_are_refused_by_name(dec, messages, message):
    with pytest.raises(TypeError, match=message):
        dec.generate(messages, max_new_tokens=4)


def test_a_chat_template_that_cannot_render_the_messages_is_a_value_error_naming_it():
    lm = tiny_loaded(0)
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = "{% for m in messages %}{{ raise_exception('only text turns') }}{% endfor %}"
    lm = dataclasses.replace(lm, tokenizer=tok)
    with pytest.raises(ValueError, match="chat template cannot render these messages.*only text turns"):
        Decoder(lm).generate([{"role": "user", "content": [{"type": "text", "text": "x"}]}], max_new_tokens=2)


def test_stop_strings_and_on_text_of_the_wrong_types_are_refused(dec):
    with pytest.raises(TypeError, match=r"stop\[1\] is a NoneType"):
        dec.generate("hello", max_new_tokens=4, stop=["ok", None])
    with pytest.raises(TypeError, match="stop must be a string or a list of strings, got int"):
        dec.generate("hello", max_new_tokens=4, stop=5)  # was "'int' object is not iterable"
    with pytest.raises(TypeError, match="on_text must be a function"):
        dec.generate("hello", max_new_tokens=4, on_text="print")
    # Valid ones still run: a stop string that ends the text, and a callback that sees every piece.
    pieces: list[str] = []
    out = dec.generate("hello", method="ar", max_new_tokens=12, on_text=pieces.append)
    assert "".join(pieces) == out.text


@pytest.mark.parametrize("kwargs, error, message", [
    # 10**9 was a 512 GB allocation at the first step.
    (dict(draft_budget=10 ** 9), ValueError, "draft_budget must be an integer from 0 to 1024"),
    (dict(draft_budget=-1), ValueError, "draft_budget must be an integer from 0 to 1024"),
    (dict(cost_curve={"1": 30.0}), TypeError, "cost_curve must be a lookupdec.costs.CostCurve"),
    (dict(indexes=5), TypeError, "indexes takes index directories"),
    (dict(indexes=["ok", None]), TypeError, "indexes takes index directories"),
    # A string is truthy: "no" would have switched transformers' kernels on.
    (dict(hf_kernels="no"), TypeError, "hf_kernels must be True or False, got 'no'"),
    (dict(fast_kernels="no"), TypeError, "fast_kernels must be True or False, got 'no'"),
    (dict(tree_masks="no"), TypeError, "tree_masks must be True or False or None, got 'no'"),
    # 0 was taken for "the default budget", -3 passed on to the store.
    (dict(history_budget=0), ValueError, "history_budget must be an integer >= 1"),
    (dict(history_budget=-3), ValueError, "history_budget must be an integer >= 1"),
    (dict(history_budget=2.5), ValueError, "history_budget must be an integer >= 1"),
    # A number was taken for a hub id ('5') and reached the network.
    (dict(draft_model=5), TypeError, "a model is a model id, a directory or a .gguf path"),
    (dict(cost_refresh="sometimes"), ValueError, "cost_refresh must be 'fit', 'measure' or 'off'"),
])
def test_decoder_settings_of_the_wrong_kind_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        Decoder(tiny_loaded(0), **kwargs)


def test_a_bad_cost_refresh_is_refused_before_the_model_loads(tmp_path):
    # It was checked after loading: a missing model was reported instead, or the model loaded for nothing.
    with pytest.raises(ValueError, match="cost_refresh must be"):
        Decoder(str(tmp_path / "no-such-model"), cost_refresh="sometimes")


@pytest.mark.parametrize("kwargs, message", [
    # Strings were converted silently ("0.5" sampled); a float top_k was truncated.
    (dict(temperature="0.5"), "temperature must be a number, got '0.5'"),
    (dict(temperature=True), "temperature must be a number, got True"),
    (dict(top_p="0.9"), "top_p must be a number, got '0.9'"),
    (dict(top_k=2.5), "top_k must be an integer, got 2.5"),
    (dict(top_k="3"), "top_k must be an integer, got '3'"),
])
def test_sampling_settings_that_are_not_numbers_are_refused_by_name(dec, monkeypatch, kwargs, message):
    calls = []
    monkeypatch.setattr(dec.verifier, "prefill", lambda *a, **k: calls.append(1))
    with pytest.raises(TypeError, match=message):
        dec.generate("hello", max_new_tokens=4, **kwargs)
    assert not calls


def test_switches_given_as_strings_are_refused_before_any_work(dec, monkeypatch):
    calls = []
    monkeypatch.setattr(dec.verifier, "prefill", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(dec, "remember", lambda *a: calls.append(2))
    # "no" is truthy: it would have applied the chat template / written the output to the history.
    with pytest.raises(TypeError, match="chat_template must be True or False, got 'no'"):
        dec.generate("hello", max_new_tokens=4, chat_template="no")
    with pytest.raises(TypeError, match="remember must be True or False, got 'no'"):
        dec.generate("hello", max_new_tokens=4, remember="no")
    with pytest.raises(TypeError, match="remember must be True or False, got 0"):
        dec.generate_batch(["a", "b"], max_new_tokens=4, remember=0)
    assert not calls


def test_numpy_numbers_are_sampling_settings_like_python_ones(dec):
    import numpy as np

    plain = dec.generate("hello", method="ar", max_new_tokens=6, temperature=0.75, top_p=0.9, top_k=5, seed=3)
    numpy = dec.generate("hello", method="ar", max_new_tokens=6, temperature=np.float32(0.75), top_p=np.float64(0.9),
                         top_k=np.int64(5), seed=3)
    assert numpy.token_ids == plain.token_ids


def test_generate_batch_refuses_what_is_not_a_list_of_prompts_and_checks_on_result_first(dec):
    for prompts in ("abc", None, 5):  # a string was three one-character prompts; None a bare TypeError
        with pytest.raises(TypeError, match="prompts must be a list of prompts"):
            dec.generate_batch(prompts, max_new_tokens=2)
    with pytest.raises(TypeError, match="references must be a list with one entry per prompt"):
        dec.generate_batch([[5, 6], [7, 8]], references="ab", max_new_tokens=2)
    seen = []
    with pytest.raises(TypeError, match="on_result must be a function"):
        dec.generate_batch([[5, 6], [7, 8]], on_result=5, max_new_tokens=2, method="ar")
    dec.generate_batch([[5, 6]], on_result=lambda i, r: seen.append(i), max_new_tokens=2, method="ar")
    assert seen == [0]


def test_a_batch_seed_near_the_top_wraps_for_later_prompts_instead_of_failing(dec):
    prompts = [[5, 6, 7], [8, 9, 10]]
    top = 2 ** 64 - 1
    out = dec.generate_batch(prompts, method="ar", max_new_tokens=8, temperature=0.9, seed=top)
    alone = [dec.generate(p, method="ar", max_new_tokens=8, temperature=0.9, seed=s) for p, s in zip(prompts, (top, 0))]
    assert [r.token_ids for r in out] == [r.token_ids for r in alone]
