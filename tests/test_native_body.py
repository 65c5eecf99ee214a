"""A decode or verify forward's body in one native call (``native_layers.run_body``, ext/step.pxi): the
same bits as the general path (embedding, rotary rows and final norm in torch around the native
layers), from a GGUF's embedding blocks and from a float32 embedding, and clear errors that leave
the cache as it was."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from lookupdec.fast_forward import FastForward
from lookupdec.models import _load_gguf
from tests.conftest import TINY_VOCAB, tiny_loaded
from tests.oracles.blocks import blockified_model
from tests.test_gguf_tensors import VOCAB, _llama_gguf

pytestmark = pytest.mark.cpu  # the quantized format is the fast forward's (CPU only)

LOW = torch.finfo(torch.float32).min


def _gguf_ff(tmp_path, kind):
    from transformers import AutoConfig

    path = _llama_gguf(tmp_path / "m.gguf", kinds=(kind,), tied=True)
    config = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    model, blocks, _ = _load_gguf(path, config, torch.float32, defer=True)
    return FastForward(model, weights="quantized", blocks=blocks)


def _tree_bias(past, w):
    """A tree of ``w`` rows (the root, a branch at row 2) over ``past`` cached rows."""
    bias = torch.zeros(w, past + w)
    bias[:, past:] = torch.full((w, w), LOW).triu_(1)
    bias[3:, past + 2] = LOW  # rows 3.. are not below row 2
    return bias


def _general_path_refused(*args):
    raise AssertionError("the general path ran where the native body should have")


def _both_paths(ff, prompt, ids, bias, rows):
    """(hidden, logits of the next plain step, cache rows, length) through the native body and the general path."""
    out = []
    native = ff.native
    for body in (True, False):
        ff.native = native if body else None
        if body:
            ff._layers = _general_path_refused  # decode steps only: the prompt's prefill has a path of its own
        try:
            cache = ff.new_cache(4)  # grows inside the step
            ff.forward(cache, torch.tensor(prompt), torch.arange(len(prompt)), None, None, causal=True)
            past = len(prompt)
            hidden = ff.forward(cache, torch.tensor(ids), torch.arange(past, past + len(ids)), bias, "hidden")
            logits = ff.forward(cache, torch.tensor(ids[:1]), torch.tensor([past + len(ids)]), None, rows)
            out.append((hidden, logits, cache.kv[:, :, :, : cache.length].clone(), cache.length))
        finally:
            ff.native = native
            vars(ff).pop("_layers", None)
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_body_from_embedding_blocks_gives_the_general_paths_bits(tmp_path, kind):
    ff = _gguf_ff(tmp_path, kind)
    assert ff.native is not None and ff.native.model.embed_fmt == kind.lower()
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, 9).tolist()
    for ids, bias in ((rng.integers(0, VOCAB, 1).tolist(), None),
                      ([VOCAB - 1, 0, 5, 7, 7], _tree_bias(9, 5))):  # both ends of the vocabulary
        (h, lg, kv, n), (h0, lg0, kv0, n0) = _both_paths(ff, prompt, ids, bias, [0])
        assert torch.equal(h, h0) and torch.equal(lg, lg0) and torch.equal(kv, kv0) and n == n0 == 10 + len(ids)


def test_the_body_from_a_float32_embedding_gives_the_general_paths_bits():
    ff = FastForward(blockified_model(tiny_loaded(2).model), weights="quantized")
    assert ff.native.model.embed_fmt == "float32"
    rng = np.random.default_rng(4)
    prompt = rng.integers(3, TINY_VOCAB, 13).tolist()
    ids = rng.integers(3, TINY_VOCAB, 6).tolist()
    (h, lg, kv, n), (h0, lg0, kv0, n0) = _both_paths(ff, prompt, ids, _tree_bias(13, 6), slice(0, 1))
    assert torch.equal(h, h0) and torch.equal(lg, lg0) and torch.equal(kv, kv0) and n == n0


def test_the_body_grows_the_rotary_tables_for_positions_past_them():
    ff = FastForward(blockified_model(tiny_loaded(2).model), weights="quantized")
    far = ff._cos.shape[0] + 5  # a position no table row covers yet
    outs = []
    for body in (True, False):
        native, ff.native = ff.native, (ff.native if body else None)
        if body:
            ff._layers = _general_path_refused
        try:
            cache = ff.new_cache(8)
            ff.forward(cache, torch.tensor([4, 5]), torch.arange(2), None, None, causal=True)
            outs.append(ff.forward(cache, torch.tensor([6]), torch.tensor([far]), None, "hidden"))
        finally:
            ff.native = native
            vars(ff).pop("_layers", None)
    assert ff._cos.shape[0] > far and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("bad", [[-1], [3, TINY_VOCAB]])
def test_an_id_out_of_range_is_an_index_error_and_the_cache_is_untouched(bad):
    ff = FastForward(blockified_model(tiny_loaded(2).model), weights="quantized")
    cache = ff.new_cache(8)
    ff.forward(cache, torch.tensor([4, 5, 6]), torch.arange(3), None, None, causal=True)
    before = cache.kv[:, :, :, :3].clone()
    with pytest.raises(IndexError, match="token ids must be in"):
        ff.forward(cache, torch.tensor(bad), torch.arange(3, 3 + len(bad)), None, "hidden")
    assert cache.length == 3 and torch.equal(cache.kv[:, :, :, :3], before)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_plain_step_in_one_call_gives_the_forwards_logits_and_times_its_lm_head(tmp_path, kind):
    ff = _gguf_ff(tmp_path, kind)  # a tied lm_head: the embedding's own blocks
    assert ff.native.has_head
    prompt = [3, 9, 0, VOCAB - 1, 7]
    caches = []
    for _ in range(2):
        cache = ff.new_cache(2)  # grows inside the steps
        ff.forward(cache, torch.tensor(prompt), torch.arange(5), None, None, causal=True)
        caches.append(cache)
    for i, token in enumerate([VOCAB - 1, 0, 11]):
        logits, head_s = ff.native.plain(caches[0], token, 5 + i)
        assert torch.equal(logits, ff.forward(caches[1], torch.tensor([token]), torch.tensor([5 + i]), None, [0]))
        assert head_s > 0 and caches[0].length == caches[1].length == 6 + i
    assert torch.equal(caches[0].kv[:, :, :, :8], caches[1].kv[:, :, :, :8])
    with pytest.raises(IndexError, match="token ids must be in"):
        ff.native.plain(caches[0], VOCAB, 8)
    assert caches[0].length == 8


def test_formats_without_the_native_body_have_no_plain_step_call():
    model = blockified_model(tiny_loaded(2).model)
    assert FastForward(model, weights="float32").native is None
    assert FastForward(model, weights="quantized").native.has_head


def _tree_and_window():
    from lookupdec.drafters.base import ExtraRows
    from lookupdec.tree import DraftTree

    tree = DraftTree.from_sequences([[5, 6, 7], [5, 8], [9], [VOCAB - 1, 0, 2, 4]])
    visible = np.tril(np.ones((3, 3), bool))
    visible[2, 1] = False  # the window's rows: not all see one another
    return tree, ExtraRows(np.array([3, 1, 12]), np.array([1, 2, 2]), visible)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("window", [False, True])
def test_a_tree_step_in_one_call_gives_the_general_paths_bits(tmp_path, kind, window):
    """Ids, positions and the attention bias built in C from the tree (branches, a padded width, the
    lookahead window's rows) against ``tree_inputs`` / ``tree_attention_bias`` and ``forward``."""
    from lookupdec.tree_rows import tree_attention_bias, tree_inputs

    ff = _gguf_ff(tmp_path, kind)
    tree, extra = _tree_and_window()
    extra = extra if window else None
    n, m = len(tree), len(extra) if window else 0
    width, root, prompt = 1 + n + m + 2, 4, [3, 9, 0, VOCAB - 1, 7, 7]
    want = [0, 1, 2, 3] + list(range(1 + n, 1 + n + m))
    caches = []
    for _ in range(2):
        cache = ff.new_cache(2)  # grows inside the step
        ff.forward(cache, torch.tensor(prompt), torch.arange(6), None, None, causal=True)
        caches.append(cache)
    hidden, logits, head_s = ff.native.tree(caches[0], root, tree, extra, width, want)
    ids, pos = tree_inputs(root, tree, 6, width, extra)
    bias = tree_attention_bias(tree, 6, width, torch.float32, "cpu", extra)[0, 0]
    native, ff.native = ff.native, None  # the reference: torch's glue around the layers
    try:
        ref = ff.forward(caches[1], ids, pos, bias, "hidden")
    finally:
        ff.native = native
    assert torch.equal(hidden, ref) and torch.equal(logits, ff.logits(ref[want]))
    assert head_s > 0 and caches[0].length == caches[1].length == 6 + width
    assert torch.equal(caches[0].kv[:, :, :, : 6 + width], caches[1].kv[:, :, :, : 6 + width])


def test_a_tree_step_with_an_id_out_of_range_is_refused_before_the_cache_changes(tmp_path):
    from lookupdec.tree import DraftTree

    ff = _gguf_ff(tmp_path, "Q8_0")
    cache = ff.new_cache(8)
    ff.forward(cache, torch.tensor([1, 2, 3]), torch.arange(3), None, None, causal=True)
    before = cache.kv[:, :, :, :3].clone()
    for root, tree in ((VOCAB, DraftTree.chain([4])), (4, DraftTree.chain([4, VOCAB]))):
        with pytest.raises(IndexError, match="token ids must be in"):
            ff.native.tree(cache, root, tree, None, 1 + len(tree), [0])
        assert cache.length == 3 and torch.equal(cache.kv[:, :, :, :3], before)
