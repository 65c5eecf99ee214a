"""A Llama GGUF's layer matrices left unread (``load_model(defer_matrices=True)``, ``lookupdec.deferred``):
the quantized formats read the file's blocks instead, and anything that needs the float32 matrices reads
them first, bit for bit as the eager load (the oracle here) reads them."""
from __future__ import annotations

import os

import pytest
import torch

from lookupdec.errors import ModelLoadError
from lookupdec.models import LoadedModel, _load_gguf
from tests.test_gguf_tensors import LAYERS, _llama_gguf

pytestmark = pytest.mark.cpu  # the quantized formats are the CPU fast forward's

MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")


def _config(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _loaded(model, blocks, deferred):
    return LoadedModel(model, None, "tiny", (2,), 128, "quantized", blocks, deferred)


@pytest.mark.parametrize("tied", [False, True])
def test_deferred_matrices_stay_unread_until_materialized_then_equal_the_eager_load(tmp_path, tied):
    path = _llama_gguf(tmp_path / "m.gguf", kinds=("Q4_1", "Q8_0"), tied=tied)
    eager, _, none = _load_gguf(path, _config(path), torch.float32)
    model, blocks, deferred = _load_gguf(path, _config(path), torch.float32, defer=True)
    assert none is None and deferred.pending
    layers = {f"model.layers.{i}.{m}.weight" for i in range(LAYERS) for m in MATRICES}
    outer = {"model.embed_tokens.weight"} | (set() if tied else {"lm_head.weight"})  # stored as blocks too
    want = layers | outer
    assert set(deferred.names) == want
    params = dict(model.named_parameters())
    assert all(params[n].is_meta for n in want)
    assert not any(p.is_meta for n, p in params.items() if n not in want)  # the norms are read
    lm = _loaded(model, blocks, deferred)
    lm.materialize(layers=1)  # what timing the weight formats reads: the first layers and the embedding
    first = {n for n in layers if n.startswith("model.layers.0.")} | outer
    assert deferred.unread == want - first and deferred.pending
    assert not any(p.is_meta for n, p in model.named_parameters() if n in first)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied  # tied again to the embedding read
    lm.materialize()
    assert not deferred.pending
    reference = dict(eager.named_parameters())
    got = dict(model.named_parameters())
    assert set(got) == set(reference)
    for name, p in got.items():
        assert torch.equal(p, reference[name]), name  # bit for bit, q and k un-permuted alike
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, eager(ids).logits)
    lm.materialize()  # a second call reads nothing more
    assert all(got[n] is p for n, p in model.named_parameters())


def test_a_file_with_matrices_in_no_block_format_is_loaded_whole(tmp_path):
    path = _llama_gguf(tmp_path / "m.gguf")  # layers cycle through Q4_1, Q8_0, F16, F32
    model, blocks, deferred = _load_gguf(path, _config(path), torch.float32, defer=True)
    assert deferred is None and blocks  # some matrices have blocks, not all: nothing is left unread
    assert not any(p.is_meta for p in model.parameters())


def test_a_file_changed_since_loading_is_refused_by_materialize_and_by_the_quantized_forward(tmp_path):
    from lookupdec.fast_forward import FastForward

    path = _llama_gguf(tmp_path / "m.gguf", kinds=("Q4_1",))
    model, blocks, deferred = _load_gguf(path, _config(path), torch.float32, defer=True)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten since: same size, later time
    with pytest.raises(ModelLoadError, match="changed since the model was loaded"):
        _loaded(model, blocks, deferred).materialize()
    assert deferred.pending
    with pytest.raises(ValueError, match="never read"):  # no blocks from the file, no weights to recover them from
        FastForward(model, weights="quantized", blocks=blocks)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_quantized_forward_of_a_deferred_model_is_the_eager_ones_and_reads_nothing_more(tmp_path, kind):
    from lookupdec.fast_forward import FastForward

    path = _llama_gguf(tmp_path / "m.gguf", kinds=(kind,))
    eager, eager_blocks, _ = _load_gguf(path, _config(path), torch.float32)
    model, blocks, deferred = _load_gguf(path, _config(path), torch.float32, defer=True)
    lazy = FastForward(model, weights="quantized", blocks=blocks, release=True)
    full = FastForward(eager, weights="quantized")  # blocks recovered from the float32 weights
    assert deferred.pending
    ids = torch.tensor([1, 5, 7, 2, 9])
    outs = [ff.forward(ff.new_cache(16), ids, torch.arange(5), None, list(range(5)), causal=True)
            for ff in (lazy, full)]
    assert torch.equal(outs[0], outs[1])
    # two sequences in one forward: the embedding rows looked up in the blocks there too
    batch = [torch.tensor([3, 3, 8]), torch.tensor([0, 39])]
    hidden = [ff.forward_batch([ff.new_cache(8) for _ in batch], batch, [torch.arange(len(b)) for b in batch],
                               [None, None]) for ff in (lazy, full)]
    assert all(torch.equal(a, b) for a, b in zip(*hidden))
    for bad in (torch.tensor([1, -1]), torch.tensor([40])):  # the tiny vocabulary is 40: never wrapped around
        with pytest.raises(IndexError):
            lazy.forward(lazy.new_cache(4), bad, torch.arange(len(bad)), None, [len(bad) - 1], causal=True)


