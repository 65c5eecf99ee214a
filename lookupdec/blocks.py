"""Recovering GGML's Q4_1 and Q8_0 blocks from float32 weights that were dequantized from them.

A GGUF model's quantized matrices reach lookupdec as float32 (transformers'
loader dequantizes them: ``w = d * q + m`` per block of 32 along a row, with
``d``, ``m`` float16). The "quantized" weight format keeps the blocks instead
and dequantizes inside the product (``lookupdec._native.qmatmul_ptr``): a
quarter to an eighth of float32's bytes per forward, and the same weight
values. This module finds the blocks back from the float32 values and checks
that they reproduce every value bit for bit; a matrix that is not exactly a
dequantized Q4_1 or Q8_0 matrix (any float32 checkpoint, a row permuted
inside a block, a value edited) has no blocks, and the format refuses it.

Layouts (what ext/csrc/qmatmul.h reads):

- Q4_1: ``qs`` uint8 ``(N, K // 2)``: per block 16 bytes, element ``j`` in the low
  nibble of byte ``j`` and element ``j + 16`` in its high nibble; ``dm`` float16
  ``(N, K // 16)``: ``(d, m)`` per block.
- Q8_0: ``qs`` int8 as uint8 ``(N, K)``; ``dm`` float16 ``(N, K // 32)``: ``d`` per block.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from lookupdec._native import dequant_rows

QK = 32  # weights per block
BLOCK_FORMATS = ("q4_1", "q8_0")
# GGML's type id and bytes per block of each format (the scales first: (d, m) or d, float16; then the quants).
GGML_TYPES = {3: "q4_1", 8: "q8_0"}
_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}


class Blocks(NamedTuple):
    """A matrix in one block format: ``fmt`` ("q4_1" or "q8_0"), ``qs`` (uint8), ``dm`` (float16), ``shape`` (N, K)."""

    fmt: str
    qs: np.ndarray
    dm: np.ndarray
    shape: tuple


def dequantize(blocks: Blocks) -> np.ndarray:
    """The float32 matrix ``blocks`` stands for, formed as GGML forms it (``d * q + m``, one rounding)."""
    n, k = blocks.shape
    if blocks.fmt == "q4_1":
        packed = blocks.qs.reshape(n, k // QK, 16)
        q = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.float32)
        dm = blocks.dm.reshape(n, k // QK, 2).astype(np.float32)
        return (dm[..., :1] * q + dm[..., 1:]).reshape(n, k)  # d * q is exact in float32
    q = blocks.qs.view(np.int8).reshape(n, k // QK, QK).astype(np.float32)
    return (blocks.dm.reshape(n, k // QK, 1).astype(np.float32) * q).reshape(n, k)


def dequantize_rows(blocks: Blocks, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of ``dequantize(blocks)``, the same values, dequantizing only those (an embedding
    lookup). A row outside the matrix is an IndexError, as in ``torch.nn.functional.embedding``.

    Example:
        >>> w = np.array([[0.5 * (j % 16) - 2.0 + r for j in range(32)] for r in range(3)], dtype=np.float32)
        >>> bool((dequantize_rows(find_blocks(w), np.array([2, 0])) == w[[2, 0]]).all())
        True
    """
    rows = np.asarray(rows, np.int64)
    n, k = blocks.shape
    if rows.size and (rows.min() < 0 or rows.max() >= n):  # numpy would wrap a negative row around
        raise IndexError(f"rows must be in [0, {n}), got {rows.min()}..{rows.max()}")
    return dequantize(Blocks(blocks.fmt, blocks.qs[rows], blocks.dm[rows], (len(rows), k)))


def native_layout(blocks: Blocks) -> bool:
    """Whether the native row routines read ``blocks`` as they are (2-D contiguous uint8 blocks and
    float16 scales): ``dequant_rows`` here, a one-call step's embedding (``native_layers``)."""
    qs, dm = blocks.qs, blocks.dm
    return (qs.ndim == 2 and dm.ndim == 2 and qs.dtype == np.uint8 and dm.dtype == np.float16
            and qs.flags.c_contiguous and dm.flags.c_contiguous)


def embedding_rows(blocks: Blocks, rows: list[int]) -> np.ndarray:
    """``dequantize_rows`` for an embedding lookup right after a forward: one native call when the
    blocks' arrays are contiguous (~160 us of numpy calls a step otherwise, 2-core AMD EPYC VM), the
    same values; ``rows`` a list of ints."""
    if native_layout(blocks):
        return dequant_rows(blocks.fmt, blocks.qs, blocks.dm.view(np.uint16), rows, blocks.shape[1])
    return dequantize_rows(blocks, np.array(rows, np.int64))


