"""The lean CPU forward (lookupdec/fast_forward.py) against transformers' forward.

Reference: the HF model's own forward with default kernels. Tolerances are
float rounding (different summation orders in fused products); exactness of
decoding is stated against ``ar`` through the same fast forward.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.decoder import Decoder
from lookupdec.fast_forward import FastForward
from lookupdec.fast_forward_support import fast_forward_unsupported_reason, supports_fast_forward
from lookupdec.kvcache import FlatKVCache, keep_rows
from lookupdec.models import LoadedModel
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier
from tests.conftest import EOS_ID, TINY_VOCAB, char_tokenizer, hf_greedy, tiny_model
from tests.test_decoder_exact import ContextDrafter, OracleDrafter, RandomDrafter

pytestmark = pytest.mark.cpu  # the fast forward is CPU-only

ATOL = 1e-4


def _scale(model):
    # As in conftest.tiny_model: larger weights make greedy choices decisive.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model.eval()


def tiny_qwen2(seed: int = 0):
    """A random Qwen2: q/k/v biases, tied embeddings, 3 layers, 6 heads over 2 KV heads."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0, tie_word_embeddings=True,
                      use_sliding_window=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = _scale(Qwen2ForCausalLM(cfg))
    with torch.no_grad():  # random nonzero biases (the init makes them zero)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


def tiny_llama3_rope(seed: int = 0):
    """A random Llama with 'llama3' rope scaling, tied embeddings and rms eps 1e-5."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                      rope_parameters=rope, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=EOS_ID,
                      pad_token_id=0, tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return _scale(LlamaForCausalLM(cfg))


MODELS = {"llama": lambda: tiny_model(1, layers=3), "qwen2": tiny_qwen2, "llama3-rope": tiny_llama3_rope}


def _loaded(model, name):
    return LoadedModel(model, char_tokenizer(), name, (EOS_ID,), model.config.max_position_embeddings)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _random_tree(rng, n):
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    return DraftTree(rng.integers(3, TINY_VOCAB, n), parents, np.ones(n, np.int64))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_fast_forward_equals_transformers(kind):
    """Prefill rows, width-1 steps and tree nodes all match the HF forward of the same sequence."""
    model = MODELS[kind]()
    assert supports_fast_forward(model), fast_forward_unsupported_reason(model)
    if kind == "llama3-rope":
        assert model.model.rotary_emb.rope_type == "llama3"
    ff = FastForward(model)
    rng = np.random.default_rng(7)
    seq = rng.integers(3, TINY_VOCAB, 60).tolist()
    ref = _hf_logits(model, seq)
    # Prefill of 40 rows (every row's logits), with a small cache that must grow.
    cache = ff.new_cache(8)
    got = ff.forward(cache, torch.tensor(seq[:40]), torch.arange(40), None, slice(0, 40), causal=True)
    torch.testing.assert_close(got, ref[:40], atol=ATOL, rtol=1e-5)
    # Width-1 steps, no mask: positions 40..49 (past the 'llama3' original context of 32).
    for p in range(40, 50):
        got = ff.forward(cache, torch.tensor([seq[p]]), torch.tensor([p]), None, [0])
        torch.testing.assert_close(got[0], ref[p], atol=ATOL, rtol=1e-5)
    assert cache.length == 50
    # Tree steps through the verifier: each node against the HF forward of its chain.
    verifier = TreeVerifier(model, fast=True)
    assert verifier.backend == "fast" and verifier.tree_masks
    for n in (1, 5, 14):
        cache = verifier.new_cache(16)
        verifier.prefill(cache, seq[:30])
        tree = _random_tree(rng, n)
        res = verifier.forward(cache, 30, seq[30], tree)
        assert res.logits.shape == (1 + n, TINY_VOCAB)
        torch.testing.assert_close(res.logits[0], ref[30], atol=ATOL, rtol=1e-5)
        for i in range(n):
            chain_ref = _hf_logits(model, seq[:31] + tree.path_tokens(i))[-1]
            torch.testing.assert_close(res.logits[1 + i], chain_ref, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_every_node_equals_its_chain_through_the_fast_forward(kind):
    """Tree property within one backend: node logits == the fast forward of its root-to-node chain."""
    model = MODELS[kind]()
    verifier = TreeVerifier(model, fast=True)
    for prompt, root, tree, res in verified_trees(verifier):
        for i in range(len(tree)):
            chain = [root] + tree.path_tokens(i)
            c2 = verifier.new_cache(64)
            verifier.prefill(c2, prompt)
            logits = verifier.fast.forward(c2, torch.tensor(chain), len(prompt) + torch.arange(len(chain)),
                                           None if len(chain) == 1 else _causal_bias(len(prompt), len(chain)),
                                           [len(chain) - 1])
            torch.testing.assert_close(res.logits[1 + i], logits[0], atol=ATOL, rtol=1e-5)


def verified_trees(verifier, seed: int = 3, sizes=(2, 9, 20)):
    """Random trees of ``sizes`` nodes verified on a random 17-token prompt: (prompt, root, tree, result)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, TINY_VOCAB, 17).tolist()
    root = int(rng.integers(3, TINY_VOCAB))
    for n in sizes:
        tree = _random_tree(rng, n)
        cache = verifier.new_cache(64)
        verifier.prefill(cache, prompt)
        yield prompt, root, tree, verifier.forward(cache, len(prompt), root, tree)


