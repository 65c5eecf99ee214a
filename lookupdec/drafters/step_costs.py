"""The modelled cost of a step by its width, as ``auto`` prices its trees: one table, kept current."""
from __future__ import annotations

from typing import Callable

import numpy as np

# Re-tabulate when the cache has grown by this many rows (the past moves the curve slowly).
PAST_STEP = 64


class StepCosts:
    """``table(past, budget, extra)[w]``: modelled ms of a forward of ``w`` tree rows (root included)
    beside ``extra`` window rows, at a cache of ``past`` rows.

    Every row costs what its place in the forward costs, whatever its mask, so a
    tree of ``k`` nodes beside ``m`` window rows is priced ``c(1 + k + m)``, plus the
    window rows' ``lm_head`` (``logits_extra_ms``). A source's top-k costs no row: it
    is taken from the rows the acceptance walk computes (deferred top-k, verify.py).
    The table follows the cost model (``lookupdec.pricing.CostModel``) as measured
    steps refit it: it is made again when the model's ``version`` changes, when the
    cache has grown by ``PAST_STEP`` rows, or when a wider one is asked for.

    Args:
        curve: returns the ``CostCurve``/``CostModel`` (None: every width costs the same).

    Example:
        >>> from lookupdec.costs import CostCurve
        >>> c = StepCosts(lambda: CostCurve((1, 64), (10.0, 73.0), 0, (0.0, 0.0), "cpu", ""))
        >>> [round(float(x), 1) for x in c.table(0, 4)[1:4]], round(float(c.table(0, 4, extra=2)[1]), 1)
        ([10.0, 11.0, 12.0], 12.0)
    """

    def __init__(self, curve: Callable[[], object]) -> None:
        self._curve = curve
        self._table: np.ndarray | None = None
        self._past = -1
        self._version = -1
        self._extra: dict[int, np.ndarray] = {}

    def table(self, past: int, budget: int, extra: int = 0) -> np.ndarray:
        """The table (index 0 is ``inf``) for trees of up to ``budget`` nodes beside ``extra`` window rows."""
        curve = self._curve()
        version = getattr(curve, "version", 0)
        if (self._table is None or len(self._table) < budget + 2 + extra or abs(past - self._past) >= PAST_STEP
                or version != self._version):
            top = max(budget + 1 + extra, 2)
            self._table = np.concatenate([[np.inf], np.ones(top)]) if curve is None else curve.table(past, top)
            self._past = past
            self._version = getattr(curve, "version", 0)  # table() may have refitted it
            self._extra = {}
        if not extra:
            return self._table
        out = self._extra.get(extra)
        if out is None:
            out = np.concatenate([[np.inf], self._table[1 + extra:]])
            if curve is not None and curve.head_ms:
                from lookupdec.costs import MEASURED_LOGIT_ROWS

                # From MEASURED_LOGIT_ROWS tree rows on, the extra lm_head rows are the same
                # (the window's), so they are priced once for all those widths.
                for w in range(1, min(MEASURED_LOGIT_ROWS, len(out) - 1) + 1):
                    out[w] += curve.logits_extra_ms(w + extra, w + extra)
                out[MEASURED_LOGIT_ROWS + 1:] += curve.logits_extra_ms(MEASURED_LOGIT_ROWS + extra,
                                                                       MEASURED_LOGIT_ROWS + extra)
            self._extra[extra] = out
        return out
