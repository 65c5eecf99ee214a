"""Steps where the lookup sources matched nothing, or little: does ``auto`` draft on them at all?

``auto`` asks its lookup sources first: the live context, reference documents, corpus
datastores, earlier outputs (``Drafter.looks_up``). Their best node's score (the estimated
probability that it is accepted) says how much the step can bring. Where it is low, or where
nothing matched and only the sources drafting from the target's own predictions are left
(Token Recycling, the Lookahead pool and window, a small LM), a step rarely drafts anything
worth a row where rows are dear, yet it still pays for every source's proposal, the merge,
the selection and the commit. Measured on a 2-core AMD EPYC with AVX-512 (quantized weights,
13 held-out Spec-Bench turns, greedy): 207 of 589 proposals found no lookup match, 5 of those
were drafted and 2 of their tokens accepted; 114 more had a best lookup score under 0.2, 30 were
drafted and 10 tokens accepted; each such proposal cost 0.3-1.0 ms of drafting and commit work
(a plain step: ~9 ms).

``WeakMatchGate`` sorts each step by its best lookup score into a band (``BANDS``: nothing
matched, then scores under 0.1; stronger matches are never gated) and keeps, per
band, over recent steps that drafted, the draft tokens they had accepted and what they cost
beyond a plain step: the remaining sources' drafting, the merge and selection, the commit,
the deferred top-k and the forward's extra rows (modelled). An accepted token saves one plain
step (``c(1)``), so a band's steps pay when ``tokens * c(1) >= cost`` over recent ones. Until
``min_steps`` of a band's steps are in, they draft; after that, while the band does not pay,
its steps are plain ones (the sources learn their tokens at their next proposal), except every
``probe_every``-th, which drafts so the evidence stays current: ~1 ms in ``probe_every``
steps, ~0.3% of the time here. Where rows are cheap (a GPU, a memory-bound float32
forward) the evidence says draft, and nothing changes.

A ``Decoder`` keeps one gate per method and temperature band (inside that band's
``SourceLedger``), so the evidence carries across requests. Decisions are logged (logger
``lookupdec.auto``, level INFO).
"""
from __future__ import annotations

import bisect
import logging

log = logging.getLogger("lookupdec.auto")

# Upper score edges of the gated bands; band 0 is "nothing matched" (see the module docstring).
BANDS = (0.1,)


class WeakMatchGate:
    """Whether ``auto`` drafts on a step whose lookup sources matched nothing or little (module docstring).

    Args:
        decay: weight of a band's earlier steps at each new one.
        min_steps: steps of a band that draft before the band may close.
        probe_every: a closed band lets every ``probe_every``-th of its steps draft.

    Example:
        >>> g = WeakMatchGate(min_steps=2, probe_every=3)
        >>> b = g.band(None); b, g.band(0.05), g.band(0.3)     # 0.3: never gated
        (0, 1, None)
        >>> g.drafts(b), g.record(b, 0, 10.0, 0.6), g.drafts(b), g.record(b, 0, 10.0, 0.6)
        (True, None, True, None)
        >>> [g.drafts(b) for _ in range(6)], g.drafts(1)    # closed: one probe in three; band 1 still open
        ([False, False, True, False, False, True], True)
        >>> g.record(b, 1, 10.0, 2.0); g.drafts(b)          # the probe's token paid for its time
        True
    """

    def __init__(self, *, decay: float = 0.95, min_steps: int = 8, probe_every: int = 32) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if min_steps < 0 or probe_every < 1:
            raise ValueError(f"need min_steps >= 0 and probe_every >= 1, got {min_steps} and {probe_every}")
        self.decay = float(decay)
        self.min_steps = int(min_steps)
        self.probe_every = int(probe_every)
        n = len(BANDS) + 1
        self.steps = [0] * n          # per band: steps that drafted
        self.skipped = [0] * n        # per band: steps made plain
        self.saved_ms = [0.0] * n     # decayed: accepted tokens times a plain step's ms
        self.cost_ms = [0.0] * n      # decayed: what those steps cost beyond a plain step
        self._open = [True] * n

    # What ``state()`` gives and ``restore`` takes: per band, in band order.
    FIELDS = ("steps", "skipped", "saved_ms", "cost_ms")

    def state(self) -> dict[str, list]:
        """The evidence, per band (``FIELDS``), as plain lists (``drafters/saved.py`` writes it)."""
        return {name: list(getattr(self, name)) for name in self.FIELDS}

    def restore(self, state: dict[str, list]) -> None:
        """Take back ``state()``'s evidence.

        Raises:
            ValueError: a field missing, of the wrong length, or not a non-negative number.
        """
        n = len(BANDS) + 1
        for name in self.FIELDS:
            v = state.get(name) if isinstance(state, dict) else None
            if not (isinstance(v, list) and len(v) == n and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf") for x in v)):
                raise ValueError(f"weak-match gate: {name!r} must be {n} non-negative numbers")
        self.steps = [int(x) for x in state["steps"]]
        self.skipped = [int(x) for x in state["skipped"]]
        self.saved_ms = [float(x) for x in state["saved_ms"]]
        self.cost_ms = [float(x) for x in state["cost_ms"]]
        self._open = [self.pays(b) for b in range(n)]

    @staticmethod
    def band(best_score: float | None) -> int | None:
        """The band of a step whose best lookup node scored ``best_score`` (None: nothing matched);
        None for a match too strong to gate."""
        if best_score is None:
            return 0
        k = bisect.bisect_right(BANDS, float(best_score))
        return k + 1 if k < len(BANDS) else None

    def pays(self, band: int) -> bool:
        """Whether ``band``'s recent steps' tokens paid for their time (True before ``min_steps``)."""
        return self.steps[band] < self.min_steps or self.saved_ms[band] >= self.cost_ms[band]

    def drafts(self, band: int) -> bool:
        """Called once per step of ``band``: True to draft, False for a plain step."""
        if self.pays(band):
            return True
        self.skipped[band] += 1
        return self.skipped[band] % self.probe_every == 0

    def record(self, band: int, tokens: int, plain_ms: float, cost_ms: float) -> None:
        """One step of ``band`` that drafted: its accepted draft ``tokens``, a plain step's modelled
        ``plain_ms`` and the step's ``cost_ms`` beyond a plain step."""
        d = self.decay
        self.saved_ms[band] = self.saved_ms[band] * d + max(int(tokens), 0) * max(float(plain_ms), 0.0)
        self.cost_ms[band] = self.cost_ms[band] * d + max(float(cost_ms), 0.0)
        self.steps[band] += 1
        now = self.pays(band)
        if now != self._open[band]:
            self._open[band] = now
            what = "nothing matched" if band == 0 else f"the best lookup score under {BANDS[band - 1]}"
            log.info("steps where %s %s: %.2f ms saved against %.2f ms spent over recent ones", what,
                     "draft again" if now else "no longer draft", self.saved_ms[band], self.cost_ms[band])
