"""The native attention over a float16 KV cache (``FastForward(kv_dtype="float16")``), on every instruction
set this CPU has: it writes each new key and value rounded as torch rounds to float16, and gives the bits a
float32 cache holding the same (rounded) values gives, through every route (4 x 4 tiles, keys in the vector
lanes, padding queries, masked keys, several sequences of both formats in one call)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.kvcache import kv_format
from tests.test_attention import LOWEST, Seq, _block, ancestors, attend, oracle


def _half_seq(rng, past, Hk, D, cap):
    s = Seq(rng, past, Hk, D, cap=cap)
    s.kv = s.kv.half()
    return s


def _float_copy(s):
    """A float32 cache holding the float16 cache's values (exactly), at the same length."""
    t = Seq(np.random.default_rng(0), s.past, s.kv.shape[2], s.kv.shape[4], layers=s.kv.shape[0], cap=s.kv.shape[3])
    t.kv = s.kv.float()
    return t


def _rounded(block):
    """The block as a float32 cache sees it after a float16 cache rounded its keys and values."""
    q, k, v = block
    return q, k.half().float(), v.half().float()


def test_new_rows_are_rounded_to_float16_as_torch_rounds_them(isa):
    """Ties (to even), the subnormal range and its ties, the largest finite values and what rounds down to them,
    zeros of both signs, and random values of every magnitude (what would round to infinity is refused: below)."""
    H, Hk, D = 2, 1, 16
    special = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25, 3 * 2 ** -25, 2 ** -24 * 1.5, 2 ** -14,
                            2 ** -14 * (1 - 2 ** -11), 65504.0, 65519.0, 65505.0, 65488.0, -0.0, 0.0, -(2 ** -26),
                            -65519.0, 6.1e-5], dtype=torch.float32)
    rng = np.random.default_rng(3)
    mags = 2.0 ** rng.integers(-30, 14, size=(7, D))
    rows = torch.cat([special[None], torch.from_numpy((rng.standard_normal((7, D)) * mags).astype(np.float32))])
    w = rows.shape[0]
    s = _half_seq(rng, 0, Hk, D, cap=w)
    q = torch.zeros(w, H, D)
    bias = torch.zeros(w, w)
    bias[:, :] = torch.triu(torch.full((w, w), float("-inf")), 1)
    attend([s], [(q, rows[:, None], -rows[:, None])], [bias], H, Hk, D)
    want = rows.half()
    assert torch.equal(s.kv[1, 0, 0, :w].view(torch.int16), want.view(torch.int16))
    assert torch.equal(s.kv[1, 1, 0, :w].view(torch.int16), (-rows).half().view(torch.int16))


@pytest.mark.parametrize("H,Hk,D", [(9, 3, 64), (4, 4, 24), (2, 1, 20), (8, 2, 128)])
@pytest.mark.parametrize("past,w", [(0, 1), (37, 1), (300, 1), (21, 8), (130, 17), (30, 40)])
def test_a_float16_cache_gives_the_bits_of_a_float32_cache_of_its_values(isa, H, Hk, D, past, w):
    """One-row decodes (padding queries), verify trees of several rows and a causal chunk of many tiles (with
    AVX-512, keys scored in the vector lanes), over short and long caches, masked keys of both kinds; a second
    sequence in float32 beside it in the same call."""
    rng = np.random.default_rng(past + w + D)
    block = _block(rng, w, H, Hk, D)
    other = _block(rng, 3, H, Hk, D)
    bias = torch.zeros(w, past + w)
    bias[:, past:] = torch.triu(torch.full((w, w), float("-inf")), 1)
    bias[1::3, : past // 2] = LOWEST
    half = _half_seq(rng, past, Hk, D, cap=past + w)
    ref = _float_copy(half)
    beside = Seq(rng, 11, Hk, D)
    beside_ref = Seq(rng, 11, Hk, D)
    beside_ref.kv = beside.kv.clone()
    got = attend([half, beside], [block, other], [bias, None], H, Hk, D)
    want = attend([ref, beside_ref], [_rounded(block), other], [bias, None], H, Hk, D)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])
    assert torch.equal(half.kv.float(), ref.kv)
    # and it is attention: the float64 oracle over the rounded values
    expect = oracle(ref.rows(0, 0, past + w), ref.rows(1, 0, past + w), block[0], bias, 0.125)
    torch.testing.assert_close(got[0].double(), expect, rtol=1e-4, atol=1e-5)


