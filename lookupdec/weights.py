"""Which weight format the fast forward stores its linear weights in: the caller's choice, or ``auto``'s.

A CPU forward of a small model is bound by reading its weights, so float16
weights (fbgemm, float32 activations and accumulation) can be much faster than
float32 ones (oneDNN), and a GGUF's own Q4_1 / Q8_0 blocks ("quantized":
float32's values at 6-9 bits each, ``lookupdec.blocks``) faster still.
Rounding the weights to float16 changes the model, though, so ``auto`` may
pick float16 only where the weights were no more precise than that to begin
with:

- a GGUF file whose weight matrices are block-quantized (Q4_0, Q4_1, Q8_0, the
  K- and IQ-quants: their scales are float16) or float16: ``auto`` times one
  forward at ``MEASURE_WIDTHS`` rows in each format on this machine (float32,
  float16, and quantized where every matrix is found to be Q4_1 or Q8_0
  blocks) and takes the fastest (the result is cached, like the cost curve);
- anything else (float32 or bfloat16 checkpoints, HF model directories, a model
  passed in): ``auto`` is float32. float16 is offered (``weights="float16"``,
  ``--weights float16``), never chosen silently.

"quantized-bf16" (those blocks, the layers' products rounded to bfloat16) changes the
model as float16 does a float32 one: offered (``--weights quantized-bf16``, CPUs with
AVX-512 BF16), never timed or chosen by ``auto``. So is "quantized-int8" (those blocks against
the activations rounded to 8 bits per block of 32, the block sums in integers, as llama.cpp
computes them; CPUs with AVX2 or AVX-512 VNNI).

Models that run transformers' forward (not Llama-family, not float32 on a CPU,
``hf_kernels=True``) have no weight format: ``auto`` leaves them alone, and an
explicit "float16" or a quantized format is an error that says why.

Exactness is per format: every method equals ``ar`` run in the same format.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lookupdec.fast_forward_support import fast_forward_unsupported_reason
from lookupdec.products import WEIGHT_FORMATS, weights_unavailable_reason
from lookupdec.release import held_parameter

WEIGHTS_CHOICES = ("auto",) + WEIGHT_FORMATS
# Rows of the two forwards ``auto`` times per format: plain decoding, and a mid-size verify tree.
MEASURE_WIDTHS = (1, 8)
# ``auto`` times a forward over the first this-many decoder layers in each format (no lm_head),
# built beside the model and dropped after: a fraction of a second copy of the weights, yet
# (on the embedded model, ~75 MB of float32 layers) more than a CPU's last-level cache
# holds, so the products stream weights from memory as in the full forward.
MEASURE_LAYERS = 6
# Storage kinds (``LoadedModel.stored``) whose values float16 holds (almost) exactly.
FLOAT16_FAITHFUL = ("quantized", "float16")
CHOICE_FORMAT = 3  # bump when cached choices from older versions must not be reused (2: "quantized" added;
#   3: its layers in one native call)


@dataclass(frozen=True)
class WeightsChoice:
    """The weight format a Decoder uses, and why.

    Attributes:
        weights: one of ``WEIGHT_FORMATS``; "" when the model runs transformers' forward.
        reason: why, in words (asked for / measured faster / stored as ...).
        ms: milliseconds of a forward over the first ``MEASURE_LAYERS`` layers (no ``lm_head``),
            per format, at ``MEASURE_WIDTHS`` rows (empty: not measured).
        cached: the measurement came from the cache file.
    """

    weights: str
    reason: str
    ms: dict = field(default_factory=dict)
    cached: bool = False


def check_weights(weights: str) -> str:
    """``weights`` if it is one of ``WEIGHTS_CHOICES``.

    Raises:
        ValueError: anything else (the message lists the choices).

    Example:
        >>> check_weights("float16")
        'float16'
    """
    if weights not in WEIGHTS_CHOICES:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS_CHOICES)}, got {weights!r}")
    return weights


def auto_candidates(stored: str) -> tuple[str, ...]:
    """The formats ``auto`` may pick for weights stored as ``stored`` (``LoadedModel.stored``).

    Example:
        >>> auto_candidates("quantized"), auto_candidates("float16"), auto_candidates("bfloat16")
        (('float32', 'float16', 'quantized'), ('float32', 'float16'), ('float32',))
    """
    if stored == "quantized":
        return ("float32", "float16", "quantized")
    return ("float32", "float16") if stored in FLOAT16_FAITHFUL else ("float32",)


def pick_faster(ms: dict) -> str:
    """The format with the smaller total of its measured times; float32 on a tie.

    Example:
        >>> pick_faster({"float32": (36.0, 70.0), "float16": (14.0, 26.0)})
        'float16'
    """
    return min(sorted(ms, key=lambda f: f != "float32"), key=lambda f: sum(ms[f]))


def time_forwards(fasts: dict, widths=MEASURE_WIDTHS, *, past: int = 64, repeats: int = 5) -> dict:
    """The fastest of ``repeats`` forwards of each ``FastForward`` at each width, on ``past`` cached rows.

    The formats take turns forward by forward, and the minimum is kept, so a burst of
    other work on the machine hits every format alike and is mostly filtered out.

    Args:
        fasts: ``{format: FastForward}``.
    Returns:
        ``{format: (ms at each width)}``.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    caches = {}
    for fmt, fast in fasts.items():
        caches[fmt] = fast.new_cache(past + max(widths) + 1)
        ids = torch.randint(3, fast.vocab, (past,), generator=gen)
        fast.forward(caches[fmt], ids, torch.arange(past), None, None, causal=True)
    best = {fmt: [float("inf")] * len(widths) for fmt in fasts}
    for i, w in enumerate(widths):
        ids = torch.randint(3, min(f.vocab for f in fasts.values()), (w,), generator=gen)
        pos = torch.arange(past, past + w)
        for _ in range(repeats + 1):  # the first round warms up as well
            for fmt, fast in fasts.items():
                t = time.perf_counter()
                fast.forward(caches[fmt], ids, pos, None, None)  # bias None: every row sees all (a tree's cost)
                best[fmt][i] = min(best[fmt][i], (time.perf_counter() - t) * 1e3)
                caches[fmt].length = past
    return {fmt: tuple(ms) for fmt, ms in best.items()}


