"""When ``auto`` calls its small LM: only where it is expected to pay more than the lookup tree.

The lookup sources cost almost nothing to run; the small LM costs one draft
forward per token. So ``auto`` first selects the best lookup subtree
(``select_nodes``: expected tokens ``1 + sum of scores`` over the target's
forward time ``c(1 + k)``), and calls the small LM only when its own expected
rate, ``(1 + sum_d prod_{j<=d} a_j) / (D * draft_ms + c(1 + D + alternates))``
at its best depth ``D`` (``SmallLMDrafter.expected_rate``), beats that by
``margin``. Its nodes are then merged with the lookup nodes and the selection
runs again over the merged tree.
"""
from __future__ import annotations

from lookupdec.drafters.select import DEFAULT_MARGIN, Selection


def draft_pays(draft, lookup: Selection, max_depth: int, margin: float = DEFAULT_MARGIN) -> bool:
    """Whether the small LM's expected tokens per ms beat the lookup selection's by ``margin``.

    Args:
        draft: a ``SmallLMDrafter`` (anything with ``expected_rate(max_depth) -> (depth, tokens per ms)``).
        lookup: the lookup tree's selection (``expected_tokens`` over ``ms``; a plain step when empty).
        max_depth: deepest useful node this step.
    Returns:
        True to call the small LM this step.
    Example:
        >>> class D:
        ...     def expected_rate(self, max_depth): return 3, 0.05
        >>> import numpy as np
        >>> draft_pays(D(), Selection(np.zeros(0, np.int64), 1.0, 30.0, 1.0), 8)    # 1/30 < 0.05
        True
        >>> draft_pays(D(), Selection(np.arange(4), 3.0, 40.0, 2.25), 8)             # 3/40 > 0.05
        False
    """
    depth, rate = draft.expected_rate(max_depth)
    if depth <= 0:
        return False
    return rate > (lookup.expected_tokens / lookup.ms) * (1.0 + margin)
