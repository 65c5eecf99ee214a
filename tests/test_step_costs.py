"""``drafters/step_costs.py``: the table ``auto`` prices its trees with, against the curve itself (the oracle)."""
from __future__ import annotations

import numpy as np

from lookupdec.costs import CostCurve
from lookupdec.drafters.step_costs import PAST_STEP, StepCosts

# Every row and every 1,000 cached rows cost more: a table made at one cache length is wrong at another.
CURVE = CostCurve((1, 8, 64), (10.0, 14.0, 60.0), 0, (1.0, 2.0, 9.0), "cpu", "past")


def test_the_table_is_the_curves_at_the_cache_length_it_was_made_for():
    costs = StepCosts(lambda: CURVE)
    got = costs.table(300, 20)
    assert np.array_equal(got, CURVE.table(300, 21))
    assert got[0] == np.inf and np.all(np.diff(got[1:]) > 0)


def test_it_is_made_again_once_the_cache_has_grown_by_past_step_rows_and_not_before():
    costs = StepCosts(lambda: CURVE)
    first = costs.table(300, 20)
    assert costs.table(300 + PAST_STEP - 1, 20) is first  # the past moves the curve slowly: kept
    later = costs.table(300 + PAST_STEP, 20)
    assert later is not first and np.array_equal(later, CURVE.table(300 + PAST_STEP, 21))
    assert np.all(later[1:] > first[1:])  # this curve's every width costs more with a longer cache


def test_a_wider_request_makes_a_wider_table():
    costs = StepCosts(lambda: CURVE)
    narrow = costs.table(0, 4)
    wide = costs.table(0, 40)
    assert len(wide) > len(narrow) and np.array_equal(wide, CURVE.table(0, 41))


def test_window_rows_shift_the_widths_they_ride_beside():
    costs = StepCosts(lambda: CURVE)
    base = costs.table(0, 20)
    with_window = costs.table(0, 20, extra=3)
    assert np.array_equal(with_window[1:18], base[4:21])  # k tree rows beside 3 window rows cost c(k + 3)


def test_without_a_curve_every_width_costs_the_same():
    assert np.array_equal(StepCosts(lambda: None).table(0, 3), [np.inf, 1.0, 1.0, 1.0, 1.0])
