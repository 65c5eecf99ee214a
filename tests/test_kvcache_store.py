"""The layers of a cache share one store (``LayerStore``) where their shapes agree: a commit then
moves every shared layer's rows in one copy, and must leave each layer exactly as moving its rows
alone would; layers of another shape keep buffers of their own."""
from __future__ import annotations

import torch

from lookupdec.kvcache import BufferedCache, BufferedLayer, LayerStore, keep_rows

# (kv heads, head dim) per layer: layer 1 has another head size, so it cannot share the store.
SHAPES = [(2, 8), (2, 16), (2, 8), (2, 8)]


def _caches():
    store = LayerStore(len(SHAPES), 4)  # capacity 4: the updates below make it grow twice
    shared = BufferedCache(store.layers, store)
    alone = BufferedCache([BufferedLayer(4) for _ in SHAPES])
    return shared, alone


def _feed(caches, n_rows, gen):
    for i, (h, d) in enumerate(SHAPES):
        k = torch.randn(1, h, n_rows, d, generator=gen)
        v = torch.randn(1, h, n_rows, d, generator=gen)
        for c in caches:
            c.layers[i].update(k, v)


def test_a_commit_through_the_store_leaves_every_layer_as_moving_it_alone_does():
    gen = torch.Generator().manual_seed(0)
    shared, alone = _caches()
    for n_rows in (3, 2, 6):  # 11 rows: past the first capacity and its doubling
        _feed((shared, alone), n_rows, gen)
    assert [layer.shared for layer in shared.layers] == [True, False, True, True]
    assert shared.store.kv.shape[0] == len(SHAPES) and shared.store.kv.shape[4] >= 11
    full = [(layer.keys.clone(), layer.values.clone()) for layer in alone.layers]
    for cache in (shared, alone):
        keep_rows(cache, 5, [5, 7, 10])
    keep = torch.tensor([0, 1, 2, 3, 4, 5, 7, 10])
    for i, (k, v) in enumerate(full):
        for cache in (shared, alone):
            assert torch.equal(cache.layers[i].keys, k.index_select(2, keep)), i
            assert torch.equal(cache.layers[i].values, v.index_select(2, keep)), i
    # The next step appends after the kept rows, and a commit of a prefix moves nothing.
    _feed((shared, alone), 4, gen)
    for cache in (shared, alone):
        keep_rows(cache, 8, [8, 9])
    for a, b in zip(shared.layers, alone.layers):
        assert a.get_seq_length() == b.get_seq_length() == 10
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
