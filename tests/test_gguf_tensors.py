"""lookupdec.gguf_tensors: a Llama GGUF's tensors read straight from the file equal transformers' own, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.gguf_tensors import hf_name, read_llama_tensors, unpermute
from tests.conftest import add_gguf_tensor

HEADS, KV_HEADS, HIDDEN, FFN, LAYERS, VOCAB = 4, 2, 64, 96, 2, 40


def _llama_gguf(path, kinds=("Q4_1", "Q8_0", "F16", "F32"), arch="llama", extra=None, tied=False):
    """A tiny Llama GGUF with every layer tensor in one of ``kinds`` (in turn), as llama.cpp lays it out."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(7)
    w = GGUFWriter(str(path), arch)
    for key, value in (("context_length", 128), ("embedding_length", HIDDEN), ("block_count", LAYERS),
                       ("feed_forward_length", FFN), ("attention.head_count", HEADS),
                       ("attention.head_count_kv", KV_HEADS), ("vocab_size", VOCAB)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(VOCAB)])
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    if not tied:
        shapes["output.weight"] = (VOCAB, HIDDEN)
    kv = HIDDEN // HEADS * KV_HEADS
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
                   f"blk.{i}.attn_k.weight": (kv, HIDDEN), f"blk.{i}.attn_v.weight": (kv, HIDDEN),
                   f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                   f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                   f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)}
    shapes |= extra or {}
    for j, (name, shape) in enumerate(shapes.items()):
        x = rng.standard_normal(shape).astype(np.float32)
        add_gguf_tensor(w, name, x, "F32" if len(shape) == 1 else kinds[j % len(kinds)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _transformers_tensors(path):
    """The slow oracle: transformers' own GGUF loader, as ``from_pretrained(gguf_file=...)`` runs it."""
    import os

    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return config, load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)["tensors"]


def _assert_same(ours, theirs):
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        mine = torch.from_numpy(ours[name])
        assert mine.dtype == t.dtype and mine.shape == t.shape and torch.equal(mine, t), name


@pytest.mark.parametrize("tied", [False, True])
def test_every_tensor_equals_transformers_own_bit_for_bit(tmp_path, tied):
    path = _llama_gguf(tmp_path / "m.gguf", tied=tied,
                       extra={"rope_freqs.weight": (HIDDEN // HEADS // 2,)})  # left out by both
    config, theirs = _transformers_tensors(path)
    assert (config.num_attention_heads, config.num_key_value_heads) == (HEADS, KV_HEADS)  # grouped-query: k differs
    _assert_same(read_llama_tensors(path, HEADS, KV_HEADS), theirs)


def test_query_and_key_rows_are_un_permuted_per_head():
    # Oracle: llama.cpp's converter writes, per head, the rotary pairs' first halves interleaved
    # with their second halves; un-permuting puts row h*d + 2*i + s back at h*d + s*(d/2) + i.
    w = np.arange(24.0).reshape(12, 2)
    heads, d = 2, 6
    want = np.empty_like(w)
    for h in range(heads):
        for i in range(d // 2):
            for s in range(2):
                want[h * d + s * (d // 2) + i] = w[h * d + 2 * i + s]
    assert np.array_equal(unpermute(w, heads), want)


def test_a_file_this_reader_does_not_know_is_left_to_transformers(tmp_path):
    other_arch = _llama_gguf(tmp_path / "q.gguf", arch="qwen2")
    unknown_tensor = _llama_gguf(tmp_path / "b.gguf", extra={"blk.0.attn_q.bias": (HIDDEN,)})
    assert read_llama_tensors(other_arch, HEADS, KV_HEADS) is None
    assert read_llama_tensors(unknown_tensor, HEADS, KV_HEADS) is None
    assert hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"


def test_a_truncated_file_is_a_value_error_not_a_short_tensor(tmp_path):
    path = _llama_gguf(tmp_path / "m.gguf")
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        read_llama_tensors(str(tmp_path / "cut.gguf"), HEADS, KV_HEADS)
    assert read_llama_tensors(path, HEADS, KV_HEADS) is not None


@pytest.mark.slow
def test_the_embedded_model_reads_as_transformers_reads_it():
    from lookupdec.models import embedded_model_file

    path = embedded_model_file()
    config, theirs = _transformers_tensors(path)
    _assert_same(read_llama_tensors(path, config.num_attention_heads, config.num_key_value_heads), theirs)
