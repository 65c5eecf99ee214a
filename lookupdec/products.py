"""The fast forward's linear products, one class per weight format.

``make_linear(weight, bias, weights)`` prepacks a weight once and returns a
callable ``x (R, in) float32 -> (R, out) float32``: "float32" keeps the
model's values in oneDNN's blocked layout (``_Linear``); "float16" rounds them
to float16 once for fbgemm, activations and accumulation staying float32
(``_LinearF16``); "quantized" keeps the GGML blocks the values were
dequantized from and multiplies with lookupdec's native kernel
(``_LinearQuant``, ext/csrc/qmatmul.c); "quantized-bf16" rounds those weights and the
inputs to bfloat16 in the product (``_LinearQuantBF16``); "quantized-int8" rounds the inputs to 8 bits
per block of 32 and sums each block in integers, as llama.cpp does (``_LinearQuantI8``).
``WEIGHT_FORMATS`` lists the formats;
``weights_unavailable_reason`` says why this torch or CPU cannot run one.
"""
from __future__ import annotations

from typing import Union

import torch

from lookupdec.deferred import unread_error
from lookupdec._native import (QMATMUL_BF16, QMATMUL_FORMATS, QMATMUL_I8, qmatmul_bf16_native, qmatmul_i8_native,
                               qmatmul_ptr, qpack_i8)

# Products with fewer rows are padded to this many (see _Linear.__call__).
MIN_PRODUCT_ROWS = 4
# The largest finite float16: weights beyond it cannot be stored in the float16 format.
FLOAT16_MAX = 65504.0


class _Linear:
    """``y = x @ W.T + b`` with ``W`` prepacked for oneDNN in float32; ``x`` and ``y`` are dense 2-D float32 tensors."""

    __slots__ = ("weight", "bias", "out_features")
    weights = "float32"  # the weight format (WEIGHT_FORMATS)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().float().contiguous()
        self.out_features = weight.shape[0]
        # oneDNN's blocked weight layout (no batch-size hint: one layout serves every width).
        # On this CPU it makes the products 1.1x (one row) to 1.6x (16 rows) faster than the
        # plain layout of ``to_mkldnn()`` with outputs equal to within float rounding.
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows < MIN_PRODUCT_ROWS:
            # oneDNN's kernels for 1-2 rows are slower than its kernel for 4 on this
            # layout (30 layers' products: ~17 ms at 1 row vs ~14 ms at 4): pad with
            # zero rows (each output row depends on its input row only) and drop them.
            return torch.ops.mkldnn._linear_pointwise(_padded(x), self.weight, self.bias, "none", [], "")[:rows]
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class _LinearF16:
    """``y = x @ W16.T + b``: ``W`` rounded to float16 once and prepacked for fbgemm.

    Activations, accumulation, bias and output stay float32 (fbgemm converts the
    weights back to float32 inside its kernel), so the only change from the
    float32 format is the weights' rounding to float16: the product equals a
    float64 product with float16-rounded weights up to float32 rounding
    (tests/test_weights.py checks it against that oracle).
    """

    __slots__ = ("packed", "out_features", "min_rows")
    weights = "float16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().float().contiguous()
        big = float(weight.abs().max()) if weight.numel() else 0.0
        if not big <= FLOAT16_MAX:  # also catches nan
            raise ValueError(f"a weight of magnitude {big:.4g} does not fit float16 (largest {FLOAT16_MAX:g}): "
                             "use weights='float32' (--weights float32) for this model")
        self.out_features = weight.shape[0]
        self.packed = torch.ops.quantized.linear_prepack_fp16(
            weight, None if bias is None else bias.detach().float().contiguous())
        # Products of fewer rows than this are padded (see __call__); 1 where this CPU's kernel
        # rounds small products like the rows of a wider one.
        self.min_rows = 1 if _small_products_round_alike(self.packed, weight.shape[1]) else MIN_PRODUCT_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows < self.min_rows:
            # fbgemm's AVX2 kernel computes a block of 1 or 2 rows with another
            # summation order than its main kernel (measured: bitwise differences
            # for 1-2 rows, none for 3-6): padding to 4 rows makes a one-row step
            # round like the same row inside a wider verify forward. Where the
            # small products round alike (measured on an AVX-512 Xeon) the padding
            # is skipped: it cost ~4 ms of a one-row forward's products there.
            return torch.ops.quantized.linear_dynamic_fp16(_padded(x), self.packed)[:rows]
        return torch.ops.quantized.linear_dynamic_fp16(x.contiguous(), self.packed)


