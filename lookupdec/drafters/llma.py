"""LLMA: draft from reference documents passed with the request.

In retrieval-augmented generation and summarization the answer copies spans
of the documents in the prompt or retrieved for it. The references are
indexed in memory when the request starts (``lookupdec.index.memory``), and
each step the sequence's longest suffix found in them proposes what followed
(``IndexDrafter``). Even a 1-token match counts: calibration learns how often
such short matches are right and scores them accordingly.
"""
from __future__ import annotations

from typing import Sequence

from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.indexed import IndexDrafter, LookupSettings

# References are short: every occurrence can be read.
LLMA_SETTINGS = LookupSettings(max_n=16, min_n=1, max_occurrences=64, depth=16, width=48)


class LLMADrafter(IndexDrafter):
    """Drafts from reference documents (token ids).

    Args:
        references: token ids of each document.
        settings: lookup settings (default ``LLMA_SETTINGS``).
        calibration: shared acceptance rates.
        source: the ``SOURCES`` name its nodes carry: "llma" for reference documents,
            "prediction" for a request's predicted output (the same drafting, counted apart).
    Raises:
        ValueError: no references, or only empty ones.

    Example:
        >>> from lookupdec.drafters.base import DraftRequest
        >>> d = LLMADrafter([[10, 11, 12, 13]])
        >>> d.begin([4, 10, 11])
        >>> d.propose(DraftRequest(budget=4, max_depth=8)).tokens.tolist()
        [12, 13]
    """

    def __init__(self, references: Sequence[Sequence[int]], settings: LookupSettings | None = None, *,
                 calibration: Calibration | None = None, source: str = "llma") -> None:
        from lookupdec.index.memory import memory_index

        if not references:
            raise ValueError("method 'llma' needs references: pass references=[...] (--reference FILE)")
        super().__init__([memory_index(references)], source, settings or LLMA_SETTINGS, calibration=calibration)
