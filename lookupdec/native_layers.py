"""The fast forward's decoder layers in one native call per step (quantized weights).

Driven from Python, a one-row step of the embedded model runs 30 layers of about twenty small
operations, each a few microseconds of dispatch whatever its work. ``ext/csrc/layers.c`` runs
the same layers from C: the same native products, RMS norm and decode attention, with rotary
and the gated activation in C. Every operation is row-wise in one fixed order, so a row's
output still depends only on its own input, its sequence's cache and the instruction set: a
tree node's logits stay bit for bit those of decoding its path one token at a time, alone or
in a batch (tests/test_native_layers.py).

It serves the "quantized" and "quantized-bf16" formats' products (``lookupdec.products._LinearQuant``) without
biases; other formats and biased products keep the Python loop of ``FastForward._layers``.
The prompt's prefill keeps the Python loop too (torch's attention suits many rows).
"""
from __future__ import annotations

from typing import Sequence

import torch

from lookupdec._native import LAYER_INT64S, decode_body_ptr, decode_layers_ptr


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


def body_embedding(ff) -> tuple:
    """``decode_body_ptr``'s embedding arguments for ``ff``: (format, blocks, scales, float32 matrix, vocab)."""
    import numpy as np

    b = ff._embed_blocks
    if b is not None:
        qs, dm = b.qs, b.dm
        if not (qs.ndim == 2 and dm.ndim == 2 and qs.dtype == np.uint8 and dm.dtype == np.float16
                and qs.flags.c_contiguous and dm.flags.c_contiguous):
            return None
        return (b.fmt, qs.ctypes.data, dm.ctypes.data, 0, b.shape[0])
    e = ff.embed
    if e.dtype != torch.float32 or not e.is_contiguous():
        return None
    return ("float32", 0, 0, e.data_ptr(), e.shape[0])


def run_body(ff, table: torch.Tensor, embedding: tuple, cache, ids: torch.Tensor, positions: torch.Tensor,
             bias: torch.Tensor | None, threads: int) -> torch.Tensor | None:
    """One sequence's forward body in one native call (``ext/step.pxi``): the final-normed hidden states
    ``(W, hidden)`` that ``FastForward.forward(..., "hidden")`` returns, computed by the same operations,
    with the cache grown by ``W`` rows; or None, touching nothing, where inputs are not in the layout
    the call takes (the caller's general path then runs them).

    After the layers have streamed the weights through the caches, every torch call around them
    runs cold (5-10 times its warm time): one call instead of some twenty.
    """
    w, past = ids.shape[0], cache.length
    if (ids.dtype != torch.int64 or positions.dtype != torch.int64 or ids.dim() != 1 or positions.shape != ids.shape
            or not ids.is_contiguous() or not positions.is_contiguous() or w == 0):
        return None
    kv = cache.kv
    if kv.dtype != torch.float32 or not kv.is_contiguous():
        return None
    if bias is not None:
        bias = bias.reshape(w, past + w)
        if bias.dtype != torch.float32 or not bias.is_contiguous():
            return None
    cache.reserve(past + w)
    kv = cache.kv
    out = torch.empty(w, ff.hidden)
    if past + w > ff._cos.shape[0]:
        ff._ensure_positions(past + w)
    for attempt in range(2):
        try:
            decode_body_ptr(table.data_ptr(), table.shape[0], ff.hidden, ff.n_heads, ff.n_kv_heads, ff.head_dim,
                            ff.intermediate, ff.eps, ff.scaling, ff.final_norm.data_ptr(), ff.final_eps, *embedding,
                            ids.data_ptr(), positions.data_ptr(), w, ff._cos.data_ptr(), ff._sin_signed.data_ptr(),
                            ff._cos.shape[0], past, 0 if bias is None else bias.data_ptr(), kv.data_ptr(),
                            kv.shape[3], out.data_ptr(), threads)
            break
        except ValueError:  # a position past the tables (positions not of a tree on this cache)
            if attempt or int(positions.min()) < 0:
                raise
            ff._ensure_positions(int(positions.max()) + 1)
    cache.length = past + w
    return out


def body_head(ff) -> tuple | None:
    """``decode_body_ptr``'s ``lm_head`` arguments for ``ff`` (format, blocks, scales), or None where its
    ``lm_head`` is not a quantized product without bias over the embedding's vocabulary."""
    from lookupdec.products import _LinearQuant

    head = ff.lm_head
    if type(head) is not _LinearQuant or head.bias is not None or ff._body_embedding is None \
            or head.out_features != ff._body_embedding[-1]:
        return None
    return (head.fmt, head.qs.data_ptr(), head.dm.data_ptr())


class PlainStep:
    """A plain decoding step (one token on top of the cache) to its logits in one native call: the
    forward's body and ``lm_head``, with no torch call but the output's allocation.

    A plain step is the commonest step of every method, and each torch call right after a forward
    runs cold (``run_body``): the two input tensors, ``logits`` and the row's final norm cost ~130
    us a step together (2-core AMD EPYC), about 3% of the step. Same operations, same bits.
    """

    def __init__(self, ff, head: tuple) -> None:
        import numpy as np

        self.ff, self.head = ff, head
        self.inputs = np.zeros(2, np.int64)  # the token, then its position
        self.hidden = np.zeros((1, ff.hidden), np.float32)

    def __call__(self, cache, token: int, position: int, threads: int) -> tuple[torch.Tensor, float] | None:
        """``(logits (1, vocab), lm_head seconds)``, the cache grown by one row; None, touching nothing,
        where the cache is not in the layout the call takes."""
        ff, past = self.ff, cache.length
        kv = cache.kv
        if kv.dtype != torch.float32 or not kv.is_contiguous() or ff.layer_table is None:
            return None
        cache.reserve(past + 1)
        kv = cache.kv
        if position + 1 > ff._cos.shape[0]:
            ff._ensure_positions(position + 1)
        self.inputs[0], self.inputs[1] = token, position
        logits = torch.empty(1, ff.vocab)
        base = self.inputs.ctypes.data
        table = ff.layer_table
        head_s = decode_body_ptr(table.data_ptr(), table.shape[0], ff.hidden, ff.n_heads, ff.n_kv_heads, ff.head_dim,
                                 ff.intermediate, ff.eps, ff.scaling, ff.final_norm.data_ptr(), ff.final_eps,
                                 *ff._body_embedding, base, base + 8, 1, ff._cos.data_ptr(), ff._sin_signed.data_ptr(),
                                 ff._cos.shape[0], past, 0, kv.data_ptr(), kv.shape[3], self.hidden.ctypes.data,
                                 threads, *self.head, logits.data_ptr())
        cache.length = past + 1
        return logits, head_s
