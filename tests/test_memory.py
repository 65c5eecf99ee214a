"""The fast backend never keeps a second copy of an owned model, and never changes a caller's model."""
from __future__ import annotations

import pytest
import torch

from lookupdec.decoder import Decoder
from lookupdec.fast_forward import FastForward
from lookupdec.models import LoadedModel
from tests.conftest import char_tokenizer, save_tiny, tiny_loaded, tiny_model

pytestmark = pytest.mark.cpu  # the fast backend's memory (CPU only)


def snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [(name, type(m).__name__) for name, m in model.named_modules()])


def assert_unchanged(model, before):
    state, modules = before
    now = model.state_dict()
    assert now.keys() == state.keys()
    assert all(torch.equal(now[k], state[k]) for k in state)
    assert [(name, type(m).__name__) for name, m in model.named_modules()] == modules


def test_a_callers_llama_model_is_not_changed_by_the_fast_backend():
    lm = tiny_loaded(0)
    before = snapshot(lm.model)
    dec = Decoder(lm, hf_kernels=False)
    assert dec.verifier.backend == "fast"
    dec.generate([5, 6, 7, 5, 6], method="pld", max_new_tokens=20)
    assert_unchanged(lm.model, before)


def test_a_callers_model_that_runs_transformers_forward_is_not_repacked():
    """A sliding-window Mistral (not for the fast forward): its nn.Linear modules stay nn.Linear."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256, sliding_window=16, eos_token_id=2)).eval()
    before = snapshot(model)
    dec = Decoder(LoadedModel(model, char_tokenizer(), "tiny-mistral", (2,), 256), hf_kernels=False)
    assert dec.verifier.backend == "hf" and not dec.fast_kernels
    dec.generate([5, 6, 7], method="pld", max_new_tokens=20)
    assert_unchanged(model, before)


def test_a_model_the_decoder_loads_keeps_one_copy_of_its_weights_and_decodes_the_same(tmp_path):
    owned = Decoder(save_tiny(tmp_path, 0))  # loaded here: the fast forward holds the only copy of the projections
    assert owned.verifier.backend == "fast"
    kept = tiny_model(0)
    linear = sum(p.numel() for name, p in kept.named_parameters() if "proj" in name or "lm_head" in name)
    total = sum(p.numel() for p in kept.parameters())
    assert sum(p.numel() for p in owned.model.parameters()) == total - linear
    # The same kernels on a caller's copy (nothing released): the same greedy tokens.
    ref = Decoder(LoadedModel(kept, char_tokenizer(), "kept", (2,), 256))
    prompt = [5, 6, 7, 8, 5, 6]
    for method in ("ar", "pld"):
        assert owned.generate(prompt, method=method, max_new_tokens=30).token_ids == \
            ref.generate(prompt, method=method, max_new_tokens=30).token_ids


def test_rotary_tables_grow_as_positions_need():
    ff = FastForward(tiny_model(0, max_positions=4096))
    start = ff._cos.shape[0]
    assert start <= 1024  # not the whole 4096-position context up front
    cache = ff.new_cache(8)
    ff.forward(cache, torch.tensor([5]), torch.tensor([3000]), None, [0])
    assert ff._cos.shape[0] > 3000
