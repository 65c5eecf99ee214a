"""Slow, obvious references for the weight formats of the fast forward."""
from __future__ import annotations

import copy

import torch


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weights: str) -> torch.Tensor:
    """``x @ W.T + b`` in float64, with ``W`` first rounded to the format's storage type (float32 or float16)."""
    w = weight.to(getattr(torch, weights)).double()
    y = x.double() @ w.T
    return y if bias is None else y + bias.double()


def rounded_model(model, weights: str):
    """A copy of a Llama-family model whose linear weights (every projection and lm_head) are rounded to
    ``weights`` and kept in float32: what the fast forward in that format computes, run by transformers."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(mod.weight.to(getattr(torch, weights)).float())
    return m
