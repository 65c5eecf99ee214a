"""What a step costs, from measurement: the cached cost curve as a prior, corrected online.

The cost curve (``lookupdec.costs.CostCurve``) is measured once, a priori, and
can be wrong: measured while another process was busy, noisy (``c(4) < c(1)``
was seen), or simply for a different load. Every step the decoder already
times (``Sequence.finish``) is a measurement of the same quantity, so
``CostModel`` starts from the curve and lets the steps correct it:

- the forward's *body* (everything but ``lm_head``) by total width (tree rows
  + window rows) and cache length: a ratio ``measured / prior`` per width knot
  of the curve, each knot shrunk toward the ratio of all steps (which is in
  turn shrunk toward 1, the prior), recent steps weighing more
  (``decay``); the fitted knots are then made non-decreasing in width
  (weighted isotonic regression, ``isotonic``): a wider forward never costs
  less;
- ``lm_head`` by rows computed: the curve's ``head_ms`` times one fitted ratio;
- the host time (acceptance, commit, stop checks) and the drafting time per
  step, as running means (``host_ms``, ``draft_ms``).

A ``CostModel`` answers what a ``CostCurve`` answers (``ms_at``, ``table``,
``logits_extra_ms``), so every drafter that prices with a curve prices with
it unchanged. When the fitted knots disagree with the prior by more than
``margin`` (mean absolute log ratio over the knots steps have reached, after
``min_steps`` steps) the model says so (``stale``) and logs it; the Decoder
then refreshes it before the next request (never inside one: by default the
steps' fit becomes the new prior; ``Decoder(cost_refresh="measure")`` measures
the curve again) and logs that decision too.
"""
from __future__ import annotations

import logging
import math
from bisect import bisect_right
from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np

from lookupdec.costs import MEASURED_LOGIT_ROWS, CostCurve

log = logging.getLogger("lookupdec.pricing")
# The fit's version (``CostModel.version``) changes when a knot moves by more than this share.
VERSION_TOLERANCE = 0.01
# A curve this far off the steps (2x: measured on a busy machine, or for other hardware) is logged
# as a WARNING that names the fix; a smaller disagreement is INFO, since the fit corrects it. On a
# quiet 2-core VM one request's steps differ from the curve by 0-30% and a first request's by up
# to 80% (thirtieth session, benchmarks/RESULTS.md), so a WARNING below 2x fired in most runs of
# several requests, for what the fit corrects anyway.
GROSS_LOG_RATIO = math.log(2.0)


def _level(log_ratio: float) -> int:
    """The logging level of a disagreement: WARNING from ``GROSS_LOG_RATIO`` on, else INFO."""
    return logging.WARNING if log_ratio >= GROSS_LOG_RATIO else logging.INFO


_REMEASURE = "; if it is measured wrong, run `lookupdec cost-curve --remeasure` on a quiet machine"


class StepTiming(NamedTuple):
    """One measured verify step (a named tuple: one is made every step, and a frozen dataclass's
    constructor costs three times as much).

    Attributes:
        width: rows in the forward (root + tree nodes + window rows + padding).
        past: cached rows before the step.
        forward_ms: the forward's wall time, every ``lm_head`` row computed for it included.
        head_rows: ``lm_head`` rows computed (0 on a backend that computes every row inside
            the forward: then ``head_ms`` is 0 too and the body is the whole forward).
        head_ms: time of those ``lm_head`` products.
        draft_ms: drafting time of the step.
        host_ms: the rest of the step outside the forward and the drafter.
    """

    width: int
    past: int
    forward_ms: float
    head_rows: int = 0
    head_ms: float = 0.0
    draft_ms: float = 0.0
    host_ms: float = 0.0