def _causal_bias(past, w):
    allowed = torch.ones(w, past + w, dtype=torch.bool)
    allowed[:, past:] = torch.tril(torch.ones(w, w, dtype=torch.bool))
    return torch.zeros(w, past + w).masked_fill_(~allowed, torch.finfo(torch.float32).min)


def test_commit_keeps_accepted_rows():
    """After a commit the flat cache equals the cache of the accepted chain prefilled causally."""
    model = tiny_model(2)
    verifier = TreeVerifier(model, fast=True)
    prompt = [5, 6, 7, 8, 9]
    tree = DraftTree.from_sequences([[10, 11, 12], [10, 13], [14, 15, 16, 17]])
    for nodes in [(), (0,), (0, 3), (4, 5, 6, 7), (0, 1, 2)]:
        cache = verifier.new_cache(8)
        verifier.prefill(cache, prompt)
        verifier.forward(cache, len(prompt), 4, tree)
        verifier.commit(cache, len(prompt), nodes)
        chain = prompt + [4] + [int(tree.tokens[i]) for i in nodes]
        assert cache.length == len(chain)
        ref = verifier.new_cache(8)
        verifier.prefill(ref, chain)
        torch.testing.assert_close(cache.kv[:, :, :, :len(chain)], ref.kv[:, :, :, :len(chain)], atol=1e-5, rtol=1e-5)


def test_flat_cache_keep_rows_equals_reference():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, past = int(rng.integers(1, 12)), int(rng.integers(0, 6))
        cache = FlatKVCache(2, 1, 3, 4)
        cache.reserve(past + n)
        cache.kv[:, :, :, : past + n] = torch.arange(past + n, dtype=torch.float32).view(1, 1, 1, -1, 1)
        cache.length = past + n
        rows = sorted(rng.choice(np.arange(past, past + n), int(rng.integers(0, n + 1)), replace=False).tolist())
        keep_rows(cache, past, rows)
        want = list(range(past)) + rows
        assert cache.length == len(want)
        assert cache.kv[1, 1, 0, : len(want), 2].tolist() == want


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tree_decoding_equals_ar_through_the_fast_backend(kind):
    lm = _loaded(MODELS[kind](), kind)
    dec = Decoder(lm, hf_kernels=False, draft_budget=20)
    assert dec.verifier.backend == "fast"
    rng = np.random.default_rng(11)
    for plen in (2, 30):
        prompt = rng.integers(3, TINY_VOCAB, plen).tolist()
        ar = dec.generate(prompt, method="ar", max_new_tokens=48)
        assert ar.steps == ar.new_tokens  # one forward per token
        for drafter in (ContextDrafter(), OracleDrafter(list(ar.token_ids), 7, plen), RandomDrafter(plen)):
            out = dec.generate(prompt, max_new_tokens=48, drafter=drafter)
            assert out.token_ids == ar.token_ids, drafter.name
        pld = dec.generate(prompt, method="pld", max_new_tokens=48)
        assert pld.token_ids == ar.token_ids


