"""The native decode attention (ext/csrc/attention.c) against a float64 oracle on every instruction set
this CPU has, and its contract: a row's output depends only on its query and its unmasked keys in order,
bit for bit, not on the other rows or sequences of the call, the masked keys between, or the threads."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec import _native
from lookupdec.kvcache import kv_format
from tests.conftest import NATIVE_ISAS

LOWEST = torch.finfo(torch.float32).min


class Seq:
    """One sequence: a cache (layers, 2, Hk, cap, D) whose first ``past`` rows are random."""

    def __init__(self, rng, past, Hk, D, layers=2, cap=64):
        self.kv = torch.from_numpy(rng.standard_normal((layers, 2, Hk, cap, D)).astype(np.float32))
        self.past = past

    def rows(self, kind, lo=0, hi=None):
        """Layer 1's keys (kind 0) or values (1), rows lo..hi, as (rows, Hk, D)."""
        return self.kv[1, kind, :, lo:hi].transpose(0, 1)


def attend(seqs, blocks, biases, H, Hk, D, layer=1, threads=2, scale=0.125):
    """Call the kernel: ``blocks[s]`` = (q (w, H, D), k (w, Hk, D), v (w, Hk, D)); returns out rows per sequence."""
    qk = torch.cat([torch.cat([q, k], 1) for q, k, _ in blocks]).contiguous()
    vpad = torch.cat([torch.cat([torch.zeros(v.shape[0], 3), v.reshape(v.shape[0], -1)], 1) for *_, v in blocks])
    widths = [b[0].shape[0] for b in blocks]
    offs = np.cumsum([0] + widths)
    keep = [None if b is None else b.contiguous() for b in biases]
    meta = torch.tensor([[int(offs[i]), widths[i], s.past, 0 if b is None else b.data_ptr()]
                         for i, (s, b) in enumerate(zip(seqs, keep))], dtype=torch.int64)
    kv = torch.tensor([[s.kv.data_ptr(), s.kv.shape[3], kv_format(s.kv)] for s in seqs], dtype=torch.int64)
    out = torch.full((int(offs[-1]), H * D), float("nan"))
    vpad = vpad.contiguous()
    _native.attend_ptr(len(seqs), meta.data_ptr(), kv.data_ptr(), layer, qk.data_ptr(), vpad.data_ptr() + 12,
                       vpad.stride(0), H, Hk, D, scale, out.data_ptr(), threads)
    for s, w in zip(seqs, widths):
        s.past += w
    return [out[offs[i]:offs[i + 1]].view(widths[i], H, D) for i in range(len(seqs))]