class _LinearQuant:
    """``y = x @ W.T + b`` with ``W`` kept in the GGML blocks it was dequantized from (Q4_1 or Q8_0).

    ``lookupdec.blocks.find_blocks`` recovers the blocks from the float32 weights and checks
    that they reproduce every value (or the caller hands over the blocks the weights were
    dequantized from, read from the file: ``blocks.FileBlocks``); the product (ext/csrc/qmatmul.c) dequantizes them as
    GGML does, so it reads the same weight values as the float32 format from 6 (Q4_1) or
    9 (Q8_0) bits each (the file's 4.5 and 8.5, scales widened to float32). Activations,
    accumulation, bias and output are float32, and each output row is summed in one fixed
    order whatever the other rows are (row-independent bit for bit, so no padding is needed).
    """

    __slots__ = ("fmt", "qs", "dm", "bias", "out_features", "in_features")
    weights = "quantized"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, blocks=None) -> None:
        from lookupdec.blocks import find_blocks

        if blocks is None:
            blocks = find_blocks(weight.detach().float().contiguous().numpy())
        elif blocks.shape != tuple(weight.shape):
            raise ValueError(f"blocks of shape {blocks.shape} for a weight of shape {tuple(weight.shape)}")
        if blocks is None:
            raise ValueError("these weights are not GGML Q4_1 or Q8_0 blocks dequantized to float32 (the quantized "
                             "format keeps such blocks: it serves GGUF files stored in them)")
        self.fmt = QMATMUL_FORMATS[blocks.fmt]
        self.qs = torch.from_numpy(blocks.qs)
        self.dm = torch.from_numpy(blocks.dm.astype("float32"))  # the kernel reads float32 scales
        self.out_features, self.in_features = blocks.shape
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"expected a float32 (rows, {self.in_features}) input, got {x.dtype} {tuple(x.shape)}")
        y = torch.empty(x.shape[0], self.out_features)
        qmatmul_ptr(self.fmt, x.data_ptr(), x.shape[0], self.in_features, self.qs.data_ptr(), self.dm.data_ptr(),
                    self.out_features, y.data_ptr(), torch.get_num_threads())
        return y if self.bias is None else y.add_(self.bias)


class _LinearQuantBF16(_LinearQuant):
    """``_LinearQuant`` with bfloat16 products: each weight (as GGML forms it) and each input
    element rounded to bfloat16, the products summed in float32 (AVX-512 BF16 dot products of
    pairs: twice the multiply-adds of float32 per instruction). Still one fixed order per output,
    row-independent bit for bit. The rounding changes the model (weights to 8 significant bits):
    the format is offered, never chosen by ``auto``.
    """

    __slots__ = ()
    weights = "quantized-bf16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, blocks=None) -> None:
        super().__init__(weight, bias, blocks)
        self.fmt |= QMATMUL_BF16


class _LinearQuantI8(_LinearQuant):
    """``_LinearQuant`` with 8-bit activations: each input row rounded to 8 bits per block of 32
    (its own scale, the block's largest magnitude over 127), each block's sum taken in integers
    against the weights' own 4- or 8-bit integers (AVX-512 VNNI: 64 multiply-adds an instruction,
    against float32's 16; AVX2's byte and word multiply-adds elsewhere), then scaled by the two blocks'
    scales. This is how llama.cpp multiplies
    these blocks. The weights are repacked for it once (16 outputs in a vector's lanes; same
    bytes). Still one fixed order per output, row-independent bit for bit, so a row of a wide
    verify forward is the row a one-row step computes. The rounding changes the model (the inputs
    to 8 bits a block): the format is offered, never chosen by ``auto``.
    """

    __slots__ = ()
    weights = "quantized-int8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, blocks=None) -> None:
        super().__init__(weight, bias, blocks)
        pq, pdm = qpack_i8(self.fmt, self.qs.numpy(), self.dm.numpy(), self.out_features, self.in_features)
        self.qs, self.dm = torch.from_numpy(pq), torch.from_numpy(pdm)
        self.fmt |= QMATMUL_I8