def test_fast_ar_equals_transformers_greedy_on_tiny_models():
    for kind in ("llama", "qwen2"):
        lm = _loaded(MODELS[kind](), kind)
        dec = Decoder(lm, hf_kernels=False)
        prompt = [5, 9, 17, 33, 40, 41]
        assert list(dec.generate(prompt, method="ar", max_new_tokens=40).token_ids) == hf_greedy(lm.model, prompt, 40)


def test_unsupported_models_fall_back_to_transformers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    # 'dynamic' rope frequencies depend on the sequence length: not table-driven.
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                      bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = _scale(LlamaForCausalLM(cfg))
    assert "rope" in fast_forward_unsupported_reason(model)
    with pytest.raises(ValueError, match="does not support"):
        FastForward(model)
    lm = _loaded(model, "dynamic-rope")
    dec = Decoder(lm, hf_kernels=False)
    # A caller's model is never changed: transformers' forward, its linears as they are.
    assert dec.verifier.backend == "hf" and not dec.fast_kernels
    prompt = [5, 6, 7, 5, 6]
    ar = dec.generate(prompt, method="ar", max_new_tokens=30)
    assert dec.generate(prompt, method="pld", max_new_tokens=30).token_ids == ar.token_ids
    # Loaded by the Decoder itself: prepacked linears on transformers' forward.
    model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    own = Decoder(str(tmp_path), hf_kernels=False)
    assert own.verifier.backend == "hf" and own.fast_kernels
    assert any(type(m).__name__ == "PackedLinear" for m in own.model.modules())
    own_ar = own.generate(prompt, method="ar", max_new_tokens=30)
    assert own.generate(prompt, method="pld", max_new_tokens=30).token_ids == own_ar.token_ids
    # Other dtypes and the explicit flag keep transformers' forward too.
    assert "float32" in fast_forward_unsupported_reason(tiny_model(0).to(torch.bfloat16))
    assert TreeVerifier(tiny_model(0), fast=False).backend == "hf"
    assert Decoder(_loaded(tiny_model(0), "t"), hf_kernels=True).verifier.backend == "hf"


def test_mistral_without_sliding_window_is_supported():
    from transformers import MistralConfig, MistralForCausalLM

    base = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = _scale(MistralForCausalLM(MistralConfig(sliding_window=None, **base)))
    assert supports_fast_forward(model)
    ff = FastForward(model)
    seq = list(range(3, 40))
    got = ff.forward(ff.new_cache(64), torch.tensor(seq), torch.arange(len(seq)), None, slice(0, len(seq)), causal=True)
    torch.testing.assert_close(got, _hf_logits(model, seq), atol=ATOL, rtol=1e-5)
    windowed = MistralForCausalLM(MistralConfig(sliding_window=16, **base))
    assert not supports_fast_forward(windowed)


@pytest.mark.slow
def test_embedded_model_pld_equals_ar_equals_generate(real_loaded):
    dec = Decoder(real_loaded, hf_kernels=False, weights="float32")  # float32 weights: comparable with generate()
    assert dec.verifier.backend == "fast"
    prompts = ["Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
               "Write a Python function that returns the squares of a list of numbers, then explain it."]
    for text in prompts:
        ids = dec.encode(text)
        ar = dec.generate(ids, method="ar", max_new_tokens=48)
        pld = dec.generate(ids, method="pld", max_new_tokens=48)
        assert pld.token_ids == ar.token_ids
        ref = hf_greedy(real_loaded.model, ids, 48, eos_id=list(real_loaded.eos_ids))
        assert list(ar.token_ids) == ref


