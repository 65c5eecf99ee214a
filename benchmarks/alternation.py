"""Two variants of one call timed against each other, taking turns call by call.

On a VM whose speed drifts, timing variant A and then variant B puts the drift into their ratio;
alternating them call by call spreads it over both. ``forward_widths.py --compare-layers`` /
``--compare-routes`` and ``product_routes.py`` time their variants this way.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable


def alternated_ms(fn: Callable[[], object], variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of ``fn`` under each of two variants, after one untimed call of each.

    Args:
        fn: the call to time.
        variants: two ``name -> setter`` entries; a setter puts its variant in place before each call.
            The first is set again at the end (the default the caller leaves behind).
        repeats: timed calls of each variant.
    Returns:
        ``{name: median ms}`` rounded to 0.01 ms.
    """
    kinds = list(variants)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(2 * repeats + 2):
        kind = kinds[i % 2]
        variants[kind]()
        t = time.perf_counter()
        fn()
        if i >= 2:  # one untimed call of each first
            times[kind].append(time.perf_counter() - t)
    variants[kinds[0]]()
    return {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()}
