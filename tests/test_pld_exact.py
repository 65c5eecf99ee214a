"""PLD end to end: greedy output equals transformers' greedy generate().

Prompts are made repetitive (a random phrase repeated with noise) so that the
prompt-lookup drafter really drafts and gets tokens accepted; each test also
asserts that speculation happened, so a drafter that silently drafts nothing
cannot pass as "exact".
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.drafters.pld import PLDDrafter
from tests.conftest import EOS_ID, TINY_VOCAB, hf_greedy, tiny_loaded


def _repetitive_prompt(rng, phrase_len: int, repeats: int) -> list[int]:
    phrase = rng.integers(3, TINY_VOCAB, phrase_len).tolist()
    out: list[int] = []
    for _ in range(repeats):
        noisy = [t if rng.random() > 0.1 else int(rng.integers(3, TINY_VOCAB)) for t in phrase]
        out += noisy
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pld_matches_transformers_greedy_on_tiny_models(seed):
    lm = tiny_loaded(seed)
    dec = Decoder(lm, hf_kernels=True)  # default kernels: the reference is transformers itself
    rng = np.random.default_rng(seed)
    accepted = 0
    for phrase_len, repeats in ((6, 4), (15, 3), (3, 1)):
        prompt = _repetitive_prompt(rng, phrase_len, repeats)
        ref = hf_greedy(lm.model, prompt, 64)
        out = dec.generate(prompt, method="pld", max_new_tokens=64)
        assert list(out.token_ids) == ref, (seed, phrase_len, repeats)
        assert out.method == "pld"
        accepted += sum(s.accepted for s in out.step_stats)
    assert accepted > 0  # the drafter's tokens were really verified and kept


def test_pld_stops_exactly_at_max_new_tokens_and_eos():
    lm = tiny_loaded(1)
    rng = np.random.default_rng(7)
    prompt = _repetitive_prompt(rng, 8, 4)
    ref = hf_greedy(lm.model, prompt, 48)
    dec = Decoder(lm, hf_kernels=True)
    for limit in (1, 3, 17):
        out = dec.generate(prompt, method="pld", max_new_tokens=limit)
        assert list(out.token_ids) == ref[:limit] and out.stop_reason == "length"
    # Declare a token the model emits mid-output an EOS id: output ends on it.
    eos_tok = ref[12]
    first = ref.index(eos_tok)
    lm_eos = lm.__class__(lm.model, lm.tokenizer, lm.name, (EOS_ID, eos_tok), lm.max_context)
    out = Decoder(lm_eos, hf_kernels=True).generate(prompt, method="pld", max_new_tokens=48)
    assert list(out.token_ids) == ref[: first + 1] and out.stop_reason == "eos"


def test_pld_with_fast_kernels_equals_ar_with_fast_kernels():
    lm = tiny_loaded(2)
    dec = Decoder(lm, hf_kernels=False)
    rng = np.random.default_rng(11)
    for phrase_len, repeats in ((5, 5), (12, 2)):
        prompt = _repetitive_prompt(rng, phrase_len, repeats)
        ar = dec.generate(prompt, method="ar", max_new_tokens=64)
        pld = dec.generate(prompt, drafter=PLDDrafter(), max_new_tokens=64)
        assert pld.token_ids == ar.token_ids


@pytest.mark.slow
def test_pld_on_the_embedded_model_equals_transformers_greedy(real_loaded):
    """The real model, default kernels: pld, ar and transformers agree token for token."""
    dec = Decoder(real_loaded, hf_kernels=True)
    article = (
        "The city council met on Tuesday to discuss the new bridge. The new bridge will connect "
        "the north bank to the old market. Council members said the new bridge would cost less "
        "than the tunnel that was proposed last year."
    )
    for prompt in (f"Summarize: {article}", f"Repeat this text exactly: {article}"):
        ids = dec.encode(prompt)
        ref = hf_greedy(real_loaded.model, ids, 48, eos_id=list(real_loaded.eos_ids))
        pld = dec.generate(ids, method="pld", max_new_tokens=48)
        assert list(pld.token_ids) == ref
    assert pld.steps < pld.new_tokens  # copying the article: drafts were accepted