def test_padding_rows_do_not_change_fast_logits():
    """The fast backend does not pad by default; forced padding must not leak into real rows."""
    model = tiny_model(3)
    tree = DraftTree.from_sequences([[8, 9], [10]])  # width 4; padded to 8 below
    outs = []
    for pad in (None, 8):
        v = TreeVerifier(model, fast=True, pad_multiple=pad)
        cache = v.new_cache(16)
        v.prefill(cache, [5, 6, 7])
        outs.append(v.forward(cache, 3, 4, tree).logits)
        assert cache.length == 3 + v.width(len(tree))
    assert TreeVerifier(model, fast=True).width(3) == 4
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_verifier_fetches_root_and_main_path_and_lazy_rows_equal_the_full_product(kind):
    from lookupdec.verify import main_path

    model = MODELS[kind]()
    verifier = TreeVerifier(model, fast=True)
    rng = np.random.default_rng(8)
    prompt = rng.integers(3, TINY_VOCAB, 21).tolist()
    for n in (1, 6, 15):
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
        tree = DraftTree(rng.integers(3, TINY_VOCAB, n), parents, rng.integers(1, 4, n))
        cache = verifier.new_cache(64)
        verifier.prefill(cache, prompt)
        res = verifier.forward(cache, len(prompt), 9, tree)
        assert res.rows.computed == 1 + len(main_path(tree))
        # The same forward with every row's logits in one product.
        c2 = verifier.new_cache(64)
        verifier.prefill(c2, prompt)
        ids = torch.tensor([9] + tree.tokens.tolist())
        pos = len(prompt) + torch.tensor([0] + tree.depth.tolist())
        from lookupdec.verify import tree_attention_bias

        bias = tree_attention_bias(tree, len(prompt), 1 + n, torch.float32, "cpu")[0, 0]
        full = verifier.fast.forward(c2, ids, pos, bias, slice(0, 1 + n))
        for r in reversed(range(1 + n)):  # misses first, so subtree batches run
            torch.testing.assert_close(res.row(r), full[r], atol=1e-5, rtol=1e-5)
        assert res.rows.computed == 1 + n


def test_prepacked_linear_equals_plain_product_at_every_width():
    """The blocked-layout product (one layout for all widths) equals x @ W.T + b."""
    from lookupdec.products import _Linear

    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(200, 72, generator=g), torch.randn(200, generator=g)
    lin = _Linear(w, b)
    for rows in (1, 2, 3, 7, 16, 33):
        x = torch.randn(rows, 72, generator=g)
        torch.testing.assert_close(lin(x), x @ w.T + b, atol=1e-4, rtol=1e-5)


def test_native_rms_norm_equals_the_float64_formula_row_by_row():
    """ext/csrc/rmsnorm.c against ``w * x / sqrt(mean(x^2) + eps)`` in float64; a row alone equals the same
    row among others bit for bit (the fast forward's norms never depend on the width of the forward)."""
    from lookupdec._native import rms_norm_ptr

    rng = np.random.default_rng(0)
    for rows, n in ((1, 64), (7, 576), (33, 96)):
        x = torch.from_numpy((rng.standard_normal((rows, n)) * 3).astype(np.float32))
        w = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        y = torch.empty_like(x)
        rms_norm_ptr(x.data_ptr(), rows, n, w.data_ptr(), 1e-5, y.data_ptr())
        xd = x.double()
        want = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
        torch.testing.assert_close(y.double(), want, rtol=2e-6, atol=1e-6)
        for r in (0, rows - 1):
            one, row = torch.empty(1, n), x[r:r + 1].contiguous()  # held: the call takes raw pointers
            rms_norm_ptr(row.data_ptr(), 1, n, w.data_ptr(), 1e-5, one.data_ptr())
            assert torch.equal(one[0], y[r])
    zero, ones = torch.zeros(2, 32), torch.ones(32)  # named, so they outlive the raw pointers passed below
    out = torch.empty_like(zero)
    rms_norm_ptr(zero.data_ptr(), 2, 32, ones.data_ptr(), 1e-6, out.data_ptr())
    assert torch.equal(out, zero)  # eps keeps an all-zero row finite
    with pytest.raises(ValueError):
        rms_norm_ptr(zero.data_ptr(), 2, 0, zero.data_ptr(), 1e-6, out.data_ptr())
