"""The verifier's extra rows and top-k (drafter protocol version 3), against slow references."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from lookupdec.drafters.base import ExtraRows
from lookupdec.kvcache import with_cache
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier, tree_attention_bias, tree_inputs
from tests.conftest import TINY_VOCAB, batch_of, tiny_model


def _random_tree(rng, n):
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    return DraftTree(rng.integers(3, TINY_VOCAB, n), parents, rng.random(n))


def _random_extra(rng, m):
    """Random extra rows whose visibility is a forest (each row sees a chain), so every row has a causal oracle."""
    parents = [int(rng.integers(-1, i)) for i in range(m)]
    visible = np.eye(m, dtype=bool)
    depth = np.ones(m, np.int64)
    for i, p in enumerate(parents):
        if p >= 0:
            visible[i] |= visible[p]
            depth[i] = depth[p] + 1
    return ExtraRows(rng.integers(3, TINY_VOCAB, m), depth, visible)


def _chain_of(extra, i):
    """The extra rows row ``i`` sees, in depth order (the slow oracle's sequence)."""
    seen = sorted(np.flatnonzero(extra.visible[i]).tolist(), key=lambda j: int(extra.depth[j]))
    return [int(extra.tokens[j]) for j in seen]


def _causal_last(model, ids):
    with torch.no_grad():
        return model(batch_of(model, ids)).logits[0, -1]


def test_extra_rows_see_the_past_the_root_and_their_own_chain_only():
    """Model-level oracle: with the verifier's inputs and bias, each extra row's logits equal its chain run causally."""
    model = tiny_model(1)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, TINY_VOCAB, 9).tolist()
    root = 7
    for n, m in ((0, 3), (4, 5), (7, 1)):
        tree, extra = _random_tree(rng, n), _random_extra(rng, m)
        width = 1 + n + m + 2  # two padding rows too
        ids, pos = tree_inputs(root, tree, len(prompt), width, extra)
        bias = tree_attention_bias(tree, len(prompt), width, torch.float32, model.device, extra)
        cache = DynamicCache()
        with torch.no_grad():
            model(batch_of(model, prompt), **with_cache(model, cache), use_cache=True)
            out = model(ids.unsqueeze(0).to(model.device), position_ids=pos.unsqueeze(0).to(model.device),
                        attention_mask=bias, **with_cache(model, cache), use_cache=True).logits[0]
        for i in range(m):
            ref = _causal_last(model, prompt + [root] + _chain_of(extra, i))
            torch.testing.assert_close(out[1 + n + i], ref, atol=1e-5, rtol=1e-5)
        for i in range(n):  # tree rows never see the extra rows
            ref = _causal_last(model, prompt + [root] + tree.path_tokens(i))
            torch.testing.assert_close(out[1 + i], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fast", [pytest.param(True, marks=pytest.mark.cpu), False])
def test_verifier_tree_rows_unchanged_extra_argmax_and_topk(fast):
    model = tiny_model(2)
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, TINY_VOCAB, 12).tolist()
    for n, m in ((0, 4), (5, 6), (9, 2)):
        tree, extra = _random_tree(rng, n), _random_extra(rng, m)
        got = {}
        for with_extra in (False, True):
            v = TreeVerifier(model, tree_masks=True, fast=fast)
            assert v.backend == ("fast" if fast else "hf")
            cache = v.new_cache(64)
            v.prefill(cache, prompt)
            got[with_extra] = v.forward(cache, len(prompt), 4, tree, extra=extra if with_extra else None, topk=5)
        a, b = got[False], got[True]
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)  # tree rows unchanged
        full = b.logits
        row_tokens, topk_ids, topk_probs = b.topk_of(range(1 + n))
        _, ids = torch.topk(full, 5, dim=-1)
        assert topk_ids.tolist() == ids.tolist()
        np.testing.assert_allclose(topk_probs, torch.topk(torch.softmax(full, -1), 5).values.cpu().numpy(), rtol=1e-5,
                                   atol=1e-7)
        assert row_tokens.tolist() == [4] + tree.tokens.tolist()
        assert len(a.extra_argmax) == 0 and len(b.extra_argmax) == m
        for i in range(m):  # scaled weights: argmax are decisive, so equal to the causal run's
            ref = _causal_last(model, prompt + [4] + _chain_of(extra, i))
            assert int(b.extra_argmax[i]) == int(ref.argmax())


@pytest.mark.parametrize("fast", [pytest.param(True, marks=pytest.mark.cpu), False])
def test_extra_rows_are_never_committed(fast):
    model = tiny_model(3)
    v = TreeVerifier(model, tree_masks=True, fast=fast)
    rng = np.random.default_rng(2)
    prompt = [5, 6, 7, 8]
    tree, extra = DraftTree.from_sequences([[10, 11], [12]]), _random_extra(rng, 5)
    cache = v.new_cache(32)
    v.prefill(cache, prompt)
    v.forward(cache, 4, 9, tree, extra=extra)
    v.commit(cache, 4, (0, 1))
    # The next plain step sees exactly prompt + root + the accepted path.
    res = v.forward(cache, 7, 11, DraftTree.empty())
    torch.testing.assert_close(res.logits[0], _causal_last(model, prompt + [9, 10, 11, 11]), atol=1e-5, rtol=1e-5)


def test_chain_verification_refuses_extra_rows_and_keeps_topk():
    model = tiny_model(4)
    v = TreeVerifier(model, tree_masks=False)
    cache = v.new_cache(32)
    v.prefill(cache, [5, 6, 7])
    with pytest.raises(ValueError, match="tree masks"):
        v.forward(cache, 3, 8, DraftTree.chain([9]), extra=ExtraRows(np.array([5]), np.array([1]), np.ones((1, 1))))
    tree = DraftTree.from_sequences([[9, 10], [11]])
    res = v.forward(cache, 3, 8, tree, topk=3)
    row_tokens, topk_ids, _ = res.topk_of(range(1 + len(res.tree)))
    assert res.kept.tolist() == [0, 1] and topk_ids.shape == (3, 3)  # the longest path's rows only
    assert row_tokens.tolist() == [8, 9, 10]


def test_extra_rows_are_validated():
    for args in (([1, 2], [1], np.ones((2, 2))), ([1], [0], np.ones((1, 1))), ([1, 2], [1, 2], np.ones((2, 1))),
                 ([-1], [1], np.ones((1, 1)))):
        with pytest.raises(ValueError):
            ExtraRows(np.array(args[0]), np.array(args[1]), args[2])