def isotonic(values: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent violators).

    Example:
        >>> isotonic([67.6, 73.3, 60.1, 82.8]).round(2).tolist()
        [67.0, 67.0, 67.0, 82.8]
    """
    v = [float(x) for x in values]
    w = [1.0] * len(v) if weights is None else [float(x) for x in weights]
    blocks: list[list[float]] = []  # [mean, weight, count]
    for x, wt in zip(v, w):
        blocks.append([x, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            tw = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / tw if tw > 0 else (m1 + m2) / 2, tw, n1 + n2])
    return np.array([m for m, _, n in blocks for _ in range(int(n))], dtype=np.float64)


def scaled_curve(curve: CostCurve, factor: float, how: str = "slope") -> CostCurve:
    """``curve`` made wrong on purpose (to show a wrong prior is corrected).

    Args:
        curve: the measured curve.
        factor: > 0.
        how: "slope": every width's extra cost over one row times ``factor``
            (``c'(w) = c(1) + factor (c(w) - c(1))``: a curve ``factor`` times as steep);
            "all": every time times ``factor``.
    Raises:
        ValueError: a factor <= 0 or an unknown ``how``.
    Example:
        >>> c = CostCurve((1, 16), (30.0, 45.0), 0, (0.0, 0.0), "cpu", "k")
        >>> scaled_curve(c, 2.0).ms, scaled_curve(c, 2.0, "all").ms
        ((30.0, 60.0), (60.0, 90.0))
    """
    if not factor > 0:
        raise ValueError(f"a cost scale must be > 0, got {factor}")
    if how == "slope":
        c1 = curve.ms[0]
        ms = tuple(max(c1 + factor * (m - c1), 1e-3) for m in curve.ms)
        slope = curve.slope_ms
    elif how == "all":
        ms = tuple(m * factor for m in curve.ms)
        slope = tuple(s * factor for s in curve.slope_ms)
    else:
        raise ValueError(f"how must be 'slope' or 'all', got {how!r}")
    head = tuple(h * factor for h in curve.head_ms) if how == "all" else curve.head_ms
    return replace(curve, ms=ms, slope_ms=slope, head_ms=head, key=f"{curve.key}*{how}{factor:g}")


def _interp(x: float, xs: Sequence[int], ys: Sequence[float]) -> float:
    """``np.interp(x, xs, ys)`` for one scalar (the ends held), without numpy's per-call cost."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    k = bisect_right(xs, x) - 1
    f = (x - xs[k]) / (xs[k + 1] - xs[k])
    return float(ys[k] + f * (ys[k + 1] - ys[k]))


def _past_shift(body, slope, rows):
    """``slope * rows``, the change a shorter or longer cache makes, never taking off more than half of ``body``.

    A slope measured on a busy machine can be steep enough to price a short cache's forward
    at zero; a forward over fewer cached rows still costs its weights' products.
    """
    return np.maximum(slope * rows, -0.5 * np.asarray(body)) if np.ndim(body) else max(slope * rows, -0.5 * body)


class CostModel:
    """The cost of a verify step: a CostCurve prior corrected by measured steps (module docstring).

    Args:
        prior: the cached (or given) cost curve.
        prior_weight: pseudo-steps of the prior at each knot (and of 1.0 in the overall ratio).
        decay: each new step multiplies the weight of earlier ones by this (recent steps count more).
        margin: mean absolute log-ratio over reached knots above which the prior is ``stale``.
        min_steps: steps before ``stale`` may be set.
        refit_every: steps between refits (the fitted table is cached in between).

    Example:
        >>> m = CostModel(CostCurve((1, 16), (30.0, 45.0), 0, (0.0, 0.0), "cpu", "k"))
        >>> m.ms_at(16)
        45.0
        >>> for _ in range(80): m.observe(StepTiming(16, 0, 90.0))
        >>> round(m.ms_at(16)), m.stale
        (90, True)
    """

    def __init__(self, prior: CostCurve, *, prior_weight: float = 4.0, decay: float = 0.99, margin: float = 0.35,
                 min_steps: int = 64, refit_every: int = 16) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.prior_weight = float(prior_weight)
        self.decay = float(decay)
        self.margin = float(margin)
        self.min_steps = int(min_steps)
        self.refit_every = max(int(refit_every), 1)
        self.reset(prior)

    # -- what a CostCurve offers ----------------------------------------------------------------

    @property
    def widths(self) -> tuple[int, ...]:
        return self.prior.widths

    @property
    def head_ms(self) -> tuple[float, ...]:
        return self._fit()[2]

    @property
    def key(self) -> str:
        return self.prior.key

    @property
    def device(self) -> str:
        return self.prior.device

    @property
    def version(self) -> int:
        """Changes whenever the fit moves by more than ``VERSION_TOLERANCE`` at a knot since it last changed
        (refitting first if steps are pending): tables keyed by it stay within that of the fit, and are not
        rebuilt for the small moves of every refit."""
        self._fit()
        return self._version

    def curve(self) -> CostCurve:
        """The fitted model as a CostCurve (monotone in width)."""
        body, slope, head = self._fit()
        hd = self._head_at_knots(head)
        return replace(self.prior, ms=tuple(float(b + h) for b, h in zip(body, hd)), slope_ms=tuple(slope),
                       head_ms=tuple(head))

    def ms_at(self, width: int, past: int | None = None) -> float:
        """Modelled ms of a forward of ``width`` rows (``lm_head`` over ``min(width, 7)`` rows), as ``CostCurve.ms_at``."""
        return self.body_ms(width, past) + self.head_rows_ms(min(width, MEASURED_LOGIT_ROWS))

    def body_ms(self, width: int, past: int | None = None) -> float:
        """Modelled ms of a forward of ``width`` rows without ``lm_head``."""
        body, slope, _ = self._fit()
        xs = self.prior.widths
        if width <= xs[-1]:
            b = float(np.interp(width, xs, body))
            s = float(np.interp(width, xs, slope))
        else:
            b = body[-1] + max(body[-1] - body[-2], 0.0) / (xs[-1] - xs[-2]) * (width - xs[-1])
            s = slope[-1]
        if past is not None:
            b += _past_shift(b, s, past - self.prior.base_past)
        return max(b, 1e-6)

    def head_rows_ms(self, rows: int) -> float:
        """Modelled ms of ``lm_head`` over ``rows`` rows (0 without head timings)."""
        head = self._fit()[2]
        if not head or rows <= 0:
            return 0.0
        xs = self.prior.widths
        if rows <= xs[-1]:
            return float(np.interp(rows, xs, head))
        return head[-1] + max(head[-1] - head[-2], 0.0) / (xs[-1] - xs[-2]) * (rows - xs[-1])

    def logits_extra_ms(self, width: int, logit_rows: int) -> float:
        """As ``CostCurve.logits_extra_ms``: ``lm_head`` ms beyond the ``min(width, 7)`` rows ``ms_at`` includes."""
        done = min(width, MEASURED_LOGIT_ROWS)
        if logit_rows <= done or not self._fit()[2]:
            return 0.0
        return max(self.head_rows_ms(logit_rows) - self.head_rows_ms(done), 0.0)

    def table(self, past: int | None = None, max_width: int | None = None) -> np.ndarray:
        """``t[w]`` = ``ms_at(w, past)`` for w in 0..max_width (``t[0]`` unused), non-decreasing."""
        top = max_width or self.prior.widths[-1]
        body, slope, head = self._fit()
        xs = self.prior.widths
        w = np.arange(1, top + 1, dtype=np.float64)
        inside = np.minimum(w, xs[-1])
        b = np.interp(inside, xs, body)
        b += max(body[-1] - body[-2], 0.0) / (xs[-1] - xs[-2]) * np.maximum(w - xs[-1], 0.0)
        if past is not None:
            b += _past_shift(b, np.interp(inside, xs, slope), past - self.prior.base_past)
        if head:
            b += np.interp(np.minimum(w, MEASURED_LOGIT_ROWS), xs, head)
        t = np.concatenate([[np.inf], np.maximum.accumulate(np.maximum(b, 1e-6))])
        return t

    # -- learning -------------------------------------------------------------------------------

    def reset(self, prior: CostCurve) -> None:
        """Start again from ``prior`` (a newly measured curve), forgetting the steps seen."""
        self.prior = prior
        xs = prior.widths
        head = np.asarray(prior.head_ms, np.float64) if prior.head_ms else np.zeros(0)
        done = [min(w, MEASURED_LOGIT_ROWS) for w in xs]
        head_in = np.interp(done, xs, head) if len(head) else np.zeros(len(xs))
        # The body the curve implies: its time less the lm_head rows it included.
        body = np.asarray(prior.ms, np.float64) - head_in
        self._body0 = np.maximum(body, 0.2 * np.asarray(prior.ms, np.float64))
        self._head0 = head
        # Plain lists for the per-step scalar interpolation (np.interp on scalars costs ~5 us a call).
        self._body0_list = self._body0.tolist()
        self._head0_list = head.tolist()
        n = len(xs)
        self._w = np.zeros(n)         # decayed weight of the steps at each knot
        self._lr = np.zeros(n)        # decayed weighted sum of log(measured / prior) at each knot
        self._hw = 0.0
        self._hlr = 0.0
        self.steps = 0
        self.host_ms = 0.0
        self.draft_ms = 0.0
        self.stale = False
        self._version = 0
        self._published: list[float] | None = None  # the fit's knots when the version last changed
        self._cached: tuple | None = None
        self._since_fit = 0
        self._pending: list[StepTiming] = []  # steps observed since the knots were last updated

    def observe(self, t: StepTiming) -> None:
        """Learn from one measured step (see the module docstring).

        The running means are updated at once; the knots' weights are folded in with the refit
        every ``refit_every`` steps (the fit reads them only then, so the result is the same):
        right after a forward has cooled the caches, the numpy work of one step cost ~50 us,
        against ~10 us in a warm loop (thirty-first session).
        """
        if t.width < 1 or not math.isfinite(t.forward_ms) or t.forward_ms <= 0:
            return
        self._pending.append(t)
        a = 1.0 / min(self.steps + 1, 50)
        self.host_ms += a * (t.host_ms - self.host_ms)
        self.draft_ms += a * (t.draft_ms - self.draft_ms)
        self.steps += 1
        self._since_fit += 1
        if self._since_fit >= self.refit_every:
            self._fold()
            self._cached = None
            self._since_fit = 0  # (the fit counts from its own refit too: reading it then gives the same knots)

    def _fold(self) -> None:
        """Add the pending steps to the knots' decayed weights and log ratios, in order (plain
        floats: the same float64 arithmetic as numpy's, without its per-call cost on 7 knots)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        d = self.decay
        xs = self.prior.widths
        top = len(xs) - 1
        ws, lrs = self._w.tolist(), self._lr.tolist()
        for t in pending:
            ws = [x * d for x in ws]
            lrs = [x * d for x in lrs]
            body = t.forward_ms - t.head_ms
            expect = self._prior_body(t.width, t.past)
            if body > 0 and expect > 0:
                lr = math.log(body / expect)
                w = min(max(t.width, xs[0]), xs[-1])
                k = bisect_right(xs, w) - 1
                if k >= top:
                    ws[-1] += 1.0
                    lrs[-1] += lr
                else:
                    f = (w - xs[k]) / (xs[k + 1] - xs[k])
                    ws[k] += 1.0 - f
                    lrs[k] += (1.0 - f) * lr
                    ws[k + 1] += f
                    lrs[k + 1] += f * lr
            if t.head_rows > 0 and t.head_ms > 0 and len(self._head0):
                h0 = _interp(t.head_rows, xs, self._head0_list)
                if h0 > 0:
                    self._hw = self._hw * d + 1.0
                    self._hlr = self._hlr * d + math.log(t.head_ms / h0)
        self._w, self._lr = np.array(ws), np.array(lrs)

    def disagreement(self) -> float:
        """Mean absolute log ratio of the fitted knots to the prior's, over knots steps have reached."""
        self._fold()
        reached = [(abs(r), w) for r, w in zip(self._knot_log_ratios(), self._w.tolist()) if w > 0.5]
        if not reached:
            return 0.0
        return sum(a * w for a, w in reached) / sum(w for _, w in reached)

    # -- internals ------------------------------------------------------------------------------

    def _prior_body(self, width: int, past: int) -> float:
        xs = self.prior.widths
        w = min(width, xs[-1])
        b = _interp(w, xs, self._body0_list)
        b += _past_shift(b, _interp(w, xs, self.prior.slope_ms), past - self.prior.base_past)
        if width > xs[-1]:
            b += max(self._body0[-1] - self._body0[-2], 0.0) / (xs[-1] - xs[-2]) * (width - xs[-1])
        return b

    def _knot_log_ratios(self) -> list[float]:
        # Plain floats over the few knots: the refit runs right after a forward, where each numpy
        # call costs ~10 us (a refit of ~30 of them cost ~330 us, every 16 steps).
        pw = self.prior_weight
        ws, lrs = self._w.tolist(), self._lr.tolist()
        overall = sum(lrs) / (sum(ws) + pw)  # shrunk toward 0 (the prior)
        return [(lr + pw * overall) / (w + pw) for lr, w in zip(lrs, ws)]

    def _head_at_knots(self, head) -> np.ndarray:
        xs = self.prior.widths
        if not len(head):
            return np.zeros(len(xs))
        return np.interp([min(w, MEASURED_LOGIT_ROWS) for w in xs], xs, head)

    def _fit(self) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
        if self._cached is not None:
            return self._cached
        self._fold()
        pw = self.prior_weight
        ws = self._w.tolist()
        body = isotonic([b * math.exp(r) for b, r in zip(self._body0_list, self._knot_log_ratios())],
                        [w + pw for w in ws])
        overall = math.exp(sum(self._lr.tolist()) / (sum(ws) + pw))
        slope = np.array([x * overall for x in self.prior.slope_ms], np.float64)
        head: tuple[float, ...] = ()
        if self._head0_list:
            hr = math.exp(self._hlr / (self._hw + pw))
            head = tuple(isotonic([h * hr for h in self._head0_list]).tolist())
        self._cached = (body, slope, head)
        self._since_fit = 0
        knots = body.tolist() + list(head)
        last = self._published
        if last is None or len(knots) != len(last) or \
                any(abs(k - p) > VERSION_TOLERANCE * abs(p) for k, p in zip(knots, last)):  # (a knot at 0: moved if not 0)
            self._published = knots
            self._version += 1
        if not self.stale and self.steps >= self.min_steps:
            off = self.disagreement()
            if off > math.log1p(self.margin):
                self.stale = True
                level = _level(off)
                log.log(level, "cost curve %s disagrees with %d measured steps: fitted forward times are "
                        "%.0f%% off the curve (margin %.0f%%); the decoder refreshes it before its next request%s",
                        self.prior.key, self.steps, 100 * (math.exp(off) - 1), 100 * self.margin,
                        _REMEASURE if level == logging.WARNING else "")
        return self._cached


def settle_stale(model: "CostModel", policy: str, remeasure: Callable[[], object] | None) -> None:
    """Act on a cost model whose steps contradict its curve (``model.stale``), as ``policy`` says.

    "off": keep the curve (corrected online) and say so once; "measure": call ``remeasure``
    (which measures the curve again and resets the model; None when the curve was given, which
    then falls back to "fit"); "fit": the steps' fit becomes the new prior (not written to disk).
    Each decision is logged (logger ``lookupdec.pricing``): a WARNING when the curve is off by 2x
    or more (``GROSS_LOG_RATIO``), INFO below, which the fit absorbs. Nothing happens when not stale.
    """
    if not model.stale:
        return
    ratio = model.disagreement()
    off, level = 100 * (math.exp(ratio) - 1), _level(ratio)
    if policy == "off":
        log.log(level, "cost curve %s: %d steps disagree with it by %.0f%%; kept, corrected online "
                "(cost_refresh='off')", model.key, model.steps, off)
        model.stale = False
        model.min_steps = model.steps + 10 ** 9  # said once
    elif policy == "measure" and remeasure is not None:
        log.log(level, "measuring the cost curve %s again: %d steps disagreed with it by %.0f%%",
                model.key, model.steps, off)
        remeasure()
    else:
        log.log(level, "cost curve %s: %d steps disagreed with it by %.0f%%; their fit is the new "
                "prior (not written to disk)", model.key, model.steps, off)
        model.reset(model.curve())
