"""What drafting learns and keeps across one decoder's requests, in one object.

A ``Decoder`` owns one ``DrafterState`` and hands it to the drafters it builds:

- ``calibration``: acceptance rates by key, per temperature band
  (``drafters/calibrate.py``);
- Token Recycling's adjacency tables, one per (candidates per token, method),
  so ``recycle`` and ``auto`` never warm each other's table;
- ``SourceLedger`` accounts, per (method, temperature band) (``drafters/ledger.py``);
- the cost provider (a ``CostCurve``/``CostModel`` or a callable returning one);
- the small draft model, when the decoder has one.

Two decoders never share any of it; a drafter built without a state gets a
private one. This replaces tables found through a module-level dict keyed by
``id(calibration)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lookupdec.drafters.calibrate import Calibration


# Longest pause of a lone sequence's drafting (steps): a copy chance missed costs more than a
# batch's, where the other sequences' steps go on.
SINGLE_MAX_PAUSE = 32


@dataclass
class DrafterState:
    """One decoder's drafting state (see the module docstring).

    Attributes:
        calibration: the root ``Calibration`` (its bands are ``calibration.band(t)``).
        cost: the cost provider, or a callable returning it (None: not priced).
        draft_model: the small-LM ``DraftModel`` (None: none).
        recycle_tables: ``(k, method) -> RecycleTable``.
        ledgers: ``(method, temperature band) -> SourceLedger``.
        gates: ``(method, temperature band) -> BatchGate`` of single sequences (``Decoder.generate``).

    Example:
        >>> s = DrafterState()
        >>> s.recycle_table(4, "recycle") is s.recycle_table(4, "recycle"), s.recycle_table(4, "auto") is s.recycle_table(4)
        (True, False)
        >>> s.recycle_table(4) is DrafterState().recycle_table(4)
        False
    """

    calibration: Calibration = field(default_factory=Calibration)
    cost: Any = None
    draft_model: Any = None
    recycle_tables: dict = field(default_factory=dict)
    ledgers: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)

    def copy(self) -> "DrafterState":
        """A copy that learns apart from this one: its own calibration, tables, accounts and gates,
        sharing the cost provider and the draft model (measurements of the hardware and a model,
        not learnt from text). A benchmark that times one call several times starts each from a copy.

        Example:
            >>> s = DrafterState(cost="curve")
            >>> c = s.copy(); c.recycle_table(4) is s.recycle_table(4), c.cost is s.cost
            (False, True)
        """
        import copy

        return copy.deepcopy(self, memo={id(self.cost): self.cost, id(self.draft_model): self.draft_model})

    def recycle_table(self, k: int, method: str = "recycle"):
        """The ``RecycleTable`` of ``k`` candidates per token that ``method``'s drafters share (made on first use)."""
        from lookupdec.drafters.recycle import RecycleTable

        key = (int(k), str(method))
        table = self.recycle_tables.get(key)
        if table is None:
            table = self.recycle_tables[key] = RecycleTable(int(k))
        return table

    def gate(self, method: str, temperature: float):
        """The single-sequence ``BatchGate`` of ``method`` at ``temperature``'s band (made on first use)."""
        from lookupdec.batch import BatchGate
        from lookupdec.drafters.calibrate import temperature_band

        key = (str(method), temperature_band(temperature))
        gate = self.gates.get(key)
        if gate is None:
            gate = self.gates[key] = BatchGate(min_size=1, max_pause=SINGLE_MAX_PAUSE)
        return gate

    def ledger(self, method: str, temperature: float):
        """The ``SourceLedger`` of ``method`` at ``temperature``'s band (made on first use)."""
        from lookupdec.drafters.calibrate import temperature_band
        from lookupdec.drafters.ledger import SourceLedger

        key = (str(method), temperature_band(temperature))
        led = self.ledgers.get(key)
        if led is None:
            led = self.ledgers[key] = SourceLedger()
        return led