def choice_key(model, stored: str, threads: int) -> str:
    """What a cached choice is valid for: the model (config, size), its storage, device, threads, torch
    and the native extension's build (new kernels: the formats are timed again)."""
    import torch

    from lookupdec.costs import device_description, native_build

    param = held_parameter(model)
    n_params = sum(p.numel() for p in model.parameters())
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else repr(model.config)
    ident = "|".join([config, str(n_params), stored, device_description(param.device), str(threads),
                      torch.__version__, str(CHOICE_FORMAT), native_build()])
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def _read_choice(path: Path) -> WeightsChoice | None:
    try:
        d = json.loads(path.read_text())
        if d.get("format") != CHOICE_FORMAT or d["weights"] not in WEIGHT_FORMATS:
            return None
        ms = {str(k): tuple(float(x) for x in v) for k, v in d["ms"].items()}
        return WeightsChoice(d["weights"], str(d["reason"]), ms, cached=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None


def _write_choice(path: Path, choice: WeightsChoice, measured_for: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": CHOICE_FORMAT, "weights": choice.weights, "reason": choice.reason,
                                   "ms": {k: list(v) for k, v in choice.ms.items()}, "widths": list(MEASURE_WIDTHS),
                                   "measured_for": measured_for}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only loses the cache


def build_verifier(build: Callable, model, *, weights: str, stored: str, fast: bool, threads: int,
                   cache_dir: Path | None = None, prepare: Callable[[], None] | None = None, blocks=None):
    """The verifier in the weight format asked for, or the one ``auto`` picks (see the module docstring).

    Args:
        build: ``build(weights) -> TreeVerifier`` for ``model``.
        model: the target model (before any weights are released).
        weights: one of ``WEIGHTS_CHOICES``.
        stored: how the file stored the weights (``LoadedModel.stored``).
        fast: the fast backend was asked for (not ``hf_kernels``).
        threads: torch's thread count (part of the cache key).
        cache_dir: where choices are cached (default ``cache_root()/costs``, beside the cost curves).
        prepare: called before the formats are timed, which reads every weight of the first
            ``MEASURE_LAYERS`` layers (the Decoder reads them there for a model loaded with
            ``defer_matrices``: ``LoadedModel.materialize``).
        blocks: ``LoadedModel.blocks`` where the file's blocks may be read (a model the Decoder loaded
            itself): timing the quantized format then reads them instead of recovering them.
    Returns:
        ``(verifier, WeightsChoice)``.
    Raises:
        ValueError: an unknown format, or "float16" for a model that runs transformers'
            forward or a torch without fbgemm (the message says why and what to use).

    Measuring builds each format's products for the first ``MEASURE_LAYERS`` layers only
    (dropped after timing), then the chosen verifier: the peak stays
    near the model's own size.
    """
    check_weights(weights)
    unsupported = "" if fast else "transformers' forward is in use (hf_kernels=True, or no fast kernels here)"
    unsupported = unsupported or fast_forward_unsupported_reason(model)
    if weights not in ("auto", "float32"):
        if unsupported:
            raise ValueError(f"weights={weights!r} (--weights {weights}) needs lookupdec's fast forward, which this "
                             f"model cannot use: {unsupported}; use --weights float32 (or auto)")
        reason = weights_unavailable_reason(weights)
        if reason:
            instead = "quantized" if weights in ("quantized-bf16", "quantized-int8") else "float32"
            raise ValueError(f"weights={weights!r} (--weights {weights}) cannot run here: {reason}; "
                             f"use --weights {instead} (or auto)")
        return build(weights), WeightsChoice(weights, "asked for")
    if weights == "float32" or unsupported:
        verifier = build("float32")
        fmt = "float32" if verifier.backend == "fast" else ""
        return verifier, WeightsChoice(fmt, "asked for" if weights == "float32" else "transformers' forward")
    candidates = [f for f in auto_candidates(stored) if not weights_unavailable_reason(f)]
    if candidates == ["float32"]:
        why = (f"weights stored as {stored}" if stored else "weights of unknown storage") + \
            ": float16 is offered (--weights float16), not chosen by auto"
        return build("float32"), WeightsChoice("float32", why)
    from lookupdec.tokenizer import cache_root

    path = (cache_dir or cache_root() / "costs") / f"weights-{choice_key(model, stored, threads)}.json"
    cached = _read_choice(path)
    if cached is not None:
        return build(cached.weights), cached
    from lookupdec.fast_forward import FastForward

    if prepare is not None:
        prepare()
    partial = {}
    for fmt in candidates:
        try:
            partial[fmt] = FastForward(model, weights=fmt, layers=MEASURE_LAYERS, blocks=blocks)
        except ValueError:  # "quantized" where the matrices are not Q4_1 / Q8_0 blocks (e.g. K-quants)
            continue
    ms = time_forwards(partial)
    del partial
    best = pick_faster(ms)
    choice = WeightsChoice(best, f"measured faster here (weights stored as {stored})", ms)
    cfg = model.config
    _write_choice(path, choice, f"model {getattr(cfg, '_name_or_path', '') or type(model).__name__}; "
                                f"stored {stored}; threads {threads}")
    return build(best), choice


def decoder_verifier(loaded, owned: bool, *, weights: str, tree_masks: bool | None, fast: bool, threads: int,
                     kv_dtype: str = "float32"):
    """A Decoder's verifier for ``loaded`` (a ``LoadedModel``) in the format asked for or ``auto``'s, with
    a KV cache of ``kv_dtype`` (``TreeVerifier`` refuses float16 where the fast forward cannot run).

    Fast kernels: the lean forward for Llama-family models (which then holds the only copy of an
    ``owned`` model's linear weights); other models keep transformers' forward. Only an owned
    model's weights are surely still its file's, so only its blocks are read from the file, and
    only it is repacked. Matrices a deferred load left unread (``lookupdec.deferred``) are read
    first wherever the verifier will not run the quantized products on the file's blocks, and
    the first layers' only to time the formats.

    Returns:
        ``(verifier, WeightsChoice)``, as ``build_verifier``.
    """
    from lookupdec.fast_forward_support import supports_fast_forward
    from lookupdec.products import QUANTIZED_FORMATS
    from lookupdec.verify import TreeVerifier

    blocks = loaded.blocks if owned else None

    def build(fmt: str) -> TreeVerifier:
        if not (owned and fast and fmt in QUANTIZED_FORMATS and supports_fast_forward(loaded.model)):
            loaded.materialize()
        return TreeVerifier(loaded.model, tree_masks=tree_masks, fast=fast, release=owned, weights=fmt, blocks=blocks,
                            kv_dtype=kv_dtype)

    return build_verifier(build, loaded.model, weights=weights, stored=loaded.stored, fast=fast, threads=threads,
                          prepare=lambda: loaded.materialize(MEASURE_LAYERS), blocks=blocks)