def test_a_tied_lm_head_shares_the_embeddings_blocks_read_once(tmp_path):
    import numpy as np

    from lookupdec.fast_forward import FastForward

    path = _llama_gguf(tmp_path / "m.gguf", kinds=("Q8_0",), tied=True)
    eager, _, _ = _load_gguf(path, _config(path), torch.float32)
    model, blocks, deferred = _load_gguf(path, _config(path), torch.float32, defer=True)
    lazy = FastForward(model, weights="quantized", blocks=blocks)
    assert np.shares_memory(lazy.lm_head.qs.numpy(), lazy._embed_blocks.qs)  # one copy of the file's blocks
    full = FastForward(eager, weights="quantized")
    ids = torch.tensor([4, 0, 39, 7])
    outs = [ff.forward(ff.new_cache(8), ids, torch.arange(4), None, [0, 1, 2, 3], causal=True) for ff in (lazy, full)]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.slow
def test_a_decoder_leaves_the_matrices_unread_only_where_its_format_reads_the_file(tmp_path, monkeypatch):
    """Decoder() in the quantized format never reads the float32 matrices (with ``auto``'s first run, only the
    first layers', to time the formats); asked for float32 it loads them all; a deferred model passed in is
    read before a format that needs the matrices is built."""
    from lookupdec import Decoder
    from lookupdec.models import load_model

    from lookupdec.products import QUANTIZED_FORMATS
    from lookupdec.weights import MEASURE_LAYERS

    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    text = "Repeat this: the quick brown fox jumps over the lazy dog."
    quantized = Decoder(weights="quantized")
    deferred = quantized.loaded.deferred
    assert deferred is not None and deferred.unread == set(deferred.names)
    # every layer's 7 matrices, and the embedding (a Q8_0 matrix that is also the lm_head)
    assert len(deferred.names) == 7 * quantized.model.config.num_hidden_layers + 1
    assert "model.embed_tokens.weight" in deferred.names
    # auto, first run here (an empty cache): timing the formats reads the first layers' matrices only,
    # and the quantized format's blocks from the file (none recovered from the float32 values)
    import lookupdec.blocks

    recovered = []
    original = lookupdec.blocks.find_blocks
    monkeypatch.setattr(lookupdec.blocks, "find_blocks", lambda w: recovered.append(w.shape) or original(w))
    auto = Decoder(weights="auto")
    assert not auto.weights_choice.cached and "quantized" in auto.weights_choice.ms and recovered == []
    monkeypatch.setattr(lookupdec.blocks, "find_blocks", original)
    later = {n for n in auto.loaded.deferred.names
             if n.startswith("model.layers.") and int(n.split(".")[2]) >= MEASURE_LAYERS}
    if auto.weights in QUANTIZED_FORMATS:
        assert auto.loaded.deferred.unread == later
    else:  # float32 or float16 measured faster on this machine: everything read
        assert not auto.loaded.deferred.pending
    assert Decoder(weights="float32").loaded.deferred is None
    passed = load_model(defer_matrices=True)
    dec = Decoder(passed, weights="float32")
    assert not passed.deferred.pending and dec.weights == "float32"
    assert not any(p.is_meta for p in passed.model.parameters())
    eager = Decoder(load_model(), weights="quantized")  # blocks recovered from the eager float32 weights
    assert quantized.generate(text, method="ar", max_new_tokens=24).token_ids == \
        eager.generate(text, method="ar", max_new_tokens=24).token_ids