def test_a_float16_tree_row_is_the_same_bits_as_its_chain_decoded_one_row_at_a_time(isa):
    """The contract exactness rests on, in the float16 format: a row among masked siblings equals the row
    decoded alone over its ancestors (each of them written, rounded, by its own call)."""
    H, Hk, D, past = 9, 3, 64, 150
    rng = np.random.default_rng(11)
    parents = [-1, 0, 0, 1, 2, 3]
    w = len(parents)
    q, k, v = _block(rng, w, H, Hk, D)
    allowed = ancestors(parents)
    bias = torch.zeros(w, past + w)
    bias[:, past:][torch.from_numpy(~allowed)] = float("-inf")
    base = _half_seq(rng, past, Hk, D, cap=past + w)
    tree = _half_seq(rng, past, Hk, D, cap=past + w)
    tree.kv[:, :, :, :past] = base.kv[:, :, :, :past]
    together = attend([tree], [(q, k, v)], [bias], H, Hk, D)[0]
    for i in range(w):
        ar = _half_seq(rng, past, Hk, D, cap=past + w)
        ar.kv[:, :, :, :past] = base.kv[:, :, :, :past]
        for j in np.flatnonzero(allowed[i]).tolist():
            row = attend([ar], [(q[j:j + 1], k[j:j + 1], v[j:j + 1])], [None], H, Hk, D)[0]
        assert torch.equal(row[0], together[i]), i


def test_an_unknown_cache_format_is_refused_before_anything_is_written():
    H, Hk, D = 2, 1, 16
    rng = np.random.default_rng(0)
    s = Seq(rng, 4, Hk, D)
    before = s.kv.clone()
    q, k, v = _block(rng, 1, H, Hk, D)
    qk = torch.cat([q, k], 1).contiguous()
    meta = torch.tensor([[0, 1, 4, 0]], dtype=torch.int64)
    kv = torch.tensor([[s.kv.data_ptr(), s.kv.shape[3], 7]], dtype=torch.int64)
    out = torch.zeros(1, H * D)
    with pytest.raises(ValueError, match="KV cache format"):
        _native.attend_ptr(1, meta.data_ptr(), kv.data_ptr(), 1, qk.data_ptr(), v.contiguous().data_ptr(), D, H, Hk,
                           D, 0.25, out.data_ptr(), 1)
    assert torch.equal(s.kv, before)


def test_kv_format_names_the_two_element_types_and_nothing_else():
    assert kv_format(torch.zeros(2, 2)) == _native.KV_FLOAT32
    assert kv_format(torch.zeros(2, 2, dtype=torch.float16)) == _native.KV_FLOAT16
    assert kv_format(torch.zeros(2, 2, dtype=torch.bfloat16)) is None
    assert kv_format(torch.zeros(4, 4)[:, ::2]) is None


def test_a_key_or_value_float16_cannot_hold_is_refused_naming_the_fix(isa):
    """65,519 rounds to 65,504 and is kept; 65,520 (and beyond, and infinity) would become infinite in the cache:
    the call refuses it, writing no output. A float32 cache takes the same values."""
    H, Hk, D = 2, 1, 16
    rng = np.random.default_rng(4)
    for value, kind in [(65520.0, 1), (-1e6, 2), (float("inf"), 1)]:
        s = _half_seq(rng, 3, Hk, D, cap=8)
        q, k, v = _block(rng, 1, H, Hk, D)
        (k if kind == 1 else v)[0, 0, 5] = value
        with pytest.raises(ValueError, match="float16's range"):
            attend([s], [(q, k, v)], [None], H, Hk, D)
        full = Seq(rng, 3, Hk, D, cap=8)
        attend([full], [(q, k, v)], [None], H, Hk, D)  # float32 holds it
    s = _half_seq(rng, 3, Hk, D, cap=8)
    q, k, v = _block(rng, 1, H, Hk, D)
    k[0, 0, :] = 65519.0
    attend([s], [(q, k, v)], [None], H, Hk, D)
    assert bool((s.kv[1, 0, 0, 3] == 65504.0).all())
