"""The native top-k of logit rows (ext/csrc/topk.c, ``lookupdec.tree_rows.topk_rows`` on a CPU) against a slow
oracle: a stable sort for the ids, a float64 softmax for the probabilities, on every instruction set."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.tree_rows import topk_rows

pytestmark = pytest.mark.cpu

def _oracle(x: np.ndarray, k: int):
    order = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :k]  # larger first, then lower id
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    p = np.exp(x64 - m) / np.exp(x64 - m).sum(axis=1, keepdims=True)
    return order, np.take_along_axis(p, order, axis=1)


def _rows(rng, R, n):
    x = (rng.standard_normal((R, n)) * 4).astype(np.float32)
    x[0, rng.integers(0, n, 5)] = x[0].max()  # ties at the top
    if R > 1:
        x[1, : n // 2] = -np.inf  # masked ids
        x[1, rng.integers(n // 2, n, 3)] = np.round(x[1].max(), 1)
    if R > 2:
        x[2] = np.round(x[2])  # many ties everywhere
    return x


@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 49152])
def test_native_topk_is_a_stable_sort_and_a_float64_softmax(isa, n):
    rng = np.random.default_rng(n)
    x = _rows(rng, 3, n)
    for k in sorted({1, 2, 8, min(n, 64)}):
        if k > n:
            continue
        ids, probs = topk_rows(torch.from_numpy(x), k)
        want_ids, want_p = _oracle(x, k)
        assert np.array_equal(ids, want_ids), (isa, n, k)
        np.testing.assert_allclose(probs, want_p, rtol=2e-5, atol=1e-12, err_msg=f"{isa} n={n} k={k}")


def test_k_beyond_the_native_limit_and_other_dtypes_take_torchs_route():
    x = torch.randn(2, 300)
    ids, probs = topk_rows(x, 100)  # k > TOPK_MAX
    assert ids.shape == (2, 100) and np.array_equal(ids, torch.topk(x, 100).indices.numpy())
    ids16, _ = topk_rows(x.to(torch.float64), 5)
    assert np.array_equal(ids16, torch.topk(x, 5).indices.numpy())


def test_the_logit_rows_benchmark_runs_and_reports_both_routes():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "logit_rows.py"
    out = subprocess.run([sys.executable, str(script), "--vocab", "300", "--repeats", "3", "--threads", "1"],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("native") == 4 and out.count("torch") == 4 and "sampled token" in out


def test_argmax_rows_picks_what_torch_argmax_picks_on_ties_nan_and_strided_rows():
    """``argmax_rows`` (numpy on a CPU) against torch's own argmax, the slow oracle it replaced:
    the first of equal maxima, the first NaN, -inf rows, a strided view, one row and many."""
    from lookupdec.tree_rows import argmax_row, argmax_rows

    rng = np.random.default_rng(3)
    x = _rows(rng, 3, 49152)
    nan = (rng.standard_normal((2, 300)) * 4).astype(np.float32)
    nan[0, [17, 40]] = np.nan
    nan[1] = -np.inf
    for rows in (torch.from_numpy(x), torch.from_numpy(nan), torch.from_numpy(x)[:, ::3], torch.from_numpy(x).T[:50]):
        want = torch.argmax(rows, dim=-1).tolist()
        assert argmax_rows(rows).tolist() == want
        assert [argmax_row(r) for r in rows] == want
    assert argmax_rows(torch.from_numpy(x).double()).tolist() == torch.argmax(torch.from_numpy(x), -1).tolist()
    assert [argmax_row(r) for r in torch.from_numpy(nan).double()] == torch.argmax(torch.from_numpy(nan), -1).tolist()


def test_rows_apart_give_what_the_rows_stacked_give():
    # topk_of_rows reads separate CPU float32 rows in one native call (topk_rows_at); rows that are
    # not (a float64 row, a strided view) take the stacked route. Both equal topk_rows of the stack.
    from lookupdec.tree_rows import topk_of_rows

    rng = np.random.default_rng(5)
    x = torch.from_numpy((rng.standard_normal((4, 3000)) * 4).astype(np.float32))  # no ties: torch's route
    rows = [x[i] for i in range(4)]  # orders equal values its own way
    want = topk_rows(x, 8)
    for given in (rows, rows[:1], [r.double() for r in rows], [torch.from_numpy(np.repeat(x[0].numpy(), 2))[::2]]):
        ids, probs = topk_of_rows(given, 8)
        m = len(given)
        assert np.array_equal(ids, want[0][:m]) and np.allclose(probs, want[1][:m], rtol=1e-6)
    ids, probs = topk_of_rows([], 8)
    assert ids.shape == probs.shape == (0, 8)


def _first_max_or_nan(x: np.ndarray) -> int:
    """The slow rule: the first NaN if there is one, else the first index holding the maximum."""
    for j, v in enumerate(x.tolist()):
        if v != v:
            return j
    best = max(x.tolist())
    return x.tolist().index(best)


def test_native_argmax_is_numpy_s_rule_on_every_instruction_set(isa):
    """``argmax_row`` on a contiguous CPU float32 row (one native call at its address) against the
    rule numpy's argmax follows: ties (first wins), all -inf, +inf, NaNs anywhere (first wins), and
    lengths around the vector widths, the tails included."""
    from lookupdec.tree_rows import argmax_row

    rng = np.random.default_rng(12)
    for trial in range(1500):
        n = int(rng.choice([1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 49152]))
        if trial % 2:
            x = rng.choice([-np.inf, 0.0, 1.0, 2.0, np.inf, float(rng.standard_normal())], n).astype(np.float32)
        else:
            x = rng.standard_normal(n).astype(np.float32)
        if trial % 5 == 0:
            x[rng.integers(0, n, int(rng.integers(1, 3)))] = np.nan
        if trial % 7 == 0:
            x[:] = -np.inf
        want = _first_max_or_nan(x)
        assert want == int(x.argmax())  # the rule is numpy's
        assert argmax_row(torch.from_numpy(x)) == want


def test_argmax_of_a_strided_or_float64_row_takes_the_torch_route_with_the_same_answer():
    from lookupdec.tree_rows import argmax_row

    x = torch.tensor([[0.0, 3.0], [5.0, 3.0], [1.0, 5.0]])
    assert argmax_row(x[:, 0]) == 1 and argmax_row(x[:, 1]) == 2  # strided columns
    assert argmax_row(torch.tensor([1.0, 7.0, 7.0], dtype=torch.float64)) == 1
