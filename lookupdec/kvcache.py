"""KV cache for tree verification: grow in place, keep only the accepted rows.

transformers' ``DynamicLayer`` concatenates on every update, copying the whole
cache each step. ``BufferedLayer`` instead writes new rows into a
preallocated buffer and exposes ``keys``/``values`` as views of its first
``length`` rows, so a step costs O(new rows), never O(cache).

After a verify forward the cache holds ``past + T`` rows: the root, every
tree node and any padding. ``keep_rows`` moves the accepted path's rows to
``past + 1 ..`` in place and drops the rest (``crop``). It works on any
layer whose ``keys``/``values`` are ``(batch, heads, seq, dim)`` tensors, so it
serves both ``BufferedLayer`` and plain ``DynamicLayer`` caches. ``new_cache``
puts its layers' buffers in one ``LayerStore`` tensor where their shapes agree,
so the move is one indexed copy for all of them, not four operations a layer.

``FlatKVCache`` is the cache of the fast CPU forward (``lookupdec.fast_forward``):
one tensor ``(layers, 2, kv_heads, capacity, head_dim)`` holding every
layer's keys and values, each kv head's rows contiguous in sequence position
(what the decode attention streams), so a commit moves the accepted rows of
all layers and heads with one indexed copy. Its elements are float32, or float16
(``KV_DTYPES``: half the bytes a step reads and keeps per cached token).
"""
from __future__ import annotations

import functools
import inspect
from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from lookupdec._native import KV_FLOAT16, KV_FLOAT32


# The element types a ``FlatKVCache`` may hold, by the name the API and the CLI use (``kv_dtype``).
KV_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def check_kv_dtype(kv_dtype: str, unsupported: str = "") -> torch.dtype:
    """The torch dtype of a KV cache element type named ``kv_dtype`` (a key of ``KV_DTYPES``).

    ``unsupported``: why the fast forward cannot serve the model ("" where it does): then only
    "float32" is taken (transformers' forward keeps its own float32 cache).

    Raises:
        ValueError: any other value, naming the choices; a float16 cache where the fast forward
            cannot run, naming why and the fix.
    """
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    if kv_dtype != "float32" and unsupported:
        raise ValueError(f"kv_dtype={kv_dtype!r} (--kv-dtype {kv_dtype}) needs lookupdec's fast forward, which this "
                         f"model cannot use: {unsupported}; use --kv-dtype float32")
    return KV_DTYPES[kv_dtype]


def kv_format(kv: torch.Tensor) -> int | None:
    """The native attention's code for a ``FlatKVCache``'s tensor (``KV_FLOAT32`` / ``KV_FLOAT16``);
    None where it cannot take it (another dtype, not contiguous)."""
    if not kv.is_contiguous():
        return None
    return KV_FLOAT32 if kv.dtype == torch.float32 else KV_FLOAT16 if kv.dtype == torch.float16 else None


def check_half_range(rows: torch.Tensor) -> None:
    """Raise where new keys or values written to a float16 cache by torch (the SDPA prefill) would become
    infinite: the native attention checks its own writes (``ext/csrc/attention.h``, LK_ERANGE).

    Raises:
        ValueError: some ``|x| >= 65520``, naming the fix.
    """
    if bool((rows.abs() >= 65520).any()):
        raise ValueError("a key or value of this model reached float16's range (65,504), which a float16 KV cache "
                         "cannot hold; use kv_dtype='float32' (--kv-dtype float32)")


