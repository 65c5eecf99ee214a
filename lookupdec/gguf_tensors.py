"""A Llama GGUF file's tensors, dequantized under transformers' parameter names, read straight from the file.

transformers' ``load_gguf_checkpoint`` parses every metadata value (the tokenizer's tens of
thousands of strings, one numpy view each) and searches a name table per parameter: for the
embedded 135M model that is about 11 of the 19 seconds ``load_model`` took. The tensors need
neither: ``lookupdec.gguf_info.read_header`` gives each one's type, shape and place, the
``gguf`` package dequantizes the blocks (as transformers does), and a Llama model's names
follow one fixed pattern. The query and key matrices are un-permuted as transformers does
(llama.cpp's converter interleaves each head's rotary halves). The result is the same tensors,
bit for bit (``tests/test_gguf_tensors.py`` compares them with transformers' own).

Anything else (another architecture, a tensor this table does not name, a type the ``gguf``
package cannot dequantize) gives None, and the caller uses transformers' loader.
"""
from __future__ import annotations

import re
from typing import Collection

import numpy as np

from lookupdec.gguf_info import read_header

# GGUF name -> transformers' name for Llama models ({} is the layer number).
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
# Tensors transformers leaves out of a Llama model (it computes the rotary frequencies itself).
SKIPPED = frozenset({"rope_freqs.weight"})


def hf_name(gguf_name: str) -> str | None:
    """transformers' name of a Llama GGUF tensor, or None if this table does not name it.

    Example:
        >>> hf_name("blk.3.ffn_down.weight"), hf_name("output.weight"), hf_name("blk.0.attn_q.bias")
        ('model.layers.3.mlp.down_proj.weight', 'lm_head.weight', None)
    """
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = _LAYER_NAME.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.weight"
    return None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of a query or key matrix's rotary halves (``heads`` of them).

    Example:
        >>> unpermute(np.arange(4.0).reshape(4, 1), 1).ravel().tolist()   # rows 0 2 1 3 -> 0 1 2 3
        [0.0, 2.0, 1.0, 3.0]
    """
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def rotary_heads(gguf_name: str, heads: int, kv_heads: int) -> int:
    """The heads over which a tensor's rows are un-permuted: ``heads`` for the query matrix,
    ``kv_heads`` for the key matrix, 0 (none) for every other tensor.

    Example:
        >>> rotary_heads("blk.0.attn_k.weight", 9, 3), rotary_heads("blk.0.attn_v.weight", 9, 3)
        (3, 0)
    """
    return heads if ".attn_q." in gguf_name else kv_heads if ".attn_k." in gguf_name else 0


def read_llama_tensors(path: str, heads: int, kv_heads: int, header=None,
                       only: Collection[str] | None = None) -> dict[str, np.ndarray] | None:
    """Every tensor of a Llama GGUF file, dequantized to float32, under transformers' names.

    Args:
        path: the ``.gguf`` file.
        heads, kv_heads: the model's attention and key/value heads (for un-permuting q and k).
        header: the file's ``gguf_info.read_header`` when the caller has it (None: read here).
        only: read only the tensors of these names (None: all). Whether the reader applies is
            still judged on every tensor of the file.
    Returns:
        ``{name: array}`` in the file's order (arrays the caller owns; none maps the file), or None
        when this reader does not apply (see the module docstring).
    Raises:
        ValueError: not a GGUF file, or one whose header is malformed.
    """
    import gguf

    header = header or read_header(path)
    if header.architecture != "llama":
        return None
    wanted = {t: hf_name(t.name) for t in header.tensors if t.name not in SKIPPED}
    if any(name is None or t.type_id not in gguf.GGML_QUANT_SIZES for t, name in wanted.items()):
        return None
    data = np.memmap(path, np.uint8, "r")
    out = {}
    for t, name in wanted.items():
        if only is not None and name not in only:
            continue
        qtype = gguf.GGMLQuantizationType(t.type_id)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        cols, rows = t.shape[0], int(np.prod(t.shape[1:], dtype=np.int64))
        raw = np.array(data[t.offset: t.offset + rows * (cols // block) * size])  # a copy: nothing maps the file
        if len(raw) != rows * (cols // block) * size:
            raise ValueError(f"{path!r}: tensor {t.name} runs past the end of the file")
        try:
            w = gguf.quants.dequantize(raw.reshape(rows, -1), qtype).reshape(tuple(reversed(t.shape)))
        except NotImplementedError:  # a type gguf cannot dequantize: transformers' loader says so
            return None
        permute = rotary_heads(t.name, heads, kv_heads)
        out[name] = np.ascontiguousarray(unpermute(w, permute) if permute else w)
    del data
    return out


def llama_file_blocks(path: str, heads: int, kv_heads: int, header=None) -> dict:
    """Where a Llama GGUF file keeps each Q4_1 or Q8_0 matrix, under transformers' names.

    Args:
        path: the ``.gguf`` file.
        heads, kv_heads: the model's attention and key/value heads (the query and key rows are
            un-permuted as ``read_llama_tensors`` un-permutes them).
        header: the file's ``gguf_info.read_header`` when the caller has it (None: read here).
    Returns:
        ``{name: lookupdec.blocks.FileBlocks}`` (nothing is read yet); empty for another
        architecture.
    Raises:
        ValueError: not a GGUF file, or one whose header is malformed.
    """
    from lookupdec.blocks import GGML_TYPES, FileBlocks, file_stamp

    header = header or read_header(path)
    if header.architecture != "llama":
        return {}
    stamp = file_stamp(path)
    out = {}
    for t in header.tensors:
        name = hf_name(t.name)
        if name is None or t.type_id not in GGML_TYPES or len(t.shape) != 2:
            continue
        out[name] = FileBlocks(path, t.offset, GGML_TYPES[t.type_id], (t.shape[1], t.shape[0]),
                               rotary_heads(t.name, heads, kv_heads), stamp)
    return out
