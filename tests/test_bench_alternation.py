"""benchmarks/alternation.py: two variants take turns call by call, the first calls untimed."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from alternation import alternated_ms  # noqa: E402


def test_variants_alternate_each_is_timed_repeats_times_and_the_first_is_left_set():
    state = {"now": None}
    calls = []
    variants = {"a": lambda: state.update(now="a"), "b": lambda: state.update(now="b")}
    out = alternated_ms(lambda: calls.append(state["now"]), variants, repeats=3)
    assert calls == ["a", "b"] * 4  # one untimed call of each, then three timed of each
    assert set(out) == {"a", "b"} and all(v >= 0 for v in out.values())
    assert state["now"] == "a"  # the default put back