class LayerStore:
    """The keys and values of a cache's layers in one tensor, so that a commit moves the accepted
    rows of every layer with one indexed copy (two kernels, not four a layer: on a GPU each is a
    launch, and the 30 layers of the embedded model made a commit ~120 of them).

    Attributes:
        kv: ``(layers, 2, batch, kv_heads, capacity, head_dim)``, allocated at the first layer's
            first update from its shape; layers whose keys have another shape, dtype or device
            (or whose values differ from their keys in shape) keep buffers of their own.
        layers: its ``n_layers`` ``BufferedLayer``s (index = layer number), made with it.
    """

    def __init__(self, n_layers: int, capacity: int) -> None:
        self.capacity = max(int(capacity), 1)
        self.kv: torch.Tensor | None = None
        self.layers = [BufferedLayer(self.capacity, self, i) for i in range(n_layers)]

    def fits(self, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Whether a layer with these first states can live in the store (allocating it on first use)."""
        if keys.shape != values.shape or keys.dtype != values.dtype:
            return False
        if self.kv is None:
            b, h, _, d = keys.shape
            self.kv = keys.new_empty((len(self.layers), 2, b, h, self.capacity, d))
            return True
        kv = self.kv
        return keys.dtype == kv.dtype and keys.device == kv.device and \
            (keys.shape[0], keys.shape[1], keys.shape[3]) == (kv.shape[2], kv.shape[3], kv.shape[5])

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` rows in every layer (one copy of the whole store when it grows)."""
        cap = self.kv.shape[4]
        if needed <= cap:
            return
        kv = self.kv.new_empty((*self.kv.shape[:4], max(needed, 2 * cap), self.kv.shape[5]))
        kv[:, :, :, :, :cap] = self.kv
        self.kv = kv
        for layer in self.layers:
            if layer.shared:
                layer._attach(self.kv[layer.index, 0], self.kv[layer.index, 1])


class BufferedLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by a preallocated buffer that grows geometrically: its own, or
    its slice of the cache's ``LayerStore``.

    Invariant: ``self.keys`` is ``self._kbuf[:, :, :length]`` (a view), so the
    inherited ``get_seq_length`` and ``crop`` (which slices the view) stay valid.
    """

    def __init__(self, capacity: int = 256, store: LayerStore | None = None, index: int = 0) -> None:
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self.store, self.index, self.shared = store, int(index), False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.shared = self.store is not None and self.store.fits(key_states, value_states)
        if self.shared:
            kbuf, vbuf = self.store.kv[self.index, 0], self.store.kv[self.index, 1]
        else:
            kbuf = key_states.new_empty((b, h, self.capacity, d))
            vbuf = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.keys = self.values = None
        self._attach(kbuf, vbuf)
        self.is_initialized = True

    def _attach(self, kbuf: torch.Tensor, vbuf: torch.Tensor) -> None:
        """Point at (new) buffers, keeping the valid rows' count."""
        length = 0 if self.keys is None else self.keys.shape[2]
        self._kbuf, self._vbuf = kbuf, vbuf
        self.keys = kbuf[:, :, :length]
        self.values = vbuf[:, :, :length]

    def _reserve(self, needed: int) -> None:
        if self.shared:
            self.store.reserve(needed)
            return
        if needed <= self._kbuf.shape[2]:
            return
        cap = max(needed, 2 * self._kbuf.shape[2])
        length = self.keys.shape[2]
        kbuf = self._kbuf.new_empty((*self._kbuf.shape[:2], cap, self._kbuf.shape[3]))
        vbuf = self._vbuf.new_empty((*self._vbuf.shape[:2], cap, self._vbuf.shape[3]))
        kbuf[:, :, :length] = self.keys
        vbuf[:, :, :length] = self.values
        self._kbuf, self._vbuf = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        self._reserve(end)
        self._kbuf[:, :, start:end] = key_states
        self._vbuf[:, :, start:end] = value_states
        self.keys = self._kbuf[:, :, :end]
        self.values = self._vbuf[:, :, :end]
        return self.keys, self.values

    def reset(self) -> None:
        if self.is_initialized:
            self.keys = self._kbuf[:, :, :0]
            self.values = self._vbuf[:, :, :0]


# Attention kinds whose keys and values are rows of a KV cache that can be kept or
# dropped one by one (a sliding window is applied by the mask, over a full cache).
ROW_ATTENTION = ("full_attention", "sliding_attention")
# Families whose layers keep a recurrent state instead (or beside) a KV cache.
RECURRENT_MODEL_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "jamba", "zamba", "zamba2",
                         "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2", "qwen3_next", "xlstm",
                         "minimax", "plamo2")


