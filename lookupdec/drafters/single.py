"""The single-source methods (``llma``, ``rest``, ``history``, ``recycle``, ``lookahead``).

Each is an ``AutoDrafter`` over one source: its tree is scored and sized by the
cost curve exactly as ``auto`` sizes the merged tree, so a single method
differs from ``auto`` only in what drafts.
"""
from __future__ import annotations

from typing import Callable, Sequence

from lookupdec.costs import CostCurve
from lookupdec.drafters.auto import AutoDrafter
from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.state import DrafterState


def llma_method(*, references: Sequence[Sequence[int]] | None = None, prediction: Sequence[int] | None = None,
                calibration: Calibration | None = None,
                cost: CostCurve | Callable[[], CostCurve] | None = None) -> AutoDrafter:
    """Method ``llma``: reference documents (and a predicted output) alone, sized by the cost curve as ``auto``.

    Raises:
        ValueError: neither references nor a prediction.
    """
    from lookupdec.drafters.llma import LLMADrafter

    sources = []
    if references or not prediction:
        sources.append(LLMADrafter(references or (), calibration=calibration))
    if prediction:
        sources.append(LLMADrafter([prediction], calibration=calibration, source="prediction"))
    return AutoDrafter(sources=sources, calibration=calibration, cost=cost, name="llma")


def history_method(*, history=None, calibration: Calibration | None = None,
                   cost: CostCurve | Callable[[], CostCurve] | None = None) -> AutoDrafter:
    """Method ``history``: remembered outputs alone, sized by the cost curve as ``auto`` sizes its tree.

    Raises:
        ValueError: no history store.
    """
    from lookupdec.drafters.history import HistoryDrafter

    return AutoDrafter(sources=[HistoryDrafter(history, calibration=calibration)], calibration=calibration,
                       cost=cost, name="history")


def rest_method(*, indexes: Sequence | None = None, calibration: Calibration | None = None,
                cost: CostCurve | Callable[[], CostCurve] | None = None) -> AutoDrafter:
    """Method ``rest``: corpus datastores alone, sized by the cost curve as ``auto`` sizes its tree.

    Raises:
        ValueError: no index.
    """
    from lookupdec.drafters.rest import RESTDrafter

    return AutoDrafter(sources=[RESTDrafter(indexes or (), calibration=calibration)], calibration=calibration,
                       cost=cost, name="rest")


def recycle_method(*, calibration: Calibration | None = None,
                   cost: CostCurve | Callable[[], CostCurve] | None = None,
                   state: DrafterState | None = None) -> AutoDrafter:
    """Method ``recycle``: Token Recycling alone, sized by the cost curve as ``auto`` sizes its tree.

    Its table is ``state``'s (the decoder's: it warms up across requests); None: a private one.
    """
    from lookupdec.drafters.recycle import RecycleDrafter

    return AutoDrafter(sources=[RecycleDrafter(calibration=calibration, state=state)], calibration=calibration,
                       cost=cost, name="recycle", state=state)


def lookahead_method(*, calibration: Calibration | None = None,
                     cost: CostCurve | Callable[[], CostCurve] | None = None) -> AutoDrafter:
    """Method ``lookahead``: the Lookahead pool and window alone, sized by the cost curve as ``auto`` sizes its tree."""
    from lookupdec.drafters.lookahead import LookaheadDrafter

    return AutoDrafter(sources=[LookaheadDrafter(calibration=calibration, cost=cost)], calibration=calibration,
                       cost=cost, name="lookahead")
