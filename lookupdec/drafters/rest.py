"""REST: draft from corpus datastores built once with ``lookupdec build-index``.

Each step the sequence's longest suffix (2 to 16 tokens) found in the
datastores proposes the continuations of up to 1,000 of its occurrences,
counted into a trie (``SuffixIndex.lookup``); the share of occurrences behind
each path is its raw estimate, calibrated online per match length.
"""
from __future__ import annotations

from typing import Sequence

from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.indexed import IndexDrafter, LookupSettings

REST_SETTINGS = LookupSettings(max_n=16, min_n=2, max_occurrences=1000, depth=12, width=48)


class RESTDrafter(IndexDrafter):
    """Drafts from opened corpus datastores (``lookupdec.index.open_index``).

    Args:
        indexes: one or more SuffixIndex objects, checked against the model's
            tokenizer by the caller (``Decoder`` does).
        settings: lookup settings (default ``REST_SETTINGS``).
        calibration: shared acceptance rates.
    Raises:
        ValueError: no index.
    """

    def __init__(self, indexes: Sequence, settings: LookupSettings | None = None, *,
                 calibration: Calibration | None = None) -> None:
        if not indexes:
            raise ValueError("method 'rest' needs a corpus datastore: Decoder(indexes=DIR) or --index DIR "
                             "(build one with `lookupdec build-index`)")
        super().__init__(indexes, "rest", settings or REST_SETTINGS, calibration=calibration)
