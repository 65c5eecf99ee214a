"""A lean CPU float32 forward for Llama-family targets (Llama, SmolLM2, Qwen2, Mistral).

Its linear weights are stored in one of ``lookupdec.products.WEIGHT_FORMATS``: "float32" (the
model's own values), "float16" (rounded once; half the bytes read per forward,
which is what bounds a CPU forward), "quantized" (the Q4_1 / Q8_0 blocks a GGUF
model was dequantized from: float32's values from 6-9 bits each), "quantized-bf16"
(those blocks, the layers' products rounded to bfloat16 and summed in float32) or
"quantized-int8" (those blocks against the activations rounded to 8 bits per block of 32,
summed in integers a block at a time); norms and attention are float32 in all, and the KV
cache float32 unless ``kv_dtype="float16"`` stores it in half the bytes.

transformers' forward spends as much time in per-module Python, mask
building and layout conversions as in the matrix products on a small model
decoding one token at a time on a CPU. ``FastForward`` runs the same
computation from the loaded model's own weights with the fewest torch calls:

- q/k/v fused into one product and gate/up into another, each weight
  prepacked once into oneDNN's blocked layout (``_reorder_linear_weight``)
  and multiplied with
  ``torch.ops.mkldnn._linear_pointwise``, which takes and returns ordinary
  dense tensors (no per-call ``to_mkldnn``/``to_dense`` conversion);
- rotary embeddings from cos/sin tables indexed by position (the tables are
  produced by the model's own rotary module, so they equal its values bit
  for bit);
- RMS norms in one native call each (``ext/csrc/rmsnorm.c``: a row at a time, its sum of
  squares in index order): torch's ``rms_norm`` took ~25 microseconds a call on one row, and
  the one-row forward of the embedded model fell from 12.9 to 11.5 ms with this;
- grouped-query attention over a preallocated KV cache (``FlatKVCache``) written in place:
  in the float formats a prompt (causal, on an empty cache) through
  ``F.scaled_dot_product_attention``, every other forward (a prompt in the quantized formats or
  on top of a reused prefix, decode, tree verify, batches) through one native call a layer for all its sequences
  (``ext/csrc/attention.c``): torch's call cost ~58 microseconds per sequence and layer; a
  one-row forward took 10.4 ms and four one-row sequences 19.6 ms with it, 8.6 and 13.4 without
  (``benchmarks/forward_widths.py``, quantized weights, 2-core Xeon). The
  native routine treats each (row, head) alone in a fixed order, so with row-independent
  products (the quantized formats') a tree node's logits are bit for bit those of decoding its
  chain one token at a time, and a prompt's rows (``lookupdec.prefill``: 128 at a time, under a
  causal bias) are those of feeding it in any split: a prefix's rows reused from an earlier sequence
  (``lookupdec.prefix_cache``) give the very bits of prefilling it again;
- the final norm and ``lm_head`` only for the rows whose logits are needed
  (``logit_rows="hidden"`` defers ``lm_head`` so a verifier can compute only
  the rows its acceptance walk visits);
- with quantized weights, a step's layers (not a prompt's) in one native call
  (``lookupdec.native_layers``, ``ext/csrc/layers.c``): the same native products, norm and
  attention, driven from C instead of ~20 Python calls a layer;
- several sequences in one forward (``forward_batch``, continuous batching): the
  linear products run once over the rows of all of them, attention in the same native
  call, each sequence over its own cache.

The result equals the model's forward up to float rounding (tests compare
logits within 1e-4); greedy exactness is stated against decoding with this
same forward (``ar`` runs through it too).

``lookupdec.fast_forward_support.supports_fast_forward`` decides whether a model qualifies;
everything else (CUDA, other dtypes, other architectures, rope types whose frequencies depend
on the sequence length, sliding windows) keeps transformers' forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from lookupdec.fast_forward_support import fast_forward_unsupported_reason
from lookupdec.kvcache import KV_DTYPES, FlatKVCache, check_kv_dtype, kv_format
from lookupdec.inference import inference
from lookupdec._native import attend_ptr, rms_norm_ptr
from lookupdec.native_layers import layer_table, native_steps, run_layers
from lookupdec.prefill import chunked_prefill, sdpa_prefill
from lookupdec.blocks import concat_rows, embedding_rows
from lookupdec.deferred import unread_error
from lookupdec.products import QUANTIZED_FORMATS, Product, make_linear, weights_unavailable_reason
from lookupdec.release import release_linear, return_freed_memory

def _dense_linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of an ``nn.Linear`` or of a ``PackedLinear`` (packed by ``fast_kernels``)."""
    if hasattr(module, "packed_weight"):
        return module.packed_weight.to_dense(), module._dense_bias
    return module.weight.detach(), None if module.bias is None else module.bias.detach()


