"""The Predicted Outputs benchmark's editing set and its argument checks (no model)."""
from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from editset import edit_cases, kept_share  # noqa: E402
import predicted_outputs  # noqa: E402


def _kept_slow(original: str, output: str) -> float:
    """Oracle: the longest common subsequence of characters, by dynamic programming."""
    prev = [0] * (len(output) + 1)
    for a in original:
        cur = [0]
        for j, b in enumerate(output):
            cur.append(prev[j] + 1 if a == b else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1] / len(original)


@pytest.mark.parametrize("a,b", [("abcdef", "abXcdef"), ("def f(x):\n  return x", "def f(y):\n  return y"),
                                 ("aaaa", "aa"), ("abc", "")])
def test_kept_share_is_at_most_the_lcs_share_and_exact_on_simple_edits(a, b):
    fast = kept_share(a, b)
    assert 0.0 <= fast <= _kept_slow(a, b) + 1e-12  # matching blocks are a common subsequence
    if len(a) < 10:
        assert fast == pytest.approx(_kept_slow(a, b))


def test_cases_are_fixed_varied_and_each_a_small_edit():
    cases = edit_cases(12)
    assert len(cases) == 12
    assert [c.name for c in cases] == [c.name for c in edit_cases(12)]
    assert len({c.name.split(":")[1] for c in cases}) == 3  # every edit kind appears
    for c in cases:
        assert c.edited != c.source and kept_share(c.source, c.edited) >= 0.8
        assert c.source in c.messages()[0]["content"] and c.source in c.prediction()
        changed = [op for op in difflib.SequenceMatcher(None, c.source, c.edited).get_opcodes() if op[0] != "equal"]
        assert changed  # something to edit, named in the request
        assert "`" in c.request


def test_methods_must_start_with_the_reference():
    with pytest.raises(SystemExit):
        predicted_outputs.parse_args(["--methods", "auto,ar"])
    with pytest.raises(SystemExit):
        predicted_outputs.parse_args(["--methods", "ar,magic"])
    assert predicted_outputs.parse_args(["--methods", "ar,auto+prediction"]).methods == ["ar", "auto+prediction"]


def test_summary_splits_the_prefill_off_and_bounds_ar_by_it():
    Row = predicted_outputs.Row
    # Two cases; ar: 100 + 50 tokens in 2.0 + 1.0 s, of which prefill 0.5 + 0.25 s. auto+prediction:
    # the same tokens in 0.8 + 0.45 s after the same prefills. The peer has no prefill timing.
    rows = [Row("a", "ar", 100, 2.0, 100, 0.9, False, True, 0, 0.5),
            Row("a", "auto+prediction", 100, 0.8, 20, 0.9, False, True, 60, 0.5),
            Row("a", "hf", 100, 8.0, 100, 0.9, False, True, 0),
            Row("b", "ar", 50, 1.0, 50, 0.5, False, True, 0, 0.25),
            Row("b", "auto+prediction", 50, 0.45, 10, 0.5, False, True, 30, 0.25),
            Row("b", "hf", 50, 4.0, 50, 0.5, False, True, 0)]
    s = predicted_outputs.summarize(rows, ["ar", "auto+prediction", "hf"])
    ar, pred, hf = (s["all"][m] for m in ("ar", "auto+prediction", "hf"))
    assert ar["first_token_s"] == pytest.approx(0.75)
    assert ar["decode_tokens_per_s"] == pytest.approx(148 / 2.25)
    assert pred["decode_tokens_per_s"] == pytest.approx(148 / 0.5)
    assert pred["decode_x_ar"] == pytest.approx(2.25 / 0.5)
    assert pred["x_ar"] == pytest.approx(3.0 / 1.25)
    assert ar["ceiling_x_ar"] == pytest.approx(3.0 / 0.75)
    assert "decode_tokens_per_s" not in hf and "decode_x_ar" not in hf
    # Only case "a" keeps >= 80% of its file: the subset is summarised from its rows alone.
    kept = s["kept>=80%"]
    assert kept["ar"]["cases"] == 1 and kept["ar"]["ceiling_x_ar"] == pytest.approx(2.0 / 0.5)
    md = predicted_outputs.markdown(s, {"cases": 2, "max_new_tokens": 100, "machine": "x", "torch": "t",
                                        "threads": 2})
    assert "Ceiling with the prefill counted" in md and "| hf | 12.5 |" in md


def test_time_limit_reports_the_cases_done_and_checks_them_against_ar(tmp_path):
    """--time-limit 0 runs the first case only (the first always runs) and writes its rows."""
    import json

    from tests.conftest import save_tiny

    model = save_tiny(tmp_path / "m", 0, max_positions=2048)  # a case's prompt is ~800 characters
    rc = predicted_outputs.main(["--model", model, "--cases", "3", "--max-new-tokens", "6", "--whole-output",
                                 "--methods", "ar,auto,auto+prediction", "--time-limit", "0",
                                 "--out", str(tmp_path / "out")])
    data = json.loads((tmp_path / "out" / "predicted_outputs.json").read_text())
    assert rc == 0 and data["info"]["cases"] == 1
    assert {r["case"] for r in data["rows"]} == {edit_cases(1)[0].name}
    assert [r["method"] for r in data["rows"]] == ["ar", "auto", "auto+prediction"]
    assert all(r["exact"] and r["new_tokens"] == 6 for r in data["rows"])
