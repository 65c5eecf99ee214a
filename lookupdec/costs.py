"""The verifier's cost curve: what one verify forward of w rows costs on this hardware.

``auto`` sizes its tree by expected tokens per second, so it needs c(w), the
time of one forward over w rows (the root plus w - 1 draft rows) on top of a
KV cache of ``past`` rows, for this model, dtype, device, backend and thread
count. The curve is measured on first use (a few seconds for a small model),
cached on disk as JSON under ``cache_root()/costs/<key>.json``, and measured
again on request (``Decoder.cost_curve(remeasure=True)``, ``lookupdec
cost-curve --remeasure``).

c(w, past) = c(w) + slope(w) * (past - base_past): ``c(w)`` is measured at
``base_past`` rows for every width, ``slope`` (attention over the cache grows
with it) at two widths and interpolated between them.

On the fast backend a forward computes ``lm_head`` only for the rows the
acceptance walk needs (the measured trees: the root and a main path of at
most ``MEASURED_LOGIT_ROWS - 1`` nodes). Drafters that need more rows' logits
(top-k of every row for Token Recycling, a Lookahead window's argmax) pay
for the larger product: ``head_ms`` times it per width and ``logits_extra_ms``
prices the difference. (On the embedded model on a 2-core CPU, ``lm_head``
over 32 rows costs ~24 ms against ~8 ms over 7: a quarter of c(32), too much
to leave out.) transformers' backend computes every row anyway (``head_ms`` empty).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
FORMAT = 12  # bump when measurements from older versions must not be reused (2: head_ms; 3: native decode attention;
#   4: the decode attention reads keys and values ahead, from a head-major cache; 5: head_ms timed after a body;
#   6: quantized layers in one native call; 7: AVX2 quantized products of 3+ rows without spills;
#   8: quantized products prefetch their next tile's weights; 9: spread over the tile instead;
#   10: a one-sequence step's body, embedding to final norm, in one native call;
#   11: AVX-512 quantized products of 5-24 rows in tall register tiles; 12: AVX2 ones of 5-8 rows).
#   A rebuilt native extension needs no bump: its build (``native_build``) is part of the key.
# Rows whose logits the measured forwards compute on the fast backend: the root and a
# main path of a tree of branches 6 deep (``measure``).
MEASURED_LOGIT_ROWS = 7


@dataclass(frozen=True)
class CostCurve:
    """Verify-forward time against width (and past length), by linear interpolation.

    Attributes:
        widths: measured widths, increasing from 1.
        ms: median ms of one forward at each width with ``base_past`` cached rows.
        base_past: cached rows during the measurement of ``ms``.
        slope_ms: extra ms per cached row at each width (0 when not measured).
        device: what it was measured on (CPU model and vector ISA, or GPU name).
        key: the cache key (model, dtype, device, backend, threads, versions).
        head_ms: median ms of the ``lm_head`` product over as many rows as each
            width (empty: not measured, or a backend that computes every row anyway).
        measured_for: what ``key`` stands for, readable: model, dtype, backend, threads,
            torch (``curve_description``; empty in files written before it existed).

    Example:
        >>> c = CostCurve((1, 16), (30.0, 45.0), 500, (0.0, 0.0), "cpu", "k")
        >>> c.ms_at(1), c.ms_at(9), c.ms_at(32)
        (30.0, 38.0, 61.0)
    """

    widths: tuple[int, ...]
    ms: tuple[float, ...]
    base_past: int
    slope_ms: tuple[float, ...]
    device: str
    key: str
    head_ms: tuple[float, ...] = ()
    measured_for: str = ""

    def __post_init__(self) -> None:
        w = list(self.widths)
        if len(w) < 2 or w[0] != 1 or any(b <= a for a, b in zip(w, w[1:])) or w[-1] > 1 << 20:
            raise ValueError(f"cost curve widths must increase from 1 with at least 2 points, got {w}")
        if len(self.ms) != len(w) or len(self.slope_ms) != len(w):
            raise ValueError("cost curve needs one ms and one slope per width")
        if not all(np.isfinite(self.slope_ms)) or not 0 <= self.base_past < 1 << 31:
            raise ValueError(f"cost curve slopes must be finite and base_past a cache length, got {self.slope_ms}, "
                             f"{self.base_past}")
        if not all(np.isfinite(self.ms)) or min(self.ms) <= 0:
            raise ValueError(f"cost curve times must be positive, got {self.ms}")
        if self.head_ms and (len(self.head_ms) != len(w) or not all(np.isfinite(self.head_ms))):
            raise ValueError("cost curve head_ms needs one finite time per width, or none")

    def logits_extra_ms(self, width: int, logit_rows: int) -> float:
        """Modelled ms a forward of ``width`` rows costs beyond ``ms_at`` when ``logit_rows`` rows get logits.

        ``ms_at`` covers ``min(width, MEASURED_LOGIT_ROWS)`` rows' logits; 0 without ``head_ms``.

        Example:
            >>> c = CostCurve((1, 65), (30.0, 90.0), 0, (0.0, 0.0), "cpu", "k", head_ms=(5.0, 37.0))
            >>> c.logits_extra_ms(32, 32), c.logits_extra_ms(4, 4)
            (12.5, 0.0)
        """
        if not self.head_ms:
            return 0.0
        done = min(width, MEASURED_LOGIT_ROWS)
        if logit_rows <= done:
            return 0.0
        xs, ys = self.widths, self.head_ms

        def head(r: int) -> float:
            if r <= xs[-1]:
                return float(np.interp(r, xs, ys))
            return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (r - xs[-1])

        return max(head(logit_rows) - head(done), 0.0)

    def ms_at(self, width: int, past: int | None = None) -> float:
        """Modelled ms of one forward of ``width`` rows over ``past`` cached rows (default: ``base_past``).

        Beyond the last width the last slope continues.
        """
        xs, ys = self.widths, self.ms
        if width <= xs[-1]:
            base = float(np.interp(width, xs, ys))
            slope = float(np.interp(width, xs, self.slope_ms))
        else:
            base = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (width - xs[-1])
            slope = self.slope_ms[-1]
        if past is not None:
            # A shorter cache never takes off more than half (a slope measured on a busy
            # machine could otherwise price a short cache's forward at nothing).
            base += max(slope * (past - self.base_past), -0.5 * base)
        return max(base, 1e-6)

    def table(self, past: int | None = None, max_width: int | None = None) -> np.ndarray:
        """``t[w]`` = ``ms_at(w, past)`` for w in 0..max_width (``t[0]`` unused)."""
        top = max_width or self.widths[-1]
        return np.array([np.inf] + [self.ms_at(w, past) for w in range(1, top + 1)])

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "CostCurve":
        """Raises ValueError for a file of another format or with bad fields."""
        try:
            d = json.loads(text)
            if d.pop("format", None) != FORMAT:
                raise ValueError("another format version")
            return cls(tuple(int(w) for w in d["widths"]), tuple(float(m) for m in d["ms"]), int(d["base_past"]),
                       tuple(float(s) for s in d["slope_ms"]), str(d["device"]), str(d["key"]),
                       tuple(float(h) for h in d.get("head_ms", ())), str(d.get("measured_for", "")))
        except (KeyError, TypeError, AttributeError, OverflowError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a cost curve: {exc}") from None


def device_description(device) -> str:
    """The CPU model and its widest vector ISA, or the GPU's name."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")) and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    model = model or platform.processor() or "unknown CPU"
    isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("asimd", "NEON"))
                if flag in flags), "no AVX")
    return f"cpu: {model}, {isa}, {os.cpu_count()} logical CPUs"


