"""A verify step of one sequence on the fast forward, to the logit rows wanted first: in one native
call where the weight format has it (``FastForward.native``, ``native_layers.NativeSteps``), else
through ``FastForward.forward`` and ``logits``. Both give the same bits; ``lm_head``'s seconds come
back apart, for the cost model (``lookupdec.pricing``), which prices the forward's body and
``lm_head`` separately.
"""
from __future__ import annotations

import time

import torch

from lookupdec.tree_rows import tree_attention_bias, tree_inputs


def plain_step(fast, cache, root: int, past: int) -> tuple[torch.Tensor, float]:
    """``root`` at position ``past`` on top of the cache: ``(logits (1, vocab), lm_head seconds)``."""
    out = None if fast.native is None else fast.native.plain(cache, root, past)
    if out is not None:
        return out
    hidden = fast.forward(cache, torch.tensor([root]), torch.tensor([past]), None, "hidden")
    t = time.perf_counter()
    return fast.logits(hidden), time.perf_counter() - t


def tree_step(fast, cache, root: int, tree, extra, width: int,
              rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``[root] + tree + extra`` padded to ``width`` rows on top of the cache: ``(final-normed hidden
    rows (width, hidden), logits of ``rows``, lm_head seconds)``."""
    out = None if fast.native is None else fast.native.tree(cache, root, tree, extra, width, rows)
    if out is not None:
        return out
    past = cache.length
    ids, pos = tree_inputs(root, tree, past, width, extra)
    bias = tree_attention_bias(tree, past, width, torch.float32, "cpu", extra)[0, 0]
    hidden = fast.forward(cache, ids, pos, bias, "hidden")
    t = time.perf_counter()
    logits = fast.logits(hidden.index_select(0, torch.tensor(rows)))
    return hidden, logits, time.perf_counter() - t
