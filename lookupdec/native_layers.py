"""The fast forward's decoder layers in one native call per step (quantized weights).

Driven from Python, a one-row step of the embedded model runs 30 layers of about twenty small
operations, each a few microseconds of dispatch whatever its work. ``ext/csrc/layers.c`` runs
the same layers from C: the same native products, RMS norm and decode attention, with rotary
and the gated activation in C. Every operation is row-wise in one fixed order, so a row's
output still depends only on its own input, its sequence's cache and the instruction set: a
tree node's logits stay bit for bit those of decoding its path one token at a time, alone or
in a batch (tests/test_native_layers.py).

It serves the quantized formats' products (``lookupdec.products._LinearQuant``) without
biases; other formats and biased products keep the Python loop of ``FastForward._layers``.
The prompt's prefill keeps the Python loop too (torch's attention suits many rows).
"""
from __future__ import annotations

from typing import Sequence

import torch

from lookupdec._native import LAYER_INT64S, NativeModel, decode_layers_ptr
from lookupdec.kvcache import kv_format


def layer_table(layers: Sequence) -> torch.Tensor | None:
    """The ``(n_layers, LAYER_INT64S)`` int64 table of ``lk_layer`` rows for ``layers`` (``FastForward``'s
    ``_Layer`` list), or None when a product is not a quantized one without bias.

    The table holds addresses: it is valid while the layers' tensors live (``FastForward`` keeps both).
    """
    from lookupdec.products import _LinearQuant

    rows = []
    for layer in layers:
        products = (layer.qkv, layer.o, layer.gate_up, layer.down)
        if not all(isinstance(p, _LinearQuant) and p.bias is None for p in products):
            return None
        row = [layer.in_norm.data_ptr(), layer.post_norm.data_ptr()]
        for p in products:
            row += [p.fmt, p.qs.data_ptr(), p.dm.data_ptr(), p.out_features]
        rows.append(row)
    table = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), -1)
    if table.shape[1] != LAYER_INT64S:
        raise AssertionError(f"lk_layer holds {LAYER_INT64S} int64s, the table {table.shape[1]}")
    return table


def run_layers(ff, table: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_seq: int,
               meta: torch.Tensor, kv: torch.Tensor, threads: int) -> None:
    """Every layer of ``ff`` on the residual rows ``x`` (updated in place), as ``FastForward._layers``'s loop.

    Args:
        ff: the ``FastForward`` (shapes, norms' epsilon, attention scale).
        table: its ``layer_table``.
        x: ``(R, hidden)`` float32 contiguous residual rows.
        cos, sin: ``(R, 1, head_dim)`` rotary rows of the rows' positions (``FastForward._start``).
        n_seq, meta, kv: the sequences, as ``attend_ptr`` takes them.
        threads: threads for the products and the attention.
    """
    if x.dtype != torch.float32 or not x.is_contiguous() or x.shape[1] != ff.hidden:
        raise ValueError(f"native layers need contiguous float32 (rows, {ff.hidden}) rows, got {x.dtype} "
                         f"{tuple(x.shape)}")
    cos, sin = cos.contiguous(), sin.contiguous()
    decode_layers_ptr(table.data_ptr(), table.shape[0], ff.hidden, ff.n_heads, ff.n_kv_heads, ff.head_dim,
                      ff.intermediate, ff.eps, ff.scaling, x.data_ptr(), x.shape[0], cos.data_ptr(), sin.data_ptr(),
                      n_seq, meta.data_ptr(), kv.data_ptr(), threads)



def native_steps(ff) -> "NativeSteps | None":
    """``ff``'s one-call steps (``ext/step.pxi``), or None where its embedding is in no layout the
    call reads. ``lm_head`` comes along where it is a quantized product without bias over the
    embedding's vocabulary (else ``has_head`` is False: only ``hidden`` runs)."""
    from lookupdec.blocks import native_layout
    from lookupdec.products import _LinearQuant

    b = ff._embed_blocks
    if b is not None:
        if not native_layout(b):
            return None
        embedding = (b.fmt, b.qs.ctypes.data, b.dm.ctypes.data, 0, b.shape[0])
    elif ff.embed.dtype == torch.float32 and ff.embed.is_contiguous():
        embedding = ("float32", 0, 0, ff.embed.data_ptr(), ff.embed.shape[0])
    else:
        return None
    head, head_args = ff.lm_head, (-1, 0, 0)
    if isinstance(head, _LinearQuant) and head.bias is None and head.out_features == embedding[-1]:
        head_args = (head.fmt, head.qs.data_ptr(), head.dm.data_ptr())
    table = ff.layer_table
    # The layers' weights live in ff.layers, which the table's addresses point into.
    keep = (table, ff.layers, ff.final_norm, b if b is not None else ff.embed, head)
    return NativeSteps(ff, NativeModel(table.data_ptr(), table.shape[0], ff.hidden, ff.n_heads, ff.n_kv_heads,
                                       ff.head_dim, ff.intermediate, ff.eps, ff.scaling, ff.final_norm.data_ptr(),
                                       ff.final_eps, *embedding, *head_args, keep))