@functools.lru_cache(maxsize=1)
def native_build() -> str:
    """The native extension's build, as a short hash of its file ("none" without one).

    Part of a versioned curve's key: a rebuilt extension (new kernels) measures its own curve
    instead of pricing with the last build's timings, whether or not ``FORMAT`` was bumped.
    """
    try:
        from lookupdec import _native

        with open(_native.__file__, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except (ImportError, OSError, AttributeError, TypeError):
        return "none"


def curve_key(model, backend: str, threads: int, weights: str = "float32", *, versioned: bool = True,
              kv_dtype: str = "float32") -> str:
    """What a measured curve is valid for: model (config and size), dtype, weight format, KV cache element
    type, device, backend, threads, versions.

    ``weights`` is the fast forward's weight format (``WEIGHT_FORMATS``) and ``kv_dtype`` its KV cache's
    element type (``kvcache.KV_DTYPES``): each pair has its own curve.
    ``versioned=False`` leaves out torch's version, ``FORMAT`` and the native extension's build
    (``native_build``): what the saved drafting state is keyed by (``drafters/saved.py``), so that
    a new curve format or a rebuilt extension does not orphan it.
    """
    import torch

    from lookupdec.release import held_parameter

    param = held_parameter(model)
    n_params = sum(p.numel() for p in model.parameters())
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else repr(model.config)
    parts = [config, str(n_params), str(param.dtype), device_description(param.device), backend, str(threads)]
    if versioned:
        parts += [torch.__version__, str(FORMAT), native_build()]
    if weights != "float32":  # float32 curves keep the keys they had before formats existed
        parts.append(f"weights={weights}")
    if kv_dtype != "float32":  # and float32 caches the keys they had before float16 ones existed
        parts.append(f"kv={kv_dtype}")
    ident = "|".join(parts)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def curve_description(verifier, threads: int) -> str:
    """What a curve measured on ``verifier`` with ``threads`` threads is for, in words (``CostCurve.measured_for``).

    Kept apart from ``curve_key`` (the hash that names the file): this is for the reader.
    """
    import torch

    model = verifier.model
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    shape = ", ".join(f"{k} {getattr(cfg, a)}" for k, a in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                                                               ("vocab", "vocab_size")) if hasattr(cfg, a))
    n_params = sum(p.numel() for p in model.parameters())
    weights = getattr(getattr(verifier, "fast", None), "weights", None)
    kv_dtype = getattr(getattr(verifier, "fast", None), "kv_dtype", "float32")
    parts = [f"model {name} ({shape}, {n_params / 1e6:.1f}M parameters)", f"dtype {verifier.dtype}".replace("torch.", ""),
             f"backend {verifier.backend}", f"threads {threads}", f"torch {torch.__version__}",
             f"native build {native_build()}"]
    if weights:
        parts.insert(2, f"weights {weights}" + ("" if kv_dtype == "float32" else f", KV cache {kv_dtype}"))
    return "; ".join(parts)


