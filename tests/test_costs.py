"""The verifier's cost curve: interpolation, measurement on a real verifier, the disk cache."""
from __future__ import annotations

import json

import pytest
import torch

from lookupdec import costs
from lookupdec.costs import CostCurve, cached_curve, curve_key
from lookupdec.verify import TreeVerifier
from tests.conftest import tiny_model


def test_interpolation_past_slope_and_extrapolation():
    c = CostCurve((1, 4, 8), (10.0, 13.0, 21.0), 100, (0.01, 0.02, 0.04), "cpu", "k")
    assert c.ms_at(1) == 10.0 and c.ms_at(6) == 17.0
    assert c.ms_at(1, past=300) == pytest.approx(12.0)            # 200 rows more at 0.01 ms each
    assert c.ms_at(6, past=0) == pytest.approx(17.0 - 100 * 0.03)  # the slope interpolates too
    assert c.ms_at(10) == pytest.approx(25.0)                      # the last slope continues
    t = c.table(past=100, max_width=3)
    assert t[0] == float("inf") and t[1:].tolist() == [10.0, 11.0, 12.0]


@pytest.mark.parametrize("bad", [dict(widths=(2, 4)), dict(widths=(1, 1)), dict(ms=(1.0,)), dict(ms=(0.0, 1.0))])
def test_invalid_curves_are_refused(bad):
    fields = dict(widths=(1, 4), ms=(1.0, 2.0), base_past=0, slope_ms=(0.0, 0.0), device="cpu", key="k") | bad
    if len(fields["slope_ms"]) != len(fields["widths"]):
        fields["slope_ms"] = (0.0,) * len(fields["widths"])
    with pytest.raises(ValueError):
        CostCurve(**fields)


def test_json_round_trip_and_damaged_files():
    c = CostCurve((1, 4), (1.5, 2.5), 10, (0.0, 0.001), "cpu: x", "abc")
    assert CostCurve.from_json(c.to_json()) == c
    for text in ("", "{", '{"format": 99}', '{"format": 1, "widths": [1]}', '"a string"', "[1, 2]"):
        with pytest.raises(ValueError):
            CostCurve.from_json(text)
    # Numbers JSON holds but a curve cannot (they raised OverflowError, which the cache did not catch).
    good = json.loads(c.to_json())
    for field, value in (("widths", [1, 10 ** 400]), ("ms", [1.5, 10 ** 400]), ("widths", [1, float("inf")]),
                         ("base_past", float("inf")), ("slope_ms", [0.0, 10 ** 400]), ("head_ms", [10 ** 400, 1.0])):
        with pytest.raises(ValueError, match="cost curve"):
            CostCurve.from_json(json.dumps({**good, field: value}))


def test_measured_once_then_read_from_disk_and_remeasured_on_request(tmp_path, monkeypatch):
    verifier = TreeVerifier(tiny_model(0), fast=True)
    kw = dict(widths=(1, 2, 4), past=16, far_past=48, repeats=1, warmup=0)
    first = cached_curve(verifier, threads=1, cache_dir=tmp_path, **kw)
    assert first.widths == (1, 2, 4) and all(m > 0 for m in first.ms) and first.base_past == 17
    files = list(tmp_path.glob("*.json"))
    assert [f.stem for f in files] == [first.key]

    def no_measuring(*a, **k):
        raise AssertionError("measured although a cached curve exists")

    monkeypatch.setattr(costs, "measure", no_measuring)
    assert cached_curve(verifier, threads=1, cache_dir=tmp_path, **kw) == first
    monkeypatch.undo()
    again = cached_curve(verifier, threads=1, cache_dir=tmp_path, remeasure=True, **kw)
    assert again.key == first.key and CostCurve.from_json(files[0].read_text()) == again
    # A damaged cache file is measured over, not trusted.
    files[0].write_text("garbage")
    assert cached_curve(verifier, threads=1, cache_dir=tmp_path, **kw).key == first.key


def test_a_rebuilt_native_extension_has_its_own_curve_and_the_saved_state_keeps_its_key(monkeypatch):
    import hashlib

    import lookupdec.costs as costs
    from lookupdec import _native

    m = tiny_model(0)
    with open(_native.__file__, "rb") as f:  # the oracle: the file's own hash
        assert costs.native_build() == hashlib.sha256(f.read()).hexdigest()[:12]
    before, state = curve_key(m, "fast", 1), curve_key(m, "fast", 1, versioned=False)
    monkeypatch.setattr(costs, "native_build", lambda: "another-build")
    assert curve_key(m, "fast", 1) != before
    assert curve_key(m, "fast", 1, versioned=False) == state


def test_a_rebuilt_native_extension_times_the_weight_formats_again(monkeypatch):
    import lookupdec.costs as costs
    from lookupdec.weights import choice_key

    m = tiny_model(0)
    before = choice_key(m, "float32", 1)
    monkeypatch.setattr(costs, "native_build", lambda: "another-build")
    assert choice_key(m, "float32", 1) != before


def test_key_changes_with_threads_backend_dtype_and_model():
    m = tiny_model(0)
    k = curve_key(m, "fast", 1)
    assert k == curve_key(tiny_model(1), "fast", 1)  # same architecture and size, other weights: same curve
    assert len({k, curve_key(m, "fast", 2), curve_key(m, "hf", 1), curve_key(tiny_model(0, layers=3), "fast", 1),
                curve_key(m.to(torch.bfloat16), "hf", 1)}) == 5
