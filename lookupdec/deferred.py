"""A Llama GGUF's matrices left unread until something needs them as float32.

The quantized weight formats read a GGUF's Q4_1 / Q8_0 blocks straight from the file
(``blocks.FileBlocks``): a Decoder in those formats never uses the float32 matrices that
loading would dequantize from the same blocks. Dequantizing them anyway costs most of a
second and, for the embedded model, 538 MB at the peak (30 layers x 7 matrices, and the
embedding). So a model the Decoder loads itself may leave the decoder layers' matrices on the
meta device (``load_model(defer_matrices=True)``), and the embedding and ``lm_head`` where the
file keeps their blocks too (the quantized fast forward looks embeddings up in them):
``materialize`` reads them, bit for bit as loading would have (``gguf_tensors.read_llama_tensors``),
the moment anything else needs them (the float32 or float16 formats, transformers' forward,
timing the formats for ``--weights auto``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

# The decoder layers' matrices (transformers' names); the norms always load.
_LAYER_MATRIX = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")
# Read from blocks too by the quantized fast forward: its lm_head product, its embedding lookups.
_OUTER = ("model.embed_tokens.weight", "lm_head.weight")


def unread_error(what: str) -> ValueError:
    """The error for ``what`` (a matrix) that a deferred load left unread and whose file blocks cannot be read now."""
    return ValueError(f"{what} was never read (load_model(defer_matrices=True)) and its file's blocks cannot be "
                      "read now (the file changed or is gone): load the model again")


def deferrable(blocks: Mapping[str, object], names) -> tuple[str, ...]:
    """The matrices among ``names`` (a model's parameter names) that may stay unread: if the file
    keeps the blocks of every decoder layer's matrix (``blocks``: ``LoadedModel.blocks``), those, and
    the embedding and ``lm_head`` where it keeps theirs; else ``()``: a model some of whose layers the
    quantized formats could not read from the file is loaded whole.

    Example:
        >>> deferrable({"model.layers.0.mlp.up_proj.weight": 1}, ["model.layers.0.mlp.up_proj.weight",
        ...            "model.norm.weight", "model.embed_tokens.weight"])
        ('model.layers.0.mlp.up_proj.weight',)
    """
    matrices = tuple(n for n in names if _LAYER_MATRIX.fullmatch(n))
    if not matrices or not all(n in blocks for n in matrices):
        return ()
    return matrices + tuple(n for n in names if n in _OUTER and n in blocks)


@dataclass
class DeferredMatrices:
    """Matrices of a loaded model still on the meta device, and where to read them.

    Attributes:
        path: the ``.gguf`` file.
        heads, kv_heads: the model's attention and key/value heads (q and k are un-permuted).
        names: the parameters left unread (transformers' names).
        stamp: the file's (size, modification time in ns) when the model was loaded from it.
        unread: the names not read yet.
    """

    path: str
    heads: int
    kv_heads: int
    names: tuple[str, ...]
    stamp: tuple = ()
    unread: set = field(default=None)

    def __post_init__(self) -> None:
        if self.unread is None:
            self.unread = set(self.names)

    @property
    def pending(self) -> bool:
        """Whether some matrices are still unread."""
        return bool(self.unread)

    def materialize(self, model, layers: int | None = None) -> None:
        """Read the unread matrices into ``model``: all, or those of the first ``layers`` decoder layers
        and the embedding (what timing the weight formats reads: ``weights.MEASURE_LAYERS``). Each is
        read once; a tied ``lm_head`` is tied again to the embedding read.

        Raises:
            ValueError: the file changed since the model was loaded, or no longer reads.
            OSError: the file cannot be read.
        """
        wanted = {n for n in self.unread if layers is None or _layer_of(n) < layers}
        if not wanted:
            return
        import torch
        import torch.nn as nn

        from lookupdec.blocks import check_unchanged
        from lookupdec.gguf_tensors import read_llama_tensors

        check_unchanged(self.path, self.stamp)
        arrays = read_llama_tensors(self.path, self.heads, self.kv_heads, only=frozenset(wanted))
        if arrays is None or set(arrays) != wanted:
            raise ValueError(f"{self.path!r} no longer holds the matrices the model was loaded without; "
                             "load the model again")
        for name in sorted(wanted):
            owner, attr = name.rsplit(".", 1)
            module = model.get_submodule(owner)
            if tuple(getattr(module, attr).shape) != arrays[name].shape:
                raise ValueError(f"{self.path!r} changed since the model was loaded ({name} has another shape); "
                                 "load the model again")
            setattr(module, attr, nn.Parameter(torch.from_numpy(arrays.pop(name)), requires_grad=False))
            self.unread.discard(name)
        if "model.embed_tokens.weight" in wanted and getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()


def _layer_of(name: str) -> int:
    """The decoder layer of a layer matrix (``model.layers.<i>. ...``); -1 for the embedding and lm_head."""
    return int(name.split(".")[2]) if name.startswith("model.layers.") else -1