def oracle(keys, vals, q, bias, scale):
    """float64 softmax(q k^T scale + bias) v; keys/vals (n, Hk, D), q (w, H, D), bias (w, n) or None."""
    H, Hk = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(H // Hk, 1)
    v = vals.double().repeat_interleave(H // Hk, 1)
    s = torch.einsum("whd,nhd->hwn", q.double(), k) * scale
    if bias is not None:
        s = s + bias.double().clamp(min=-1e300)
    return torch.einsum("hwn,nhd->whd", torch.softmax(s, -1), v)


def ancestors(parents):
    """allowed[i, j]: tree node j is node i or one of its ancestors (``parents[i]``: -1 for the root row)."""
    w = len(parents)
    allowed = np.zeros((w, w), dtype=bool)
    for i in range(w):
        j = i
        while j >= 0:
            allowed[i, j] = True
            j = parents[j]
    return allowed


def _block(rng, w, H, Hk, D):
    f = lambda *shape: torch.from_numpy((rng.standard_normal(shape) * 1.5).astype(np.float32))  # noqa: E731
    return f(w, H, D), f(w, Hk, D), f(w, Hk, D)


@pytest.mark.parametrize("H,Hk,D", [(9, 3, 64), (4, 4, 24), (2, 1, 20)])
def test_attention_equals_the_float64_oracle_and_writes_the_cache(isa, H, Hk, D):
    rng = np.random.default_rng(D)
    seqs = [Seq(rng, 0, Hk, D), Seq(rng, 37, Hk, D), Seq(rng, 5, Hk, D)]
    pasts = [s.past for s in seqs]
    blocks = [_block(rng, w, H, Hk, D) for w in (3, 1, 6)]
    bias = torch.zeros(6, 5 + 6)
    bias[:, 5:] = torch.triu(torch.full((6, 6), float("-inf")), 1)  # causal among the block, -inf masks
    bias[2, 1] = LOWEST                                             # and float32's lowest masks too
    outs = attend(seqs, blocks, [None, None, bias], H, Hk, D)
    for s, p, (q, k, v), b, out in zip(seqs, pasts, blocks, [None, None, bias], outs):
        end = p + q.shape[0]
        assert torch.equal(s.rows(0, p, end), k) and torch.equal(s.rows(1, p, end), v)
        want = oracle(s.rows(0, 0, end), s.rows(1, 0, end), q, b, 0.125)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("H,Hk,D,w", [(9, 3, 64, 1), (9, 3, 64, 5), (4, 2, 24, 1), (2, 1, 20, 3), (2, 1, 128, 2)])
def test_a_sequence_over_a_long_cache_equals_the_float64_oracle(isa, H, Hk, D, w):
    """Over 400 cached rows (the keys and values read ahead cross many blocks), causal in its block."""
    rng = np.random.default_rng(w + D)
    s = Seq(rng, 400, Hk, D, cap=400 + w)
    q, k, v = _block(rng, w, H, Hk, D)
    bias = torch.zeros(w, 400 + w)
    bias[:, 400:] = torch.triu(torch.full((w, w), float("-inf")), 1)
    out = attend([s], [(q, k, v)], [bias], H, Hk, D)[0]
    assert torch.equal(s.rows(0, 400), k) and torch.equal(s.rows(1, 400), v)
    torch.testing.assert_close(out.double(), oracle(s.rows(0), s.rows(1), q, bias, 0.125), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("past", [21, 300])
def test_a_row_is_the_same_bits_alone_in_order_as_among_masked_keys_other_rows_and_sequences(isa, past):
    """A tree row (its siblings' keys masked between its ancestors') equals the same row decoded one token
    at a time with no bias (ar); and a call with another sequence beside it, or on one thread, changes
    nothing. This is what makes a verify forward's rows those of ar's forwards. Short and long caches
    (keys and values read ahead, ``PF`` rows, across key blocks)."""
    H, Hk, D = 9, 3, 64
    rng = np.random.default_rng(1)
    parents = [-1, 0, 0, 1, 2, 3, 3, 1]  # node i's parent (-1 = the root row 0)
    w = len(parents)
    cap = past + w + 8
    q, k, v = _block(rng, w, H, Hk, D)
    base = Seq(rng, past, Hk, D, cap=cap)
    allowed = ancestors(parents)
    for masked in (float("-inf"), LOWEST):
        bias = torch.zeros(w, past + w)
        bias[:, past:][torch.from_numpy(~allowed)] = masked
        tree = Seq(rng, past, Hk, D, cap=cap)
        tree.kv[:, :, :, :past] = base.kv[:, :, :, :past]
        other = Seq(rng, 50, Hk, D)
        together = attend([other, tree], [_block(rng, 3, H, Hk, D), (q, k, v)], [None, bias], H, Hk, D)[1]
        alone = Seq(rng, past, Hk, D, cap=cap)
        alone.kv[:, :, :, :past] = base.kv[:, :, :, :past]
        one_thread = attend([alone], [(q, k, v)], [bias], H, Hk, D, threads=1)[0]
        assert torch.equal(together, one_thread)
        alone.past = past
        assert torch.equal(attend([alone], [(q, k, v)], [bias], H, Hk, D, threads=2)[0], one_thread)
        for i in range(w):
            chain = np.flatnonzero(allowed[i]).tolist()  # ancestors in order, then i
            ar = Seq(rng, past, Hk, D, cap=cap)
            ar.kv[:, :, :, :past] = base.kv[:, :, :, :past]
            for j in chain:
                row = attend([ar], [(q[j:j + 1], k[j:j + 1], v[j:j + 1])], [None], H, Hk, D)[0]
            assert torch.equal(row[0], together[i]), (masked, i)


def test_the_instruction_sets_agree_to_float_rounding():
    H, Hk, D = 6, 2, 64
    outs = []
    for isa in NATIVE_ISAS:
        assert _native.qmatmul_force_isa(isa)
        rng = np.random.default_rng(7)
        seqs = [Seq(rng, 40, Hk, D)]
        outs.append(attend(seqs, [_block(rng, 4, H, Hk, D)], [None], H, Hk, D)[0])
    _native.qmatmul_force_isa(NATIVE_ISAS[0])
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_refused_before_any_memory_is_touched():
    for heads, kv_heads, dim in ((0, 1, 8), (3, 2, 8), (2, 1, 0)):
        with pytest.raises(ValueError):
            _native.attend_ptr(1, 0, 0, 0, 0, 0, 0, heads, kv_heads, dim, 1.0, 0, 1)


@pytest.mark.skipif("avx512" not in NATIVE_ISAS, reason="the keys-in-lanes scoring is AVX-512's (this CPU has none)")
@pytest.mark.parametrize("H,Hk,D", [(9, 3, 64), (4, 1, 128), (6, 2, 48), (8, 4, 80)])
def test_keys_in_lanes_scoring_is_the_same_bits_as_the_tiles(H, Hk, D):
    """A task of many queries scores its keys with the keys in the vector lanes (a block's keys transposed
    once for all its queries); a task of few with 4 x 4 tiles. Both must give every score the same bits,
    whatever the queries' count (padding in the last group), the keys' count (partial vectors and blocks:
    1..200 keys), masked keys and several tasks and sequences."""
    assert _native.qmatmul_force_isa("avx512")
    rng = np.random.default_rng(D)
    before = _native.attend_block_tiles()
    try:
        for past, w in [(0, 11), (3, 21), (40, 9), (130, 17), (190, 6)]:
            blocks = [_block(rng, w, H, Hk, D), _block(rng, 2, H, Hk, D)]
            bias = torch.zeros(w, past + w)
            bias[:, past:] = torch.triu(torch.full((w, w), float("-inf")), 1)
            bias[1::3, : past // 2] = LOWEST
            results = []
            for tiles in (0, 1):  # never, always (where a task has a tile)
                _native.attend_block_tiles(tiles)
                base = np.random.default_rng(past)
                seqs = [Seq(base, past, Hk, D, cap=past + w), Seq(base, 33, Hk, D, cap=40)]
                results.append(attend(seqs, blocks, [bias, None], H, Hk, D))
            for never, always in zip(*results):
                assert torch.equal(never, always), (past, w)
            want = oracle(seqs[0].rows(0, 0, past + w), seqs[0].rows(1, 0, past + w), blocks[0][0], bias, 0.125)
            torch.testing.assert_close(results[1][0].double(), want, rtol=1e-5, atol=2e-6)
    finally:
        _native.attend_block_tiles(before)
        _native.qmatmul_force_isa(NATIVE_ISAS[0])


@pytest.mark.parametrize("masked", [float("-inf"), LOWEST])
def test_a_causal_chunk_of_many_tasks_is_the_same_bits_as_its_rows_one_at_a_time(isa, masked):
    """A prompt's chunk: 40 rows under a causal bias over 30 cached rows, 30 tiles of queries in four
    tasks a kv head (with AVX-512 scored in the vector lanes); each row must be the same bits as the
    row decoded alone, one token at a time with no bias, as ``ar`` decodes it."""
    H, Hk, D, past, w = 9, 3, 64, 30, 40
    rng = np.random.default_rng(5)
    q, k, v = _block(rng, w, H, Hk, D)
    base = Seq(rng, past, Hk, D, cap=past + w)
    bias = torch.zeros(w, past + w)
    bias[:, past:] = torch.triu(torch.full((w, w), masked), 1)
    chunk = Seq(rng, past, Hk, D, cap=past + w)
    chunk.kv[:, :, :, :past] = base.kv[:, :, :, :past]
    together = attend([chunk], [(q, k, v)], [bias], H, Hk, D)[0]
    alone = Seq(rng, past, Hk, D, cap=past + w)
    alone.kv[:, :, :, :past] = base.kv[:, :, :, :past]
    for i in range(w):
        row = attend([alone], [(q[i:i + 1], k[i:i + 1], v[i:i + 1])], [None], H, Hk, D)[0]
        assert torch.equal(row[0], together[i]), i
