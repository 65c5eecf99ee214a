"""Batched verification (continuous batching): several sequences' trees in one forward.

Oracles: each sequence's own single forward (``TreeVerifier.forward`` on a cache prefilled
the same way), and the model's own causal forward of each node's root-to-node chain.
Isolation: changing one sequence's tokens leaves the others' logits where they were.
Both backends: the fast CPU forward (one product over all rows, attention per sequence) and
transformers' forward over a padded batch (``lookupdec.batch_cache``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.drafters.base import ExtraRows
from lookupdec.fast_forward import FastForward
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier, VerifyItem
from tests.conftest import TINY_VOCAB, batch_of, tiny_model

ATOL = 1e-4


def _random_tree(rng, n):
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    return DraftTree(rng.integers(3, TINY_VOCAB, n), parents, rng.uniform(0.1, 1.0, n))


def _window(rng, m):
    """A Lookahead-like window: m rows, row i sees rows 0..i."""
    return ExtraRows(rng.integers(3, TINY_VOCAB, m), np.arange(1, m + 1), np.tril(np.ones((m, m), bool)))


def _specs(rng, sizes):
    """(prompt, root, tree, extra, topk) per sequence: prompts of different lengths, trees of ``sizes``
    (0: a plain step), one with a window, one asking for top-k."""
    out = []
    for k, n in enumerate(sizes):
        prompt = rng.integers(3, TINY_VOCAB, int(rng.integers(3, 40))).tolist()
        tree = _random_tree(rng, n) if n else DraftTree.empty()
        extra = _window(rng, 3) if k == 1 and n else None
        out.append((prompt, int(rng.integers(3, TINY_VOCAB)), tree, extra, 4 if k == 2 else 0))
    return out


def _run(verifier, specs, batched: bool):
    caches, items = [], []
    for prompt, root, tree, extra, topk in specs:
        cache = verifier.new_cache(8)  # small: the batch must grow it
        verifier.prefill(cache, prompt)
        caches.append(cache)
        items.append(VerifyItem(cache, len(prompt), root, tree, extra, topk))
    if batched:
        res = verifier.forward_batch(items)
    else:
        res = [verifier.forward(it.cache, it.past, it.root, it.tree, extra=it.extra, topk=it.topk) for it in items]
    return caches, res


def _verifier(model, backend: str) -> TreeVerifier:
    verifier = TreeVerifier(model, fast=backend == "fast")
    assert verifier.backend == backend
    return verifier


def _cache_rows(cache, w):
    """A cache's first ``w`` rows, ``(layers, 2, heads, w, dim)``, whichever backend made it."""
    if hasattr(cache, "kv"):
        assert cache.length == w
        return cache.kv[:, :, :, :w]
    assert cache.get_seq_length() == w
    return torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])