def unsupported_attention(config) -> str:
    """Why lookupdec cannot verify drafts on a model ("" when it can).

    Verification appends draft rows to the KV cache and drops the rejected
    ones; layers with a recurrent state (Mamba, linear attention, RWKV, ...)
    fold every row into that state, so a rejected draft cannot be undone.

    Example:
        >>> from transformers import LlamaConfig
        >>> unsupported_attention(LlamaConfig(num_hidden_layers=2))
        ''
    """
    text = config.get_text_config(decoder=True)
    model_type = getattr(text, "model_type", "") or ""
    if model_type in RECURRENT_MODEL_TYPES:
        return f"model_type {model_type!r} keeps a recurrent state in (some of) its layers"
    kinds = sorted({t for t in (getattr(text, "layer_types", None) or ()) if t not in ROW_ATTENTION})
    if kinds:
        return f"its layers include {', '.join(kinds)}, which keep a recurrent state instead of cache rows"
    return ""


def all_full_attention(config) -> bool:
    """True when every decoder layer is plain full attention (no sliding window, no linear attention)."""
    text = config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is None:
        return getattr(text, "sliding_window", None) is None or not getattr(text, "use_sliding_window", True)
    return all(t == "full_attention" for t in layer_types)


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_cache(model, cache) -> dict:
    """The keyword argument that hands ``cache`` to ``model``'s forward.

    transformers renamed ``past_key_values`` to ``cache`` (5.24 warns that the
    old name goes in 5.40); the name the model's own ``forward`` declares is used,
    so both older and newer releases get their own.

    Example:
        >>> sorted(with_cache(tiny_llama, None))     # doctest: +SKIP
        ['cache']
    """
    return {_cache_keyword(type(model)): cache}


def new_cache(config, capacity: int) -> DynamicCache:
    """A cache for one sequence of up to ``capacity`` rows (it grows if needed).

    Every layer is a ``BufferedLayer`` that keeps every row, sliding-window
    layers included: transformers applies a layer's window through the
    attention mask (from the positions), so keeping older rows changes no
    output, and it lets a step drop the rows of rejected drafts, which a
    window-sized layer would already have pushed its older rows out for.
    """
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    store = LayerStore(n_layers, capacity)
    return BufferedCache(store.layers, store)


class BufferedCache(DynamicCache):
    """A ``DynamicCache`` (so transformers treats it as one) made of ``BufferedLayer`` layers,
    most of them in one ``LayerStore`` (``store``; None: each layer has its own buffer)."""

    def __init__(self, layers: list[BufferedLayer], store: LayerStore | None = None) -> None:
        # Cache.__init__ with explicit layers: what DynamicCache(config=...) does, with our layer class.
        Cache.__init__(self, layers=layers)
        self.store = store


