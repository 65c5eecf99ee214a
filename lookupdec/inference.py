"""``inference``: a function run under ``torch.inference_mode``, entered only when its caller has not.

``@torch.inference_mode()`` enters the mode on every call: ~3 us warm, 10-15 us right after a
forward has cooled the caches (thirty-first session). The decoding loop (``Sequence.run``, a
batch step) holds one inference-mode block for all its steps, and the verifier's forward, its
``lm_head`` rows and its cache commit run inside it several times a step; asking whether the
mode is on costs ~0.1 us. Called from outside such a block, the function enters it as before.
"""
from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def inference(fn: F) -> F:
    """Decorate ``fn`` to run under ``torch.inference_mode``, entering it only when it is off.

    Example:
        >>> @inference
        ... def double(x):
        ...     return x * 2
        >>> double(torch.ones(2)).is_inference()
        True
    """
    enabled = torch.is_inference_mode_enabled

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