def _padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fewer than ``MIN_PRODUCT_ROWS`` rows) with zero rows below it up to that many."""
    xp = x.new_zeros((MIN_PRODUCT_ROWS, x.shape[1]))
    xp[:x.shape[0]] = x
    return xp


def _small_products_round_alike(packed, in_features: int) -> bool:
    """Whether fbgemm's products of 1 to ``MIN_PRODUCT_ROWS - 1`` rows equal, bit for bit, the same
    rows inside a product of ``2 * MIN_PRODUCT_ROWS`` rows, on random inputs.

    A kernel's summation order depends on the code path (CPU, row count), not on the values, so
    random rows that agree bitwise show that the paths agree. Where they do not, small products
    are padded so that a one-row step rounds like a row of a verify forward.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * MIN_PRODUCT_ROWS, in_features, generator=g)
    full = torch.ops.quantized.linear_dynamic_fp16(x, packed)
    return all(torch.equal(torch.ops.quantized.linear_dynamic_fp16(x[:r].contiguous(), packed), full[:r])
               for r in range(1, MIN_PRODUCT_ROWS))


# The weight formats of the fast forward, and the product class of each.
_LINEARS = {"float32": _Linear, "float16": _LinearF16, "quantized": _LinearQuant, "quantized-bf16": _LinearQuantBF16,
            "quantized-int8": _LinearQuantI8}
WEIGHT_FORMATS = tuple(_LINEARS)
# The weight formats that keep a GGUF's blocks (``lookupdec.blocks.BLOCK_FORMATS``: Q4_1, Q8_0) and read them
# from its file: they never need the float32 matrices.
QUANTIZED_FORMATS = tuple(f for f, cls in _LINEARS.items() if issubclass(cls, _LinearQuant))


def weights_unavailable_reason(weights: str) -> str:
    """Why this torch cannot run weight format ``weights`` ("" when it can).

    Raises:
        ValueError: ``weights`` is not one of ``WEIGHT_FORMATS``.

    Example:
        >>> weights_unavailable_reason("float32")
        ''
    """
    if weights not in _LINEARS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if weights == "float16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        return "float16 weights need torch's fbgemm kernels (x86 CPUs), which this torch lacks"
    if weights == "quantized-bf16" and not qmatmul_bf16_native():
        return "quantized-bf16 weights need a CPU with AVX-512 BF16 instructions, which this one lacks"
    if weights == "quantized-int8" and not qmatmul_i8_native():
        return "quantized-int8 weights need a CPU with AVX2 or AVX-512 VNNI instructions, which this one lacks"
    return ""


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, weights: str = "float32", blocks=None):
    """A prepacked product ``x (R, in) float32 -> (R, out) float32`` with ``weight`` stored in format ``weights``.

    Args:
        weight, bias: the layer's (``weight`` ``(out, in)``).
        weights: one of ``WEIGHT_FORMATS``.
        blocks: for the quantized formats, the ``lookupdec.blocks.Blocks`` that ``weight`` was
            dequantized from (the caller vouches for it); None: recovered from ``weight``.
    Raises:
        ValueError: an unknown or unavailable format, weights float16 cannot hold, or
            ``blocks`` for a format that keeps none.

    Example:
        >>> lin = make_linear(torch.eye(4), None, "float16")
        >>> lin(torch.ones(2, 4)).tolist()
        [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    """
    reason = weights_unavailable_reason(weights)
    if reason:
        raise ValueError(f"{reason}; use weights='float32'")
    if blocks is None:
        if weight.is_meta:
            raise unread_error("this matrix")
        return _LINEARS[weights](weight, bias)
    if not issubclass(_LINEARS[weights], _LinearQuant):
        raise ValueError(f"blocks are for the quantized formats, not {weights!r}")
    return _LINEARS[weights](weight, bias, blocks)


Product = Union[_Linear, _LinearF16, _LinearQuant, _LinearQuantBF16, _LinearQuantI8]  # what make_linear returns
