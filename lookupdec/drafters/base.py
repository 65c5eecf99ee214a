"""The drafter protocol every drafter implements.

The decoder owns the token sequence. A drafter sees it through three calls:

- ``begin(prompt_ids)``: a new sequence starts with these prompt tokens;
- ``propose(budget)``: a DraftTree continuing the current sequence (whose last
  token is the tree's root), with at most ``budget`` nodes; the empty tree when
  nothing is worth verifying;
- ``commit(new_ids, accepted)``: ``new_ids`` (the accepted draft tokens plus the
  bonus token) were appended to the sequence; ``accepted`` of them came from
  the draft, the feedback adaptive drafters use.

Drafters never call the model; those that need it (small LM, Lookahead) get
an interface from the decoder.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from lookupdec.tree import DraftTree


@runtime_checkable
class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(self, budget: int) -> DraftTree: ...

    def commit(self, new_ids: Sequence[int], accepted: int) -> None: ...


class NoDrafter:
    """Drafts nothing: the decoder then runs plain autoregressive decoding (``ar``)."""

    name = "ar"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, budget: int) -> DraftTree:
        return DraftTree.empty()

    def commit(self, new_ids: Sequence[int], accepted: int) -> None:
        pass