class FlatKVCache:
    """Keys and values of every layer in one preallocated tensor (grows geometrically).

    Attributes:
        kv: ``(layers, 2, kv_heads, capacity, head_dim)``; ``kv[l, 0]`` keys, ``kv[l, 1]``
            values of layer ``l``; rows ``0..length-1`` are valid. Head-major: the decode
            attention streams each kv head's rows from one contiguous block (one new row over
            1,500 cached rows, 30 layers, 2-core AMD EPYC: 2.8 ms, against 5.9 when each row held
            every head, one head's 256 bytes in every 768).
        length: number of valid rows (positions in the sequence).

    Example:
        >>> c = FlatKVCache(layers=2, kv_heads=1, head_dim=4, capacity=8)
        >>> c.reserve(20); c.capacity >= 20, c.length
        (True, 0)
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype = torch.float32, device="cpu") -> None:
        self.kv = torch.empty((layers, 2, kv_heads, max(int(capacity), 1), head_dim), dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        """Rows the cache holds before it grows."""
        return self.kv.shape[3]

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` rows (copies the valid rows once when it grows)."""
        cap = self.capacity
        if needed <= cap:
            return
        layers, _, heads, _, dim = self.kv.shape
        kv = self.kv.new_empty((layers, 2, heads, max(needed, 2 * cap), dim))
        kv[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = kv

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Keep the first ``length`` rows (a negative value drops that many rows from the end)."""
        self.length = self.length + length if length < 0 else min(self.length, length)

    def keep_rows(self, past: int, rows: Sequence[int]) -> None:
        """See ``keep_rows``: rows ``0..past-1`` stay, ``rows`` move to ``past, past+1, ...``."""
        rows = list(rows)
        same = 0
        while same < len(rows) and rows[same] == past + same:
            same += 1
        new_len = past + len(rows)
        assert new_len <= self.length, (new_len, self.length)
        if same < len(rows):
            src = torch.tensor(rows[same:], dtype=torch.long, device=self.kv.device)
            # index_select copies the source rows first: overlapping ranges are safe.
            self.kv[:, :, :, past + same:new_len] = self.kv.index_select(3, src)
        self.length = new_len


def _all_stored(cache) -> bool:
    store = getattr(cache, "store", None)
    return store is not None and store.kv is not None and all(getattr(layer, "shared", False) for layer in cache.layers)


def uniform_layers(cache: DynamicCache) -> bool:
    """Whether every layer of ``cache`` holds keys and values of one shape, dtype and device (so the
    layers stack into one tensor: ``stored_rows``)."""
    if _all_stored(cache):
        return True
    layers = cache.layers
    if not layers or not all(getattr(layer, "is_initialized", False) for layer in layers):
        return False
    k = layers[0].keys
    return all(x.shape == k.shape and x.dtype == k.dtype and x.device == k.device
               for layer in layers for x in (layer.keys, layer.values))


def stored_rows(cache: DynamicCache, past: int) -> torch.Tensor:
    """The first ``past`` rows of every layer, ``(layers, 2, batch, kv_heads, past, head_dim)``.

    A view of the cache's ``LayerStore`` when every layer lives there; else a stacked copy.
    """
    if _all_stored(cache):
        return cache.store.kv[:, :, :, :, :past]
    return torch.stack([torch.stack([layer.keys[:, :, :past], layer.values[:, :, :past]]) for layer in cache.layers])


def append_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Append ``rows`` ``(layers, 2, batch, kv_heads, w, head_dim)`` to every layer of ``cache``
    (one copy when every layer lives in the cache's ``LayerStore``), as a forward of ``w`` rows would."""
    if not _all_stored(cache):
        for i, layer in enumerate(cache.layers):
            layer.update(rows[i, 0], rows[i, 1])
        return
    store = cache.store
    start = cache.layers[0].keys.shape[2]
    end = start + rows.shape[4]
    store.reserve(end)
    store.kv[:, :, :, :, start:end] = rows
    for layer in cache.layers:
        layer.keys = layer._kbuf[:, :, :end]
        layer.values = layer._vbuf[:, :, :end]


def keep_rows(cache: DynamicCache, past: int, rows: Sequence[int]) -> None:
    """Keep rows ``0..past-1`` plus ``rows`` (absolute, ascending, all >= past); drop the rest.

    The kept ``rows`` end up at ``past, past+1, ...`` in order. Only the moved
    rows are copied (rows already in place are skipped), never the whole cache.

    Args:
        cache: a cache whose layers hold ``(batch, heads, seq, dim)`` keys and values.
        past: rows below this index are committed and untouched.
        rows: absolute indices of the rows to keep, ascending, each ``>= past``.
    Example:
        After verifying root+3 nodes on a 10-row past (rows 10..13) and accepting
        nodes 0 and 2: ``keep_rows(cache, 10, [10, 11, 13])`` leaves 13 rows.
    """
    if isinstance(cache, FlatKVCache):
        cache.keep_rows(past, rows)
        return
    rows = list(rows)
    # Rows already in place (the root and a prefix of the chain) need no copy.
    same = 0
    while same < len(rows) and rows[same] == past + same:
        same += 1
    new_len = past + len(rows)
    if same < len(rows):
        device = cache.layers[0].keys.device
        src = torch.tensor(rows[same:], dtype=torch.long, device=device)
        lo, hi = past + same, new_len
        store = getattr(cache, "store", None)
        if store is not None and store.kv is not None:
            # Every shared layer's rows in one copy (index_select copies the sources first).
            store.kv[:, :, :, :, lo:hi] = store.kv.index_select(4, src)
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", False) or getattr(layer, "shared", False):
                continue
            # index_select copies the few source rows first, so overlapping
            # source and destination ranges are safe.
            layer.keys[:, :, lo:hi] = layer.keys.index_select(2, src)
            layer.values[:, :, lo:hi] = layer.values.index_select(2, src)
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            extra = layer.keys.shape[2] - new_len
            assert extra >= 0, (layer.keys.shape, new_len)
            if extra:
                layer.crop(-extra)
