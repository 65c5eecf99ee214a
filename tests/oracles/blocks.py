"""Slow, obvious references for the quantized weight format: GGML's reference quantizers (what made the
embedded model's Q4_1 and Q8_0 blocks) and the product over the dequantized weights in float64."""
from __future__ import annotations

import copy

import numpy as np
import torch


def q4_1_reference(w: np.ndarray) -> np.ndarray:
    """``w`` (N, K) quantized to Q4_1 block by block as GGML's reference quantizer does, then dequantized
    to float32 as GGML does: per 32 values, ``m = min``, ``d = (max - min) / 15`` (both stored as float16),
    ``q = round((x - min) / d)`` clipped to 0..15, value ``d * q + m``."""
    n, k = w.shape
    out = np.empty((n, k), np.float32)
    for i in range(n):
        for b in range(0, k, 32):
            x = w[i, b:b + 32].astype(np.float32)
            lo, hi = float(x.min()), float(x.max())
            d = (hi - lo) / 15
            inv = 1 / d if d else 0.0
            d16, m16 = np.float32(np.float16(d)), np.float32(np.float16(lo))
            for e in range(32):
                q = min(15, int((float(x[e]) - lo) * inv + 0.5))
                out[i, b + e] = d16 * np.float32(q) + m16
    return out


def q8_0_reference(w: np.ndarray) -> np.ndarray:
    """``w`` (N, K) through GGML's reference Q8_0: per 32 values ``d = amax / 127`` (float16),
    ``q = round(x / d)``, value ``d * q``."""
    n, k = w.shape
    out = np.empty((n, k), np.float32)
    for i in range(n):
        for b in range(0, k, 32):
            x = w[i, b:b + 32].astype(np.float32)
            d = float(np.abs(x).max()) / 127
            inv = 1 / d if d else 0.0
            d16 = np.float32(np.float16(d))
            for e in range(32):
                v = float(x[e]) * inv
                out[i, b + e] = d16 * np.float32(np.sign(v) * np.floor(abs(v) + 0.5))  # C's roundf
    return out


def product_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` in float64."""
    return x.astype(np.float64) @ w.astype(np.float64).T


def blockified_model(model, fmt: str = "q4_1"):
    """A copy of a Llama-family model whose linear weights are replaced by their round trip through GGML's
    reference quantizer: a float32 model whose matrices are dequantized blocks, as a GGUF file loads."""
    quant = q4_1_reference if fmt == "q4_1" else q8_0_reference
    m = copy.deepcopy(model)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.from_numpy(quant(mod.weight.detach().float().numpy())))
    return m


def bf16_reference(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16, one value at a time with Python integers (returned as float32):
    to nearest, ties to the even significand; a subnormal becomes a zero of its sign (what the
    bfloat16 products do to each weight and input)."""
    flat = np.ascontiguousarray(a, np.float32).ravel()
    out = np.empty(flat.shape, np.float32)
    for i, bits in enumerate(flat.view(np.uint32).tolist()):
        sign, exponent = bits & 0x80000000, (bits >> 23) & 0xFF
        if exponent == 0:
            rounded = sign
        else:
            upper, rest = bits >> 16, bits & 0xFFFF
            if rest > 0x8000 or (rest == 0x8000 and upper & 1):
                upper += 1
            rounded = upper << 16
        out[i] = np.array([rounded], np.uint32).view(np.float32)[0]
    return out.reshape(np.shape(a))


def int8_rows_reference(x: np.ndarray) -> np.ndarray:
    """``x`` (R, K) as the 8-bit products see it (returned as float32 values ``p * s``): per row and
    block of 32, ``a = max |x|``, ``p = rint(x * (127 / a))`` (ties to even; 0 where ``a`` is 0),
    ``s = a / 127``, every step in float32 as the kernel does it."""
    rows, k = x.shape
    blocks = np.ascontiguousarray(x, np.float32).reshape(rows, k // 32, 32)
    a = np.abs(blocks).max(axis=2, keepdims=True)
    inv = np.where(a > 0, np.float32(127) / np.where(a > 0, a, np.float32(1)), np.float32(0)).astype(np.float32)
    p = np.clip(np.rint((blocks * inv).astype(np.float32)), -127, 127)
    s = (a / np.float32(127)).astype(np.float32)
    return (p.astype(np.float64) * s).astype(np.float32).reshape(rows, k)