def measure(verifier, *, widths: Sequence[int] = WIDTHS, past: int = 256, far_past: int = 1024, repeats: int = 5,
            warmup: int = 2, key: str = "", seed: int = 0) -> CostCurve:
    """Time verify forwards of ``verifier`` at each width.

    Each forward runs a tree of ``w - 1`` random nodes (a few branches of 6, as
    lookup drafts look) on ``past`` cached rows of random tokens; the cache is cut
    back after each. ``slope_ms`` comes from the widths 1 and the largest at
    ``far_past`` rows. Medians of ``repeats`` rounds after ``warmup`` rounds, each round
    one forward of every width.

    Returns:
        A CostCurve.
    """
    import torch

    from lookupdec.kvcache import keep_rows
    from lookupdec.models import max_context_of
    from lookupdec.tree import DraftTree

    rng = np.random.default_rng(seed)
    vocab = int(verifier.model.config.get_text_config(decoder=True).vocab_size)
    low = min(3, vocab - 1)
    widths = sorted({int(w) for w in widths} | {1})
    # Stay inside the model's context: the longest forward ends at far_past + 1 + max width.
    room = max_context_of(verifier.model) - widths[-1] - 2
    far_past = max(2, min(far_past, room))
    past = max(1, min(past, far_past // 2))

    def tree_of(w: int) -> DraftTree:
        if w <= 1:
            return DraftTree.empty()
        seqs = [rng.integers(low, vocab, 6).tolist() for _ in range((w - 1 + 5) // 6)]
        return DraftTree.from_sequences(seqs).prune(w - 1)

    def prefilled(p: int, room: int):
        # A cache holding p + 1 rows of random tokens, with room for ``room`` rows more.
        cache = verifier.new_cache(p + 1 + room)
        verifier.prefill(cache, rng.integers(low, vocab, p + 1).tolist())
        return cache

    def at(cache, p: int, ws: Sequence[int]) -> list[float]:
        # In rounds, every width once a round: a burst of interference from elsewhere on the
        # machine then lands on all widths alike instead of bending the curve at one of them
        # (width by width, a curve measured on a 2-core VM read c(4) 18.1 ms between c(2) 11.6
        # and c(8) 22.6). ``cache`` holds p + 1 rows.
        trees = [tree_of(w) for w in ws]
        ts: list[list[float]] = [[] for _ in ws]
        with torch.inference_mode():
            for i in range(warmup + repeats):
                for k, tree in enumerate(trees):
                    t = time.perf_counter()
                    verifier.forward(cache, p + 1, 7 % vocab, tree)
                    if verifier.device.type == "cuda":
                        torch.cuda.synchronize(verifier.device)
                    if i >= warmup:
                        ts[k].append(time.perf_counter() - t)
                    keep_rows(cache, p + 1, [])  # back to p + 1 rows
        return [statistics.median(x) * 1e3 for x in ts]

    def heads(cache, ws: Sequence[int]) -> list[float]:
        # lm_head timed right after a forward's body, as in a step, where the layers' weights
        # have just streamed through the caches. Timed in a loop of its own, the product kept much
        # of its weights in L3: 1.0 ms for one row against 2.3 ms inside steps (embedded model,
        # AMD EPYC with 32 MiB of L3), and the cost model then took a plain step's lm_head for a
        # small part of it.
        h = torch.randn(max(ws), fast.hidden, generator=torch.Generator().manual_seed(seed))
        ts: list[list[float]] = [[] for _ in ws]
        with torch.inference_mode():
            one, at_past = torch.tensor([7 % vocab]), torch.tensor([past + 1])
            for i in range(warmup + repeats):
                for k, w in enumerate(ws):
                    fast.forward(cache, one, at_past, None, "hidden")
                    keep_rows(cache, past + 1, [])
                    t = time.perf_counter()
                    fast.logits(h[:w])
                    if i >= warmup:
                        ts[k].append(time.perf_counter() - t)
        return [statistics.median(x) * 1e3 for x in ts]

    # One prefill of far_past + 1 random rows serves every measurement: the far widths first, then
    # the cache cut back to past + 1 rows (prefilling each cache length anew took ~1/3 of measuring).
    ends = [widths[0], widths[-1]]
    with torch.inference_mode():
        cache = prefilled(far_past, widths[-1] + 8)
    far = at(cache, far_past, ends)
    with torch.inference_mode():
        keep_rows(cache, past + 1, [])
    base = at(cache, past, widths)
    slopes_at_ends = [max((f - b) / (far_past - past), 0.0) for f, b in zip(far, [base[0], base[-1]])]
    slopes = [float(np.interp(w, ends, slopes_at_ends)) for w in widths]
    fast = getattr(verifier, "fast", None)
    head_ms = tuple(heads(cache, widths)) if fast is not None else ()
    return CostCurve(tuple(widths), tuple(base), past + 1, tuple(slopes), device_description(verifier.device), key,
                     head_ms)


def verifier_key(verifier, threads: int, *, versioned: bool = True) -> str:
    """``curve_key`` of a verifier: its model, backend and weight format (``versioned``: see ``curve_key``)."""
    fast = getattr(verifier, "fast", None)
    return curve_key(verifier.model, verifier.backend, threads, getattr(fast, "weights", "float32"), versioned=versioned,
                     kv_dtype=getattr(fast, "kv_dtype", "float32"))


def curve_path(verifier, threads: int, cache_dir: Path | None = None) -> Path:
    """Where the cost curve of this verifier's model, dtype, weight format, device, backend and threads is cached."""
    from lookupdec.tokenizer import cache_root

    return (cache_dir or cache_root() / "costs") / f"{verifier_key(verifier, threads)}.json"


def cached_curve(verifier, threads: int, *, remeasure: bool = False, cache_dir: Path | None = None,
                 **measure_kw) -> CostCurve:
    """The cost curve for this verifier's model, dtype, device, backend and threads: from disk, or measured.

    Args:
        verifier: a ``lookupdec.verify.TreeVerifier``.
        threads: torch's intra-op thread count (part of the key).
        remeasure: measure even if a cached curve exists (and replace it).
        cache_dir: where curves are kept (default ``cache_root()/costs``).
    Returns:
        The CostCurve. A cache directory that cannot be written only loses the cache.
    """
    path = curve_path(verifier, threads, cache_dir)
    key = path.stem
    if not remeasure:
        try:
            return CostCurve.from_json(path.read_text())
        except (OSError, ValueError):
            pass
    curve = replace(measure(verifier, key=key, **measure_kw), measured_for=curve_description(verifier, threads))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(curve.to_json())
        os.replace(tmp, path)
    except OSError:
        pass
    return curve
