"""Several sequences' KV caches seen by transformers' forward as one padded batch.

transformers' model forward takes one cache for the whole batch, with the same number of
cached rows for every sequence. ``BatchView`` gives it that for one verify forward of
sequences whose own caches (``kvcache.new_cache``) hold different numbers of rows:

- layout: a buffer ``(layers, 2, B, kv_heads, P + W, head_dim)``, ``P`` the longest past,
  ``W`` the forward's width. Sequence ``b``'s cached rows are copied to columns
  ``0 .. past_b - 1``, its ``W`` new rows are written at ``past_b .. past_b + W - 1`` as each
  layer computes them, and its other columns are zeros. The 4D mask ``padded_forward`` builds
  lets each sequence's rows see only its own columns, so a zero column never weighs (a masked
  column's softmax weight is exactly 0, and zeros are finite);
- ``get_seq_length`` reports ``P``, so transformers' query offsets and mask sizes
  (``P + W`` columns) agree with the buffer;
- after the forward, ``write_back`` appends each sequence's real new rows (its own width,
  not the batch's padding) to its own cache, exactly as its own forward would have.

So one forward of the batch does the work of ``B`` forwards: each weight is read once for
all of them (what a memory- or launch-bound device gains from), at the price of copying
the sequences' cached rows into the buffer each step (on the embedded model 46 KB a row;
one copy per sequence when its cache keeps its layers in one ``LayerStore``).
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from lookupdec.kvcache import append_rows, stored_rows, with_cache
from lookupdec.tree_rows import tree_attention_bias, tree_inputs


class _ViewLayer(DynamicLayer):
    """One layer of a ``BatchView``: writes each sequence's new rows at its own columns."""

    def __init__(self, view: "BatchView", index: int) -> None:
        super().__init__()
        self.view, self.index = view, int(index)
        self.keys = view.buf[index, 0]
        self.values = view.buf[index, 1]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        index = self.view.columns.expand(-1, key_states.shape[1], -1, key_states.shape[3])
        self.keys.scatter_(2, index, key_states)
        self.values.scatter_(2, index, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.view.longest


class BatchView(Cache):
    """The padded batch cache of one verify forward over several sequences' own caches.

    Args:
        caches: each sequence's cache (``kvcache.new_cache``), holding ``pasts[b]`` rows.
        pasts: each sequence's cached rows.
        width: rows of the forward (the same for every sequence: ``W``).

    Attributes:
        buf: ``(layers, 2, B, kv_heads, P + W, head_dim)``.
        longest: ``P``, the longest past.
        columns: ``(B, 1, W, 1)`` int64, where each sequence's new rows go.
    """

    def __init__(self, caches: Sequence, pasts: Sequence[int], width: int) -> None:
        rows = [stored_rows(c, p) for c, p in zip(caches, pasts)]  # (layers, 2, 1, heads, past, dim) each
        layers, _, _, heads, _, dim = rows[0].shape
        self.pasts = [int(p) for p in pasts]
        self.width = int(width)
        self.longest = max(self.pasts)
        first = rows[0]
        self.buf = first.new_empty((layers, 2, len(rows), heads, self.longest + self.width, dim))
        for b, (r, past) in enumerate(zip(rows, self.pasts)):
            self.buf[:, :, b, :, :past] = r[:, :, 0]
            if past < self.longest:
                self.buf[:, :, b, :, past + self.width:].zero_()
        cols = torch.tensor(self.pasts, dtype=torch.long)[:, None] + torch.arange(self.width)
        self.columns = cols.to(first.device)[:, None, :, None]
        Cache.__init__(self, layers=[_ViewLayer(self, i) for i in range(layers)])

    def write_back(self, caches: Sequence, widths: Sequence[int]) -> None:
        """Append sequence ``b``'s first ``widths[b]`` new rows to ``caches[b]``."""
        for b, (cache, past, w) in enumerate(zip(caches, self.pasts, widths)):
            append_rows(cache, self.buf[:, :, b:b + 1, :, past:past + int(w)])


def padded_forward(model, items: Sequence[tuple], widths: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    """One forward of ``model`` over several sequences' verify rows, as one padded batch.

    Args:
        model: a transformers causal LM whose attention takes a 4D float mask.
        items: ``(cache, past, root, tree, extra)`` per sequence (``verify.tree_inputs``' layout).
        widths: each sequence's own width (what its own forward would run and write to its cache).
    Returns:
        ``(B, W, vocab)`` logits, ``W = max(widths)``: row ``r`` of sequence ``b`` is row ``r`` of
        its own forward (rows past its own width are padding). Each cache then holds its past plus
        its own width's rows, as after its own forward.

    Every sequence gets width ``W``: its rows, then padding rows that repeat its root (as in its own
    forward); its bias (``tree_attention_bias`` at width ``W``) sits at its own columns of the batch
    cache, every other column masked.
    """
    width = max(widths)
    caches = [c for c, *_ in items]
    view = BatchView(caches, [past for _, past, *_ in items], width)
    bias = torch.full((len(items), 1, width, view.longest + width), torch.finfo(dtype).min, dtype=dtype)
    ids, pos = [], []
    for b, (_, past, root, tree, extra) in enumerate(items):
        i, p = tree_inputs(root, tree, past, width, extra)
        ids.append(i)
        pos.append(p)
        bias[b, 0, :, : past + width] = tree_attention_bias(tree, past, width, dtype, "cpu", extra)[0, 0]
    out = model(input_ids=torch.stack(ids).to(device), position_ids=torch.stack(pos).to(device),
                attention_mask=bias.to(device), **with_cache(model, view), use_cache=True)
    view.write_back(caches, widths)
    return out.logits