def _cat_bias(biases: Sequence[torch.Tensor | None], sizes: Sequence[int]) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    return torch.cat([torch.zeros(n) if b is None else b.float() for b, n in zip(biases, sizes)])


def _file_blocks(blocks: Mapping | None, names: Sequence[str]):
    """The file's blocks of the matrices ``names`` stacked by rows (as the fused products stack
    them), or None: no file blocks for them, or a file that changed or cannot be read since the
    model was loaded (the product then recovers the blocks from the weights, checking each value)."""
    if not blocks or any(n not in blocks for n in names):
        return None
    try:
        return concat_rows([blocks[n].load() for n in names])
    except (OSError, ValueError):
        return None


@dataclass
class _Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Product
    o: Product
    gate_up: Product
    down: Product


class FastForward:
    """The lean forward of one Llama-family model (see the module docstring).

    Args:
        model: a transformers causal LM for which ``supports_fast_forward`` holds.
            Its weights are copied (fused and prepacked).
        release: free the model's own copy of each linear weight once it is
            packed (layer by layer, so packing never holds two copies of the
            model): for a model nobody else uses, as when the Decoder loaded it.
            The model's own forward then no longer works. False (the default)
            leaves the model unchanged.
        weights: the format the linear weights are stored in (``WEIGHT_FORMATS``):
            "float32" (the model's own values, oneDNN's blocked layout), "float16"
            (rounded to float16 once, fbgemm kernels: half the bytes read per forward;
            activations and accumulation stay float32) or "quantized" (the GGML blocks
            the float32 values were dequantized from, lookupdec's native products;
            ``lookupdec.blocks``) or "quantized-bf16" (those blocks, each weight and input
            rounded to bfloat16 in the products, float32 sums) or "quantized-int8" (those
            blocks, each input rounded to 8 bits per block of 32, integer block sums). Every
            product is in this format: q/k/v, o, gate/up, down and ``lm_head`` (which
            "quantized-bf16" keeps in "quantized": a step computes few of its rows). Norms, the embedding
            table and rotary tables stay float32.
        layers: build only the first ``layers`` decoder layers and no ``lm_head`` (for timing
            a format without a second full copy of the weights, ``lookupdec.weights``: such a
            forward takes ``logit_rows`` None or "hidden"); None = the whole model. Not with
            ``release``.
        blocks: for the quantized formats, where the GGUF file keeps the blocks the model's
            weights were dequantized from (``LoadedModel.blocks``, by parameter name): read
            instead of recovered from the weights (``blocks.find_blocks``, which checks every
            value and takes about 1.8 s for the embedded model). Pass them only for a model whose
            weights nobody changed since it was loaded; None = recover every matrix's blocks.
        kv_dtype: the KV cache's elements (``kvcache.KV_DTYPES``): "float32" (default) or
            "float16": each new key and value rounded to float16 (to nearest) as it is written, and
            turned back into float32 exactly as the attention reads it (``ext/csrc/attention.h``),
            so a step reads half the cache's bytes and a sequence keeps half. Like a weight format,
            this changes the model a little; every method stays exact against ``ar`` with the same
            choice.
    Attributes:
        weights: the weight format in use.
        kv_dtype: the KV cache's element type in use.
    Raises:
        ValueError: the model does not qualify, or the weight format is unknown,
            unavailable in this torch, or cannot hold the weights (the message says why).

    Example:
        >>> ff = FastForward(model)                                  # doctest: +SKIP
        >>> cache = ff.new_cache(64)                                  # doctest: +SKIP
        >>> ff.forward(cache, torch.tensor([5, 6]), torch.arange(2), None, [1], causal=True).shape  # doctest: +SKIP
        torch.Size([1, vocab])
    """

    def __init__(self, model, *, release: bool = False, weights: str = "float32", layers: int | None = None,
                 blocks: Mapping | None = None, kv_dtype: str = "float32") -> None:
        check_kv_dtype(kv_dtype)
        self.kv_dtype = kv_dtype
        reason = fast_forward_unsupported_reason(model)
        if reason:
            raise ValueError(f"the fast forward does not support this model: {reason}; use transformers' forward")
        reason = weights_unavailable_reason(weights)
        if reason:
            raise ValueError(f"{reason}; use weights='float32'")
        self.weights = weights
        # Whether a row's bits are independent of the forward that computes it (which rows share
        # it, how a prompt is split): the quantized formats' products and the native attention.
        self.rows_independent = weights in QUANTIZED_FORMATS
        if layers is not None and (release or not 1 <= layers):
            raise ValueError(f"layers must be >= 1 and is not for release=True, got {layers!r}")
        inner = model.model
        attn0 = inner.layers[0].self_attn
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = attn0.head_dim
        self.scaling = float(attn0.scaling)
        self.eps = float(inner.layers[0].input_layernorm.variance_epsilon)
        self.final_eps = float(inner.norm.variance_epsilon)
        self.hidden = cfg.hidden_size
        self.intermediate = inner.layers[0].mlp.gate_proj.out_features
        decoder_layers = list(inner.layers)[:layers]
        self.n_layers = len(decoder_layers)
        if weights not in QUANTIZED_FORMATS:
            blocks = None
        self.embed = inner.embed_tokens.weight.detach()
        # An embedding never read (a deferred load): its rows are dequantized from the file's blocks on use.
        self._embed_blocks = _file_blocks(blocks, ["model.embed_tokens.weight"]) if self.embed.is_meta else None
        if self.embed.is_meta and self._embed_blocks is None:
            raise unread_error("the embedding")
        self.final_norm = inner.norm.weight.detach().float().contiguous()
        w, b = _dense_linear(model.lm_head)
        # lm_head keeps float32 products in the bfloat16 format: a step computes few of its rows (the
        # acceptance walk's), where bfloat16 saves nothing and its rounding would touch the logits. The
        # 8-bit format rounds lm_head's inputs too, as llama.cpp does: 4 rows cost 0.6x quantized's.
        head = "quantized" if weights == "quantized-bf16" else weights
        tied = model.lm_head.weight is inner.embed_tokens.weight
        if layers is not None:
            self.lm_head = None
        elif tied and self._embed_blocks is not None:  # the embedding's blocks, already read: shared, not read again
            self.lm_head = make_linear(w, b, head, self._embed_blocks)
        else:
            head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
            self.lm_head = make_linear(w, b, head, _file_blocks(blocks, [head_name]))
        self.vocab = w.shape[0]
        if release and not tied:  # a tied head is the embedding
            release_linear(model.lm_head)
        self._rotary = inner.rotary_emb
        self._cos = self._sin_signed = torch.empty(0)
        # Rotary tables grow with the positions a forward uses (see _ensure_positions).
        self._ensure_positions(min(int(getattr(cfg, "max_position_embeddings", 2048) or 2048), 1024))
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.layers: list[_Layer] = []
        for i, layer in enumerate(decoder_layers):
            a, m = layer.self_attn, layer.mlp
            (wq, bq), (wk, bk), (wv, bv) = (_dense_linear(a.q_proj), _dense_linear(a.k_proj), _dense_linear(a.v_proj))
            (wg, bg), (wu, bu) = _dense_linear(m.gate_proj), _dense_linear(m.up_proj)
            at, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            file_qkv = _file_blocks(blocks, [f"{at}{p}_proj.weight" for p in "qkv"])
            file_gate_up = _file_blocks(blocks, [f"{mlp}{p}_proj.weight" for p in ("gate", "up")])
            self.layers.append(_Layer(
                in_norm=layer.input_layernorm.weight.detach().float().contiguous(),
                post_norm=layer.post_attention_layernorm.weight.detach().float().contiguous(),
                qkv=make_linear(torch.cat([wq, wk, wv]), _cat_bias([bq, bk, bv], [q_size, kv_size, kv_size]), weights,
                                file_qkv),
                o=make_linear(*_dense_linear(a.o_proj), weights, _file_blocks(blocks, [f"{at}o_proj.weight"])),
                gate_up=make_linear(torch.cat([wg, wu]), _cat_bias([bg, bu], [self.intermediate, self.intermediate]),
                                    weights, file_gate_up),
                down=make_linear(*_dense_linear(m.down_proj), weights, _file_blocks(blocks, [f"{mlp}down_proj.weight"])),
            ))
            if release:
                for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                    release_linear(lin)
                return_freed_memory()
        # Quantized products without biases: a step's layers run in one native call (native_layers;
        # None for any other product).
        self.layer_table = layer_table(self.layers)
        # With it, a step of one sequence runs from its ids to its first logit rows in one native call.
        self.native = None if self.layer_table is None else native_steps(self)

    def _ensure_positions(self, n: int) -> None:
        """Make the cos/sin tables cover positions ``0..n-1``.

        The tables come from the model's own rotary module evaluated at every
        position, so a lookup equals what the model computes for that position.
        ``sin_signed`` has its first half negated: with ``x_rot = roll(x, D/2)``
        = ``[x2, x1]``, ``x * cos + x_rot * sin_signed`` is the model's
        ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]``.
        """
        if n <= self._cos.shape[0]:
            return
        n = max(n, 2 * self._cos.shape[0])
        pos = torch.arange(n).unsqueeze(0)
        with torch.no_grad():
            cos, sin = self._rotary(torch.zeros(1, dtype=torch.float32), pos)
        cos, sin = cos[0].float().contiguous(), sin[0].float().clone()
        half = self.head_dim // 2
        sin[:, :half].neg_()
        self._cos, self._sin_signed = cos, sin.contiguous()

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes a sequence's cache holds per cached token (every layer's keys and values)."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * KV_DTYPES[self.kv_dtype].itemsize

    def new_cache(self, capacity: int) -> FlatKVCache:
        """An empty KV cache for one sequence of up to ``capacity`` rows (it grows if needed)."""
        return FlatKVCache(self.n_layers, self.n_kv_heads, self.head_dim, capacity, dtype=KV_DTYPES[self.kv_dtype])

    def _rms(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # One native call (ext/csrc/rmsnorm.c, each row alone in a fixed order): torch's rms_norm
        # cost ~25 microseconds a call here, a tenth of a one-row forward over 61 norms.
        x = x.contiguous()
        y = torch.empty_like(x)
        rms_norm_ptr(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], weight.data_ptr(), eps, y.data_ptr())
        return y

    @inference
    def forward(self, cache: FlatKVCache, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor | None,
                logit_rows: Sequence[int] | slice | None, *, causal: bool = False) -> torch.Tensor:
        """Run ``ids`` on top of the cache's rows; append their keys/values to the cache.

        Args:
            cache: the sequence's cache; its length grows by ``len(ids)``.
            ids: ``(W,)`` int64 token ids.
            positions: ``(W,)`` int64 rotary positions.
            bias: float ``(W, past + W)`` attention bias (0 = attend, -inf-like = not),
                or None: with ``causal`` the rows attend causally, else every row
                attends to every cached row and all ``W`` rows (right for ``W == 1``).
            logit_rows: which rows get logits (indices or a slice); None = none;
                ``"hidden"``: no logits, return every row's final-normed hidden state
                ``(W, hidden)`` instead (``logits`` turns rows of it into logits later).
            causal: a prompt (or the rest of one): the rows attend to every cached row and
                causally among themselves (``bias`` is not used).
        Returns:
            ``(len(logit_rows), vocab)`` float32 logits (an empty tensor when ``logit_rows`` is None),
            or ``(W, hidden)`` with ``logit_rows="hidden"``.
        """
        h = x = None  # h: every row final-normed (the native body), x: residual rows (the general path)
        if causal:
            if cache.length or self.rows_independent:
                h = chunked_prefill(self, cache, ids, positions)
            else:
                x = sdpa_prefill(self, cache, ids, positions)
        elif self.native is not None:
            h = self.native.hidden(cache, ids, positions, bias)
        if h is None and x is None:
            x = self._layers([cache], ids, positions, [ids.shape[0]], [bias])
        if logit_rows is None:
            return (h if x is None else x).new_empty((0, self.vocab))
        if isinstance(logit_rows, str):
            if logit_rows != "hidden":
                raise ValueError(f"logit_rows must be indices, a slice, None or 'hidden', got {logit_rows!r}")
            return h if x is None else self.final_hidden(x)
        if not isinstance(logit_rows, slice):
            logit_rows = torch.as_tensor(logit_rows, dtype=torch.long)
        return self.logits(h[logit_rows] if x is None else self.final_hidden(x[logit_rows]))

    @inference
    def forward_batch(self, caches: Sequence[FlatKVCache], ids_list: Sequence[torch.Tensor],
                      pos_list: Sequence[torch.Tensor], bias_list: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """Several sequences' rows in one forward: each linear product runs once over all rows.

        Row blocks are concatenated in order (sequence ``s`` owns rows ``off[s] .. off[s+1]-1``)
        for every product (q/k/v, o, gate/up, down); rotary is row-wise; attention (one native call
        a layer) takes each sequence over its own cache with its own bias, so a row never sees
        another sequence's keys. Each block's keys and values are appended to its own cache.

        Args:
            caches: one cache per sequence (distinct objects); each grows by its block's width.
            ids_list, pos_list: ``(W_s,)`` int64 token ids and rotary positions of each block.
            bias_list: each block's float ``(W_s, past_s + W_s)`` bias, or None (see ``forward``:
                every row attends to the whole cache and the whole block; right for ``W_s == 1``).
        Returns:
            Each block's final-normed hidden states ``(W_s, hidden)`` (``logits`` makes logits of them).
        Raises:
            ValueError: lists of different lengths, or one cache given twice.

        Example:
            >>> hs = ff.forward_batch([c1, c2], [torch.tensor([5]), torch.tensor([6, 7])],  # doctest: +SKIP
            ...                       [torch.tensor([3]), torch.tensor([9, 10])], [None, bias2])
            >>> [h.shape[0] for h in hs]                                                      # doctest: +SKIP
            [1, 2]
        """
        n = len(caches)
        if not (len(ids_list) == len(pos_list) == len(bias_list) == n):
            raise ValueError(f"forward_batch needs one ids, positions and bias per cache, got {len(ids_list)}, "
                             f"{len(pos_list)}, {len(bias_list)} for {n} caches")
        if len({id(c) for c in caches}) != n:
            raise ValueError("forward_batch got the same cache twice; every sequence needs its own")
        if n == 0:
            return []
        widths = [int(i.shape[0]) for i in ids_list]
        x = self._layers(list(caches), torch.cat(list(ids_list)), torch.cat(list(pos_list)), widths, list(bias_list))
        offs = [0]
        for w in widths:
            offs.append(offs[-1] + w)
        hidden = self.final_hidden(x)
        return [hidden[offs[s]:offs[s + 1]] for s in range(n)]

    def _layers(self, caches: list[FlatKVCache], ids: torch.Tensor, positions: torch.Tensor, widths: list[int],
                biases: list[torch.Tensor | None]) -> torch.Tensor:
        """New rows of one or more sequences (row blocks in order) on top of their caches.

        The linear products run once over all rows; attention is one native call a layer
        (``ext/csrc/attention.c``) for every sequence, each row over its own cache and block
        under its own bias. Returns the residual rows; every cache grows by its block's width.
        """
        total = ids.shape[0]
        pasts = [c.length for c in caches]
        meta, kv_rows, keep = [], [], []
        off = 0
        for c, p, w, b in zip(caches, pasts, widths, biases):
            c.reserve(p + w)
            fmt = kv_format(c.kv)
            if fmt is None:
                raise ValueError("the fast forward needs a contiguous float32 or float16 KV cache (FastForward.new_cache)")
            if b is not None:
                b = b.reshape(w, p + w).to(torch.float32).contiguous()
                keep.append(b)
            meta.append([off, w, p, 0 if b is None else b.data_ptr()])
            kv_rows.append([c.kv.data_ptr(), c.capacity, fmt])
            off += w
        meta_t = torch.tensor(meta, dtype=torch.int64)
        kv_t = torch.tensor(kv_rows, dtype=torch.int64)
        H, Hk, D = self.n_heads, self.n_kv_heads, self.head_dim
        q_size, kv_size = H * D, Hk * D
        x, cos, sin = self._start(ids, positions)
        threads = torch.get_num_threads()
        if self.layer_table is not None:
            run_layers(self, self.layer_table, x, cos, sin, len(caches), meta_t, kv_t, threads)
            for c, p, w in zip(caches, pasts, widths):
                c.length = p + w
            return x
        att = x.new_empty((total, q_size))
        for li, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.in_norm, self.eps)).contiguous()  # (R, (H + 2 Hk) D), all sequences
            qk = self._rope(qkv, cos, sin)
            attend_ptr(len(caches), meta_t.data_ptr(), kv_t.data_ptr(), li, qk.data_ptr(),
                       qkv.data_ptr() + (q_size + kv_size) * qkv.element_size(), qkv.stride(0), H, Hk, D,
                       self.scaling, att.data_ptr(), threads)
            x.add_(layer.o(att))
            self._mlp(x, layer)
        for c, p, w in zip(caches, pasts, widths):
            c.length = p + w
        return x

    def _start(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows' embeddings (a new tensor, updated in place as the residual) and their rotary tables."""
        self._ensure_positions(int(positions.max()) + 1)
        cos = self._cos.index_select(0, positions).unsqueeze(1)         # (R, 1, D)
        sin = self._sin_signed.index_select(0, positions).unsqueeze(1)
        if self._embed_blocks is not None:
            return torch.from_numpy(embedding_rows(self._embed_blocks, ids.tolist())), cos, sin
        return F.embedding(ids, self.embed), cos, sin

    def _rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on the q and k heads of ``qkv`` at once: a new contiguous ``(R, H + Hk, D)``."""
        qk = qkv[:, : (self.n_heads + self.n_kv_heads) * self.head_dim].view(qkv.shape[0], -1, self.head_dim)
        return torch.addcmul(qk * cos, torch.roll(qk, self.head_dim // 2, -1), sin)

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> None:
        """The layer's second half, in place on the residual rows ``x``."""
        h = self._rms(x, layer.post_norm, self.eps)
        gu = layer.gate_up(h)
        act = F.silu(gu[:, : self.intermediate]).mul_(gu[:, self.intermediate:])
        x.add_(layer.down(act))

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm of residual rows ``x`` ``(R, hidden)``: what ``logits`` takes (row by row)."""
        return self._rms(x, self.final_norm, self.final_eps)

    @inference
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``lm_head`` of final-normed rows ``h`` ``(R, hidden)`` -> ``(R, vocab)``.

        Its cost grows with ``R`` (a 16-row product costs about twice a one-row
        one on a CPU), so callers compute only the rows they need.
        """
        return self.lm_head(h.contiguous())