class NativeSteps:
    """One sequence's decode or verify step on ``FastForward`` ``ff`` in one native call (``NativeModel``,
    ``ext/step.pxi``): the embedding, rotary rows, layers and final norm, and for ``plain`` and ``tree``
    the ``lm_head`` rows wanted first, with the same operations and bits as torch's calls around the
    native layers (``FastForward._layers``).

    After the layers have streamed the weights through the caches, every torch call around them
    runs cold (5-10 times its warm time; 2-core AMD EPYC): one call instead of some twenty. Each
    method returns None, touching nothing, where the inputs or the cache are not in the layout the
    call takes (or ``ff.layer_table`` was taken away); the caller then runs torch's path. The
    plain step's input and hidden buffers are reused: one step at a time per FastForward, as its
    callers run (a Decoder, or the server's one engine thread).
    """

    def __init__(self, ff, model: NativeModel) -> None:
        import numpy as np

        self.ff, self.model = ff, model
        self.has_head = model.has_head
        self._inputs = np.zeros(2, np.int64)  # a plain step's token, then its position
        self._hidden = np.zeros((1, ff.hidden), np.float32)

    def _ready(self, cache, rows: int, last_position: int) -> int | None:
        """Room for ``rows`` more rows in the cache and rotary tables up to ``last_position``; the cache's
        ``kv_format``, or None (nothing changed) where the call cannot take this cache."""
        fmt, ff = kv_format(cache.kv), self.ff
        if fmt is None or ff.layer_table is None:
            return None
        cache.reserve(cache.length + rows)
        if last_position >= ff._cos.shape[0]:
            ff._ensure_positions(last_position + 1)
        return fmt

    def _tables(self) -> tuple[int, int, int]:
        ff = self.ff
        return ff._cos.data_ptr(), ff._sin_signed.data_ptr(), ff._cos.shape[0]

    def hidden(self, cache, ids: torch.Tensor, positions: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor | None:
        """The final-normed hidden states ``(W, hidden)`` that ``FastForward.forward(..., "hidden")``
        returns, the cache grown by ``W`` rows."""
        w, past = ids.shape[0], cache.length
        if (ids.dtype != torch.int64 or positions.dtype != torch.int64 or ids.dim() != 1
                or positions.shape != ids.shape or not ids.is_contiguous() or not positions.is_contiguous() or w == 0):
            return None
        if bias is not None:
            bias = bias.reshape(w, past + w)
            if bias.dtype != torch.float32 or not bias.is_contiguous():
                return None
        fmt = self._ready(cache, w, past + w - 1)
        if fmt is None:
            return None
        kv, out = cache.kv, torch.empty(w, self.ff.hidden)
        for attempt in range(2):
            try:
                self.model.body(ids.data_ptr(), positions.data_ptr(), w, *self._tables(), past,
                                0 if bias is None else bias.data_ptr(), kv.data_ptr(), kv.shape[3], out.data_ptr(),
                                torch.get_num_threads(), kv_format=fmt)
                break
            except ValueError:  # a position past the tables (positions not of a tree on this cache)
                if attempt or int(positions.min()) < 0:
                    raise
                self.ff._ensure_positions(int(positions.max()) + 1)
        cache.length = past + w
        return out

    def plain(self, cache, token: int, position: int) -> tuple[torch.Tensor, float] | None:
        """A plain decoding step: ``(logits (1, vocab), lm_head seconds)``, the cache grown by one row."""
        past = cache.length
        fmt = self._ready(cache, 1, position) if self.has_head else None
        if fmt is None:
            return None
        self._inputs[0], self._inputs[1] = token, position
        kv, logits, base = cache.kv, torch.empty(1, self.ff.vocab), self._inputs.ctypes.data
        head_s = self.model.body(base, base + 8, 1, *self._tables(), past, 0, kv.data_ptr(), kv.shape[3],
                                 self._hidden.ctypes.data, torch.get_num_threads(), logits.data_ptr(), fmt)
        cache.length = past + 1
        return logits, head_s

    def tree(self, cache, root: int, tree, extra, width: int,
             rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """A verify forward of ``[root] + tree + extra`` padded to ``width`` rows, laid out as
        ``tree_rows.tree_inputs`` and ``tree_attention_bias`` lay it out (built in C): ``(hidden
        (width, hidden), logits of rows (len(rows), vocab), lm_head seconds)``, the cache grown by
        ``width`` rows."""
        import numpy as np

        past, n, m = cache.length, len(tree), 0 if extra is None else len(extra)
        deepest = max(width - 1, int(extra.depth.max()) if m else 0)  # a tree node is at most n deep
        fmt = self._ready(cache, width, past + deepest) if self.has_head else None
        if fmt is None:
            return None
        kv, hidden, logits = cache.kv, torch.empty(width, self.ff.hidden), torch.empty(len(rows), self.ff.vocab)
        sel = np.array(rows, np.int64)
        ex = (extra.tokens.ctypes.data, extra.depth.ctypes.data, extra.visible.ctypes.data) if m else (0, 0, 0)
        head_s = self.model.tree(root, tree.tokens.ctypes.data, tree.parents.ctypes.data, n, *ex, m, width,
                                 *self._tables(), past, kv.data_ptr(), kv.shape[3], hidden.data_ptr(),
                                 sel.ctypes.data, len(rows), logits.data_ptr(), torch.get_num_threads(), fmt)
        cache.length = past + width
        return hidden, logits, head_s