# The fast forward's shared batch forward is CPU code; transformers' padded batch runs anywhere.
BACKENDS = [pytest.param("fast", marks=pytest.mark.cpu), "hf"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_each_sequence_in_a_batch_equals_its_own_forward(scale, backend):
    """Logits, top-k, window argmax and cache rows of every sequence equal those of its own forward."""
    model = tiny_model(3, layers=3, scale=scale)
    verifier = _verifier(model, backend)
    rng = np.random.default_rng(0)
    specs = _specs(rng, [5, 9, 6, 0, 14, 1])
    c_b, batch = _run(verifier, specs, True)
    c_s, single = _run(verifier, specs, False)
    assert len(batch) == len(specs)
    for (prompt, root, tree, extra, topk), b, s, cb, cs in zip(specs, batch, single, c_b, c_s):
        assert len(b.tree) == len(tree)
        torch.testing.assert_close(b.logits, s.logits, atol=ATOL, rtol=1e-5)
        if topk:
            every = range(1 + len(tree))
            assert b.topk_of(every)[1].shape == (1 + len(tree), topk)
            np.testing.assert_allclose(b.topk_of(every)[2], s.topk_of(every)[2], atol=1e-5)
        if extra is not None:
            assert len(b.extra_argmax) == len(extra)
            # argmax of a near-tie could differ by rounding; the tiny scaled model has none here
            assert b.extra_argmax.tolist() == s.extra_argmax.tolist()
        rows = 1 + len(tree) + (0 if extra is None else len(extra))
        w = len(prompt) + (rows if rows == 1 else verifier.width(rows - 1))  # the hf backend pads widths
        torch.testing.assert_close(_cache_rows(cb, w), _cache_rows(cs, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_rows_equal_the_models_own_chains(backend):
    """Every node of every sequence equals transformers' causal forward of its root-to-node chain."""
    model = tiny_model(4, layers=2)
    verifier = _verifier(model, backend)
    rng = np.random.default_rng(1)
    specs = _specs(rng, [4, 0, 7])
    _, batch = _run(verifier, specs, True)
    for (prompt, root, tree, _, _), res in zip(specs, batch):
        with torch.no_grad():
            ref_root = model(batch_of(model, prompt + [root])).logits[0, -1]
        torch.testing.assert_close(res.row(0), ref_root, atol=ATOL, rtol=1e-5)
        for i in range(len(tree)):
            with torch.no_grad():
                ref = model(batch_of(model, prompt + [root] + tree.path_tokens(i))).logits[0, -1]
            torch.testing.assert_close(res.row(1 + i), ref, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_never_sees_another_sequence(backend):
    """Changing one sequence's prompt, root and tree tokens (same shapes) leaves the others' logits unchanged."""
    model = tiny_model(5, layers=2, scale=1.0)
    verifier = _verifier(model, backend)
    rng = np.random.default_rng(2)
    specs = _specs(rng, [6, 3, 8])
    _, before = _run(verifier, specs, True)
    prompt, root, tree, extra, topk = specs[1]
    other = DraftTree((tree.tokens + 17) % TINY_VOCAB, tree.parents, tree.scores)
    changed = [specs[0], ([(t + 5) % TINY_VOCAB for t in prompt], (root + 9) % TINY_VOCAB, other, extra, topk),
               specs[2]]
    _, after = _run(verifier, changed, True)
    assert not torch.allclose(before[1].logits, after[1].logits, atol=1e-3)  # the change itself shows
    for k in (0, 2):
        torch.testing.assert_close(after[k].logits, before[k].logits, atol=1e-6, rtol=0)


def test_one_item_batch_is_forward_and_errors():
    model = tiny_model(6)
    verifier = TreeVerifier(model, fast=True)
    rng = np.random.default_rng(3)
    specs = _specs(rng, [5])
    _, b = _run(verifier, specs, True)
    _, s = _run(verifier, specs, False)
    assert torch.equal(b[0].logits, s[0].logits)
    cache = verifier.new_cache(8)
    verifier.prefill(cache, [5, 6, 7])
    item = VerifyItem(cache, 3, 9, DraftTree.chain([4, 5]))
    with pytest.raises(ValueError, match="same cache"):
        verifier.forward_batch([item, item])
    assert verifier.forward_batch([]) == []


def test_hf_backend_verifies_a_batch_in_one_forward_of_the_model():
    """Three sequences, one call of the model's forward with a batch of three (not three calls)."""
    model = tiny_model(9, layers=2)
    verifier = _verifier(model, "hf")
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    rng = np.random.default_rng(5)
    specs = _specs(rng, [3, 0, 7])
    caches, items = [], []
    for prompt, root, tree, extra, topk in specs:
        cache = verifier.new_cache(8)
        verifier.prefill(cache, prompt)
        caches.append(cache)
        items.append(VerifyItem(cache, len(prompt), root, tree, extra, topk))
    calls.clear()
    try:
        verifier.forward_batch(items)
    finally:
        hook.remove()
    assert len(calls) == 1 and calls[0][0] == 3


def test_hf_batch_cache_rows_without_a_layer_store():
    """Caches whose layers keep buffers of their own (no ``LayerStore``) are read and written per layer."""
    from lookupdec.kvcache import BufferedCache, BufferedLayer

    model = tiny_model(10, layers=2)
    verifier = _verifier(model, "hf")
    rng = np.random.default_rng(6)
    specs = [(p, r, t, None, k) for p, r, t, _, k in _specs(rng, [4, 6])]
    got = []
    for own in (False, True):
        caches, items = [], []
        for prompt, root, tree, _, _ in specs:
            cache = BufferedCache([BufferedLayer(8) for _ in range(2)]) if own else verifier.new_cache(8)
            verifier.prefill(cache, prompt)
            caches.append(cache)
            items.append(VerifyItem(cache, len(prompt), root, tree))
        got.append((caches, verifier.forward_batch(items)))
    (c_store, r_store), (c_own, r_own) = got
    for a, b, (prompt, _, tree, _, _) in zip(c_store, c_own, specs):
        w = len(prompt) + verifier.width(len(tree))
        torch.testing.assert_close(_cache_rows(a, w), _cache_rows(b, w), atol=0, rtol=0)
    for a, b in zip(r_store, r_own):
        torch.testing.assert_close(a.logits, b.logits, atol=0, rtol=0)


def test_chain_verification_in_a_batch():
    """tree_masks=False cuts every tree to its longest path (kept says which), on both backends."""
    model = tiny_model(7)
    rng = np.random.default_rng(4)
    specs = [(p, r, t, None, k) for p, r, t, _, k in _specs(rng, [6, 0, 5])]
    for verifier in (TreeVerifier(model, fast=True, tree_masks=False), TreeVerifier(model, fast=False, tree_masks=False)):
        _, b = _run(verifier, specs, True)
        _, s = _run(verifier, specs, False)
        for rb, rs in zip(b, s):
            assert (rb.kept is None) == (rs.kept is None)
            if rb.kept is not None:
                assert rb.kept.tolist() == rs.kept.tolist()
            torch.testing.assert_close(rb.logits, rs.logits, atol=ATOL, rtol=1e-5)


@pytest.mark.cpu  # the fast forward's shared batch forward (CPU only)
def test_fast_forward_batch_checks_its_lists():
    ff = FastForward(tiny_model(8))
    c1, c2 = ff.new_cache(4), ff.new_cache(4)
    with pytest.raises(ValueError, match="one ids"):
        ff.forward_batch([c1, c2], [torch.tensor([5])], [torch.tensor([0])], [None])
    with pytest.raises(ValueError, match="same cache"):
        ff.forward_batch([c1, c1], [torch.tensor([5])] * 2, [torch.tensor([0])] * 2, [None, None])


def test_uniform_layers_says_when_a_cache_stacks():
    from lookupdec.kvcache import BufferedCache, BufferedLayer, uniform_layers

    model = tiny_model(11, layers=2)
    verifier = _verifier(model, "hf")
    stored = verifier.new_cache(8)
    verifier.prefill(stored, [5, 6, 7])
    assert uniform_layers(stored)
    own = BufferedCache([BufferedLayer(8) for _ in range(2)])
    assert not uniform_layers(own)  # nothing written yet
    own.layers[0].update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    own.layers[1].update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    assert uniform_layers(own)
    odd = BufferedCache([BufferedLayer(8) for _ in range(2)])
    odd.layers[0].update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    odd.layers[1].update(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))
    assert not uniform_layers(odd)


def test_hf_batch_of_caches_that_do_not_stack_runs_one_forward_each(monkeypatch):
    """Where a cache's layers differ in shape (``uniform_layers`` false) the items run one after
    another, with the same results."""
    import lookupdec.verify as verify

    model = tiny_model(12, layers=2)
    verifier = _verifier(model, "hf")
    rng = np.random.default_rng(7)
    specs = _specs(rng, [4, 0, 5])
    _, together = _run(verifier, specs, True)
    monkeypatch.setattr(verify, "uniform_layers", lambda cache: False)
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        _, apart = _run(verifier, specs, True)
    finally:
        hook.remove()
    assert len(calls) == 2 * len(specs)  # a prefill and a forward each
    for a, b in zip(together, apart):
        torch.testing.assert_close(a.logits, b.logits, atol=ATOL, rtol=1e-5)
