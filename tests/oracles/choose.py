"""Slow reference for ``_native.auto_choose``: ``auto``'s Python route, one routine after another."""
from __future__ import annotations

import numpy as np

from lookupdec.drafters.calibrate import Calibration
from lookupdec.drafters.ledger import step_shares
from lookupdec.drafters.merged import MergedCalibration
from lookupdec.drafters.select import select_nodes
from lookupdec.tree import merge_trees


def choose_reference(trees, calibration: Calibration, cost: np.ndarray, budget: int, max_depth: int,
                     margin: float, spent: list[float], window_costs: list):
    """``(merged, rated, record, nodes, cut, shares)`` as ``auto_choose`` returns them, from
    ``merge_trees``, ``MergedCalibration.apply`` (its waiting proposal is the record),
    ``select_nodes``, ``DraftTree.subset`` and ``step_shares``; ``cut`` is a DraftTree or None."""
    merged = merge_trees(trees)
    mc = MergedCalibration(calibration)
    rated = mc.apply(merged)
    waiting = mc._outcomes._waiting
    record = (waiting[0].tokens, waiting[0].parents, waiting[0].depth, waiting[0].keys) if waiting else None
    nodes = select_nodes(rated, cost, budget, max_depth, margin).nodes
    k = len(nodes)
    cut = rated.subset(nodes) if k < len(rated) else None
    window_ms = [float(cost[1 + k] - w[1 + k]) if w is not None else 0.0 for w in window_costs]
    shares = step_shares(merged, spent, nodes.tolist(), cost, window_ms)
    return merged, rated, record, nodes, cut, shares


def split_reference(maps, chosen: list[int], accepted: tuple, origin: np.ndarray, n_tree: int):
    """``split_outcome`` as ``AutoDrafter.commit`` computed it in Python: the accepted nodes' merged
    nodes, and per source None (proposed nothing, or nothing was chosen) or ``(own, origin)``."""
    accepted_merged = [chosen[a] for a in accepted]
    verified = origin.tolist() if len(origin) else range(n_tree)
    verified_merged = [chosen[v] if v >= 0 else -1 for v in verified] if chosen else [-1] * len(verified)
    parts = []
    for where in maps:
        if not len(where) or not chosen:
            parts.append(None)
            continue
        first: dict[int, int] = {}
        for j, m in enumerate(where.tolist()):
            first.setdefault(m, j)
        own = []
        for m in accepted_merged:
            j = first.get(m)
            if j is None:
                break
            own.append(j)
        parts.append((tuple(own), np.array([first.get(m, -1) for m in verified_merged], np.int64)))
    return accepted_merged, parts
