"""``inference``: a function run under ``torch.inference_mode``, entered only when its caller has not.

``@torch.inference_mode()`` enters the mode on every call: ~3 us warm, 10-15 us right after a
forward has cooled the caches (thirty-first session). A decoding step (``Sequence.run``, a
batch's ``step_together``) holds one inference-mode block, and the step's plan and finish, the
verifier's forward, its ``lm_head`` rows and its cache commit run inside it; asking whether the
mode is on costs ~0.1 us. Called from outside such a block, the function enters it as before.
Importing this module imports no torch (``lookupdec.sequence`` stays torch-free at import): torch
is bound at the first call.
"""
from __future__ import annotations

import functools
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def inference(fn: F) -> F:
    """Decorate ``fn`` to run under ``torch.inference_mode``, entering it only when it is off.

    Example:
        >>> import torch
        >>> @inference
        ... def double(x):
        ...     return x * 2
        >>> double(torch.ones(2)).is_inference()
        True
    """
    mode = None  # (torch.is_inference_mode_enabled, torch.inference_mode), bound at the first call

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal mode
        if mode is None:
            import torch

            mode = (torch.is_inference_mode_enabled, torch.inference_mode)
        if mode[0]():
            return fn(*args, **kwargs)
        with mode[1]():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