def _q4_1(w: np.ndarray) -> Blocks | None:
    n, k = w.shape
    b = w.reshape(n, k // QK, QK)
    lo = b.min(-1)
    m16 = lo.astype(np.float16)
    if not np.array_equal(m16.astype(np.float32), lo):
        return None
    # The block's largest value is d * 15 + m (the quantizer maps the range onto 0..15).
    d16 = ((b.max(-1).astype(np.float64) - lo) / 15).astype(np.float16)
    d = d16.astype(np.float32)
    safe = np.where(d > 0, d, 1)[..., None]
    q = np.clip(np.rint((b - lo[..., None]) / safe), 0, 15).astype(np.uint8)
    q[d == 0] = 0
    if not np.array_equal(d[..., None] * q.astype(np.float32) + lo[..., None], b):
        return None
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, k // 2)
    return Blocks("q4_1", np.ascontiguousarray(qs), np.stack([d16, m16], -1).reshape(n, k // 16), (n, k))


def _q8_0(w: np.ndarray) -> Blocks | None:
    n, k = w.shape
    b = w.reshape(n, k // QK, QK)
    # The block's largest magnitude is d * 127.
    d16 = (np.abs(b).max(-1).astype(np.float64) / 127).astype(np.float16)
    d = d16.astype(np.float32)
    safe = np.where(d > 0, d, 1)[..., None]
    q = np.clip(np.rint(b / safe), -127, 127).astype(np.int8)
    q[d == 0] = 0
    if not np.array_equal(d[..., None] * q.astype(np.float32), b):
        return None
    return Blocks("q8_0", np.ascontiguousarray(q.reshape(n, k).view(np.uint8)), np.ascontiguousarray(d16), (n, k))


def find_blocks(w: np.ndarray) -> Blocks | None:
    """The Q4_1 (tried first: fewer bytes) or Q8_0 blocks whose dequantization is ``w`` bit for bit; None if neither.

    Args:
        w: a float32 matrix (N, K); K must be a multiple of 32.

    Example:
        >>> w = np.array([[0.5 * (j % 16) - 2.0 for j in range(32)]], dtype=np.float32)
        >>> find_blocks(w).fmt, np.array_equal(dequantize(find_blocks(w)), w)
        ('q4_1', True)
        >>> find_blocks(np.full((1, 32), 0.1, np.float32)) is None  # 0.1 is no float16 scale times an integer
        True
    """
    if w.ndim != 2 or w.dtype != np.float32 or w.shape[1] % QK or not np.isfinite(w).all():
        return None
    with np.errstate(all="ignore"):
        return _q4_1(w) or _q8_0(w)


def concat_rows(parts: Sequence[Blocks]) -> Blocks | None:
    """The blocks of the row-wise concatenation of ``parts`` (as ``np.concatenate`` of the matrices);
    None when they differ in format or width.

    Example:
        >>> w = np.array([[0.5 * (j % 16) - 2.0 for j in range(32)]], dtype=np.float32)
        >>> concat_rows([find_blocks(w), find_blocks(2 * w)]).shape
        (2, 32)
    """
    if not parts or len({(b.fmt, b.shape[1]) for b in parts}) != 1:
        return None
    return Blocks(parts[0].fmt, np.concatenate([b.qs for b in parts]), np.concatenate([b.dm for b in parts]),
                  (sum(b.shape[0] for b in parts), parts[0].shape[1]))


def file_stamp(path: str) -> tuple[int, int]:
    """A file's (size, modification time in ns): what tells that it changed since it was read."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def check_unchanged(path: str, stamp: tuple) -> None:
    """ValueError if ``path`` no longer has ``stamp`` (``file_stamp`` when the model was loaded; () checks nothing)."""
    if stamp and file_stamp(path) != tuple(stamp):
        raise ValueError(f"{path!r} changed since the model was loaded from it; load the model again")


@dataclass(frozen=True)
class FileBlocks:
    """Where a GGUF file keeps one Q4_1 or Q8_0 matrix: its blocks, read from the file on demand.

    ``find_blocks`` recovers the same blocks from the dequantized float32 matrix, checking every
    value (about 1.8 s for all of the embedded model's); reading them takes about 0.2 s. The
    caller vouches that the matrix it holds is still this file's (``FastForward`` reads them
    only for a model the Decoder loaded itself); a file changed since (another size or time
    than ``stamp``) is refused.

    Attributes:
        path: the ``.gguf`` file.
        offset: the tensor's first byte in it.
        fmt: "q4_1" or "q8_0".
        shape: ``(N, K)`` as the matrix is used (rows = output features).
        heads: undo llama.cpp's rotary interleave of the rows over this many heads
            (``gguf_tensors.unpermute``; the query and key matrices), 0 for none.
        stamp: the file's (size, modification time in ns) when the weights were read from it.
    """

    path: str
    offset: int
    fmt: str
    shape: tuple
    heads: int = 0
    stamp: tuple = ()

    def load(self) -> Blocks:
        """The matrix's blocks, in ``Blocks``' layout.

        Raises:
            ValueError: the file changed since ``stamp``, or ends before the tensor does.
            OSError: the file cannot be read.
        """
        check_unchanged(self.path, self.stamp)
        n, k = self.shape
        per_row = k // QK
        size = _BLOCK_BYTES[self.fmt]
        raw = np.fromfile(self.path, np.uint8, count=n * per_row * size, offset=self.offset)
        if raw.size != n * per_row * size:
            raise ValueError(f"{self.path!r}: a {self.fmt} tensor at byte {self.offset} runs past the end of the file")
        raw = raw.reshape(n, per_row, size)
        scales = 4 if self.fmt == "q4_1" else 2
        dm = np.ascontiguousarray(raw[..., :scales]).view(np.float16).reshape(n, per_row * scales // 2)
        qs = np.ascontiguousarray(raw[..., scales:]).reshape(n, per_row * (size - scales))
        if self.heads:
            from lookupdec.gguf_tensors import unpermute

            qs, dm = np.ascontiguousarray(unpermute(qs, self.heads)), np.ascontiguousarray(unpermute(dm, self.heads))
        return Blocks(self.fmt, qs, dm, (n, k))
