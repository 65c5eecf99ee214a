"""``lookupdec.generate``: one-call generation with a small cache of loaded decoders."""
from __future__ import annotations

from collections import OrderedDict

from lookupdec.decoder import Decoder
from lookupdec.results import GenerationResult

# Decoders kept by ``generate`` for reuse, most recently used last; at most this many
# (each holds a model in memory).
_DEFAULT: "OrderedDict[tuple, Decoder]" = OrderedDict()
DEFAULT_CACHE_SIZE = 2


def generate(prompt, *, model=None, dtype: str = "float32", device: str | None = None, hf_kernels: bool = False,
             **kwargs) -> GenerationResult:
    """One-call generation; the Decoder for ``(model, dtype, device, hf_kernels)`` is kept for reuse.

    At most ``DEFAULT_CACHE_SIZE`` decoders are kept; the least recently used one goes first.

    Args:
        prompt: see ``Decoder.generate``.
        model, dtype, device, hf_kernels: see ``Decoder``.
        **kwargs: passed to ``Decoder.generate`` (method, max_new_tokens, temperature, ...).
    Returns:
        A GenerationResult.
    Example:
        >>> from lookupdec import generate                            # doctest: +SKIP
        >>> generate("Say hi", method="ar", max_new_tokens=8).text    # doctest: +SKIP
    """
    key = (model, dtype, device, hf_kernels)
    if key in _DEFAULT:
        _DEFAULT.move_to_end(key)
    else:
        _DEFAULT[key] = Decoder(model, dtype=dtype, device=device, hf_kernels=hf_kernels)
        while len(_DEFAULT) > DEFAULT_CACHE_SIZE:
            _DEFAULT.popitem(last=False)
    return _DEFAULT[key].generate(prompt, **kwargs)
