"""Drafting from remembered outputs: earlier generations kept in a history store.

Answers to similar requests repeat themselves (the same phrasing, the same
code, the same list layout), across requests and across processes. The
store (``lookupdec.index.history``) keeps finished generations; at the start
of each request this drafter picks up what was added since, then drafts like
REST from its segments and recent log (``IndexDrafter``).
"""
from __future__ import annotations

from typing import Sequence

from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.indexed import IndexDrafter, LookupSettings

HISTORY_SETTINGS = LookupSettings(max_n=16, min_n=2, max_occurrences=256, depth=16, width=48)


class HistoryDrafter(IndexDrafter):
    """Drafts from a ``HistoryStore``.

    Args:
        history: an open ``lookupdec.index.history.HistoryStore``.
        settings: lookup settings (default ``HISTORY_SETTINGS``).
        calibration: shared acceptance rates.

    Example:
        >>> from lookupdec.drafters.base import DraftRequest
        >>> from lookupdec.index.history import open_history
        >>> import tempfile
        >>> store = open_history(tempfile.mkdtemp())
        >>> store.append([4, 5, 6, 7, 8])
        >>> d = HistoryDrafter(store)
        >>> d.begin([1, 5, 6])
        >>> d.propose(DraftRequest(budget=8, max_depth=2)).tokens.tolist()
        [7, 8]
    """

    def __init__(self, history, settings: LookupSettings | None = None, *,
                 calibration: Calibration | None = None) -> None:
        if history is None:
            raise ValueError("method 'history' needs a history store: Decoder(history=DIR) or --history DIR")
        super().__init__([], "history", settings or HISTORY_SETTINGS, calibration=calibration)
        self.history = history

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.history.refresh()
        self.indexes = self.history.indexes()
        super().begin(prompt_ids)
