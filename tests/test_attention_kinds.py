"""Sliding-window and hybrid attention decode exactly; recurrent layers are refused before any work."""
from __future__ import annotations

import pytest
import torch

from lookupdec.decoder import Decoder
from lookupdec.errors import ModelLoadError
from lookupdec.models import LoadedModel
from tests.conftest import FLAT, char_tokenizer, hf_greedy

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, attn_implementation="sdpa")


def mistral_window_16(seed):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(sliding_window=16, **SMALL)).eval()


def qwen2_hybrid(seed):
    """Layer 0 full attention, layer 1 a 16-token sliding window (``layer_types``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(sliding_window=16, use_sliding_window=True, max_window_layers=1,
                                         **SMALL)).eval()
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    return model


# Unscaled random weights (near-ties kept); seeds whose greedy output runs the whole 60 tokens.
@pytest.mark.parametrize("make,seed", [(mistral_window_16, 1), (mistral_window_16, 3), (qwen2_hybrid, 1), (qwen2_hybrid, 4)])
def test_decoding_far_past_the_window_equals_transformers(make, seed):
    model = make(seed)
    prompt = list(range(3, 40))  # 37 tokens: already past the 16-token window
    ref = hf_greedy(model, prompt, 60)
    assert len(ref) == 60
    lm = LoadedModel(model, char_tokenizer(), make.__name__, (2,), 256)
    for fast in (True, False):
        dec = Decoder(lm, hf_kernels=not fast, cost_curve=FLAT)
        for method in ("ar", "pld", "auto"):
            out = dec.generate(prompt, method=method, max_new_tokens=60)
            assert list(out.token_ids) == ref, (method, fast)


def test_models_with_recurrent_layers_are_refused_before_any_work():
    from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

    mamba = MambaForCausalLM(MambaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2)).eval()
    with pytest.raises(ModelLoadError, match="model_type 'mamba' keeps a recurrent state.*rejected draft"):
        Decoder(LoadedModel(mamba, char_tokenizer(), "tiny-mamba", (2,), 256))
    # A layer_types list with a kind that is not cache rows.
    llama = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    llama.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ModelLoadError, match="linear_attention"):
        Decoder(LoadedModel(llama, char_tokenizer(), "tiny-linear", (2,), 256))
