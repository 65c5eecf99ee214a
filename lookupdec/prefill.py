"""A prompt's rows through ``lookupdec.fast_forward.FastForward``: the two paths of a prefill.

- ``sdpa_prefill``: a whole prompt on an empty cache, attention by torch's SDPA, whose blocked
  products suit many rows over many keys (the float formats: 3-18% faster than the chunks from
  512 tokens on, ``benchmarks/prefill.py``);
- ``chunked_prefill``: the rows on top of the cache's (empty, or a reused prefix's),
  ``PREFILL_CHUNK`` at a time, each chunk a step's forward (the native attention) under a causal
  bias. Where rows do not depend on their forward (``FastForward.rows_independent``: the
  quantized formats) its rows are the same bits however the prompt is split, so a prefix's rows
  reused from an earlier sequence (``lookupdec.prefix_cache``) are those of prefilling it again
  (tests/test_prefix_cache.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lookupdec.kvcache import check_half_range

# Rows of a prompt per forward on the chunked path: on the embedded model (quantized, 2-core AMD EPYC
# with AVX-512; benchmarks/prefill.py) 128-row chunks prefilled 128-1024 tokens in 0.93-1.08x the
# time of one SDPA forward (two runs).
PREFILL_CHUNK = 128


def sdpa_prefill(ff, cache, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal forward of ``ids`` on the empty ``cache`` (a prompt). Returns the residual rows."""
    w = ids.shape[0]
    cache.reserve(w)
    H, Hk, D = ff.n_heads, ff.n_kv_heads, ff.head_dim
    q_size, kv_size = H * D, Hk * D
    x, cos, sin = ff._start(ids, positions)
    kv = cache.kv
    for li, layer in enumerate(ff.layers):
        qkv = layer.qkv(ff._rms(x, layer.in_norm, ff.eps))         # (W, (H + 2 Hk) D)
        qk = ff._rope(qkv, cos, sin)
        # Keys and values go straight into the cache rows 0..w (layout: head, row, dim).
        if kv.dtype == torch.float16:                                # what float16 cannot hold is an error
            check_half_range(qk[:, H:])
            check_half_range(qkv[:, q_size + kv_size:])
        kv[li, 0, :, :w] = qk[:, H:].transpose(0, 1)
        kv[li, 1, :, :w] = qkv[:, q_size + kv_size:].view(w, Hk, D).transpose(0, 1)
        q = qk[:, :H].transpose(0, 1).unsqueeze(0)                   # (1, H, W, D)
        k = kv[li, 0, :, :w].unsqueeze(0).float()                    # (1, Hk, W, D), as cached (float16: rounded)
        v = kv[li, 1, :, :w].unsqueeze(0).float()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=ff.scaling, enable_gqa=H != Hk)
        x.add_(layer.o(o[0].transpose(0, 1).reshape(w, q_size)))
        ff._mlp(x, layer)
    cache.length = w
    return x


def chunked_prefill(ff, cache, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``ids`` on top of the cache's rows, ``PREFILL_CHUNK`` at a time under a causal bias.
    Returns every row final-normed ``(W, hidden)``."""
    w, past = ids.shape[0], cache.length
    low = torch.finfo(torch.float32).min
    out = []
    for s in range(0, w, PREFILL_CHUNK):
        n, p = min(PREFILL_CHUNK, w - s), past + s
        bias = torch.zeros(n, p + n)
        bias[:, p:] = torch.full((n, n), low).triu_(1)
        chunk, pos = ids[s:s + n].contiguous(), positions[s:s + n].contiguous()
        h = None if ff.native is None else ff.native.hidden(cache, chunk, pos, bias)
        out.append(ff.final_hidden(ff._layers([cache], chunk, pos, [n], [bias])) if h is None else h)
    return out[0] if len(out) == 1 else torch.cat(out)
