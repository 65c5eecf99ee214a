"""The quantized format reads a GGUF's Q4_1 / Q8_0 blocks from the file (``blocks.FileBlocks``) instead of
recovering them from the dequantized weights (``blocks.find_blocks``, the slow oracle here): the same blocks,
bit for bit, and so the same products; only for a model the Decoder loaded itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.blocks import concat_rows, dequantize, find_blocks
from lookupdec.gguf_tensors import llama_file_blocks, read_llama_tensors
from tests.test_gguf_tensors import HEADS, KV_HEADS, _llama_gguf

pytestmark = pytest.mark.cpu  # the quantized formats are the CPU fast forward's


def _assert_same_blocks(got, want, name):
    assert got.fmt == want.fmt and got.shape == want.shape, name
    assert np.array_equal(got.qs, want.qs), name
    assert np.array_equal(got.dm.view(np.uint16), want.dm.view(np.uint16)), name  # every scale's bits


@pytest.mark.parametrize("tied", [False, True])
def test_the_files_blocks_are_those_find_blocks_recovers_from_the_weights(tmp_path, tied):
    path = _llama_gguf(tmp_path / "m.gguf", tied=tied)  # layers cycle through Q4_1, Q8_0, F16, F32
    weights = read_llama_tensors(path, HEADS, KV_HEADS)
    found = llama_file_blocks(path, HEADS, KV_HEADS)
    recoverable = {name for name, w in weights.items() if w.ndim == 2 and find_blocks(w) is not None}
    assert set(found) == recoverable and any(".q_proj." in n for n in found) and any(".k_proj." in n for n in found)
    assert {f.fmt for f in found.values()} == {"q4_1", "q8_0"}
    for name, ref in found.items():
        blocks = ref.load()
        _assert_same_blocks(blocks, find_blocks(weights[name]), name)
        assert np.array_equal(dequantize(blocks), weights[name]), name  # q and k rows un-permuted alike


def test_a_truncated_file_is_a_value_error_naming_it(tmp_path):
    path = _llama_gguf(tmp_path / "m.gguf", kinds=("Q4_1",))
    last = max(llama_file_blocks(path, HEADS, KV_HEADS).values(), key=lambda f: f.offset)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:last.offset + 10])
    cut = llama_file_blocks(str(tmp_path / "cut.gguf"), HEADS, KV_HEADS)
    with pytest.raises(ValueError, match="runs past the end of the file"):
        max(cut.values(), key=lambda f: f.offset).load()


def test_concat_rows_stacks_like_the_matrices_and_refuses_mixed_formats():
    def q4_matrix(rows, scale):  # every block spans 0..15 times scale, shifted: exactly Q4_1 values
        return np.array([[scale * ((j + r) % 16) - r for j in range(64)] for r in range(rows)], np.float32)

    q4 = [find_blocks(q4_matrix(2, 0.25)), find_blocks(q4_matrix(3, 0.5))]
    both = concat_rows(q4)
    assert both.shape == (5, 64)
    assert np.array_equal(dequantize(both), np.concatenate([dequantize(b) for b in q4]))
    q = np.arange(64) - 32
    q[[0, 32]] = 127  # each block reaches 127 steps: its scale is exact; 32 levels are no Q4_1 block
    q8 = find_blocks(np.stack([0.5 * q, 0.25 * q]).astype(np.float32))
    assert q8.fmt == "q8_0" and concat_rows([q4[0], q8]) is None and concat_rows([]) is None


def test_a_file_changed_since_loading_is_refused_and_the_forward_recovers_the_blocks(tmp_path, monkeypatch):
    import os

    from transformers import AutoConfig

    import lookupdec.blocks
    from lookupdec.fast_forward import FastForward
    from lookupdec.models import _load_gguf

    path = _llama_gguf(tmp_path / "m.gguf", kinds=("Q4_1",))
    model, blocks, _ = _load_gguf(path, AutoConfig.from_pretrained(str(tmp_path), gguf_file="m.gguf"), torch.float32)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten since: same size, later time
    some = next(iter(blocks.values()))
    with pytest.raises(ValueError, match="changed since the model was loaded"):
        some.load()
    calls = []
    original = lookupdec.blocks.find_blocks
    monkeypatch.setattr(lookupdec.blocks, "find_blocks", lambda w: calls.append(w.shape) or original(w))
    assert FastForward(model, weights="quantized", blocks=blocks).weights == "quantized"
    assert len(calls) == 4 * model.config.num_hidden_layers + 1  # every product recovered its blocks


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_fast_forward_on_the_files_blocks_is_the_one_on_recovered_blocks(tmp_path, kind):
    from transformers import AutoConfig

    from lookupdec.fast_forward import FastForward
    from lookupdec.models import _load_gguf

    path = _llama_gguf(tmp_path / "m.gguf", kinds=(kind,))
    config = AutoConfig.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    model, blocks, _ = _load_gguf(path, config, torch.float32)
    assert blocks and all(f.fmt == kind.lower() for f in blocks.values())
    read = FastForward(model, weights="quantized", blocks=blocks)
    recovered = FastForward(model, weights="quantized")
    products = [(a, b) for la, lb in zip(read.layers, recovered.layers)
                for a, b in ((la.qkv, lb.qkv), (la.o, lb.o), (la.gate_up, lb.gate_up), (la.down, lb.down))]
    for a, b in products + [(read.lm_head, recovered.lm_head)]:
        assert a.fmt == b.fmt and torch.equal(a.qs, b.qs) and torch.equal(a.dm, b.dm)
    ids = torch.tensor([1, 5, 7, 2, 9])
    outs = [ff.forward(ff.new_cache(16), ids, torch.arange(5), None, list(range(5)), causal=True)
            for ff in (read, recovered)]
    assert torch.equal(outs[0], outs[1])


def test_blocks_are_refused_for_a_format_that_keeps_none_or_of_another_shape():
    from lookupdec.products import make_linear

    w = torch.from_numpy(np.array([[0.5 * (j % 16) - 2.0 for j in range(32)]], dtype=np.float32))
    blocks = find_blocks(w.numpy())
    assert make_linear(w, None, "quantized", blocks)(torch.ones(1, 32)).shape == (1, 1)
    with pytest.raises(ValueError, match="quantized formats"):
        make_linear(w, None, "float32", blocks)
    with pytest.raises(ValueError, match="shape"):
        make_linear(torch.cat([w, w]), None, "quantized", blocks)


@pytest.mark.slow
def test_a_decoder_reads_the_files_blocks_only_for_a_model_it_loaded_itself(real_loaded, monkeypatch):
    """Decoder() loads the embedded model and reads its blocks (recovering none); a model passed in may have
    been changed since it was loaded, so its blocks are recovered and checked, every one."""
    import lookupdec.blocks
    from lookupdec import Decoder

    assert real_loaded.blocks  # a Llama GGUF of Q4_1 and Q8_0 matrices, loaded in float32
    calls = []
    original = lookupdec.blocks.find_blocks
    monkeypatch.setattr(lookupdec.blocks, "find_blocks", lambda w: calls.append(w.shape) or original(w))
    passed = Decoder(real_loaded, weights="quantized")
    assert len(calls) == 4 * real_loaded.model.config.num_hidden_layers + 1  # qkv, o, gate_up, down; lm_head
    calls.clear()
    owned = Decoder(weights="quantized")
    assert calls == [] and owned.verifier.fast.weights == "quantized"
    a, b = owned.verifier.fast, passed.verifier.fast
    for la, lb in zip(a.layers, b.layers):
        for pa, pb in ((la.qkv, lb.qkv), (la.o, lb.o), (la.gate_up, lb.gate_up), (la.down, lb.down)):
            assert pa.fmt == pb.fmt and torch.equal(pa.qs, pb.qs) and torch.equal(pa.dm, pb.dm)
    assert torch.equal(a.lm_head.qs, b.lm_head.qs) and torch.equal(a.lm_head.dm, b.lm_head.dm)
    text = "Repeat this: the quick brown fox jumps over the lazy dog."
    assert owned.generate(text, method="ar", max_new_tokens=24).token_ids == \
        passed.generate(text, method="ar", max_new_tokens=24).token_ids


def test_an_embedding_lookup_in_one_native_call_equals_dequantize_bit_for_bit():
    """``embedding_rows`` (one native call: q4_1 and q8_0, the float16 scales widened in C) against
    ``dequantize`` of the whole matrix: random blocks with zero, negative zero, subnormal, largest
    and infinite scales, repeated rows; a row outside the matrix is an IndexError; blocks that are
    not contiguous take numpy's route with the same values."""
    from lookupdec.blocks import Blocks, embedding_rows

    rng = np.random.default_rng(9)
    specials = np.array([0.0, -0.0, 6e-8, -3e-6, 65504.0, -np.inf, 1.0], np.float16)
    for fmt in ("q4_1", "q8_0"):
        for _ in range(20):
            n, k = int(rng.integers(1, 40)), 32 * int(rng.integers(1, 5))
            qs = rng.integers(0, 256, (n, k // 2 if fmt == "q4_1" else k), dtype=np.uint8)
            dm = (rng.standard_normal((n, 2 * (k // 32) if fmt == "q4_1" else k // 32)) * 3).astype(np.float16)
            flat = dm.reshape(-1)
            flat[rng.integers(0, flat.size, min(flat.size, 4))] = rng.choice(specials, min(flat.size, 4))
            blocks = Blocks(fmt, qs, dm, (n, k))
            rows = rng.integers(0, n, int(rng.integers(1, 6))).tolist()
            got, want = embedding_rows(blocks, rows), dequantize(blocks)[rows]
            assert got.dtype == np.float32 and got.shape == (len(rows), k)
            assert np.array_equal(got, want, equal_nan=True)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # the same bits (signed zeros, NaNs)
            with pytest.raises(IndexError):
                embedding_rows(blocks, [n])
            strided = Blocks(fmt, np.asfortranarray(qs), dm, (n, k))
            assert np.array_equal(embedding_rows(strided, rows), want, equal_nan=True)
