"""Handing a model's own weight memory back once a packed copy serves the forward (``FastForward(release=True)``),
and finding a parameter that still holds values (to read a model's device and dtype from)."""
from __future__ import annotations

import torch


def held_parameter(model):
    """The model's first parameter that holds values: not released (empty) and not left unread on the meta
    device (``lookupdec.deferred``); its device and dtype are the model's. The first parameter if none does."""
    first = None
    for p in model.parameters():
        if first is None:
            first = p
        if p.numel() and not p.is_meta:
            return p
    if first is None:
        raise ValueError("the model has no parameters")
    return first


def release_linear(linear) -> None:
    """Drop an ``nn.Linear``'s weight (and bias) storage; its packed copy serves the fast forward."""
    import torch.nn as nn

    linear.weight = nn.Parameter(torch.empty(0), requires_grad=False)
    if getattr(linear, "bias", None) is not None:
        linear.bias = nn.Parameter(torch.empty(0), requires_grad=False)


def return_freed_memory() -> None:
    """Hand memory freed to the C allocator back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Released weights were allocated in pieces below glibc's (raised) mmap threshold, so
    freeing them keeps their pages resident: without this, packing with ``release``
    would hold the freed float32 copy and the packed one at once in RSS.
    """
    global _malloc_trim
    if _malloc_trim is None:
        _malloc_trim = False
        try:
            import ctypes
            import ctypes.util

            name = ctypes.util.find_library("c")
            if name:
                _malloc_trim = getattr(ctypes.CDLL(name), "malloc_trim", False)
        except OSError:
            pass
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None
