"""Reuse of KV rows across requests (``lookupdec.prefix_cache``): the store against a slow oracle,
the bits of a prompt's rows however it is split (the quantized formats), and outputs with reuse
equal to outputs without, for every method, greedy and sampled, alone and batched."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lookupdec.prefill as prefill
from lookupdec.decoder import Decoder
from lookupdec.kvcache import FlatKVCache
from lookupdec.prefix_cache import PrefixCache, common_prefix
from tests.conftest import TINY_VOCAB, tiny_loaded
from tests.test_quantized import _blockified

pytestmark = pytest.mark.cpu  # the fast forward's (CPU only)

ROW_BYTES = 2 * 2 * 1 * 3 * 4  # a 2-layer, 1-head, head_dim-3 float32 cache's bytes per row


def _cache(ids, layers=2, heads=1, dim=3):
    """A cache whose row ``i`` holds values made from ``ids[i]`` and ``i``."""
    c = FlatKVCache(layers, heads, dim, len(ids) + 2)
    for i, t in enumerate(ids):
        c.kv[:, :, :, i] = float(t) + i / 1000
    c.length = len(ids)
    return c


def test_common_prefix_against_a_python_loop():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 3, rng.integers(0, 12))
        b = np.concatenate([a[:rng.integers(0, len(a) + 1)], rng.integers(0, 3, rng.integers(0, 5))])
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n


def test_a_prompt_takes_the_rows_of_its_longest_kept_prefix_never_all_of_it():
    rng = np.random.default_rng(1)
    store = PrefixCache(1.0)
    kept = [rng.integers(0, 4, rng.integers(3, 20)).tolist() for _ in range(12)]
    for ids in kept:
        store.keep(ids, _cache(ids))
    stored = [k.ids.tolist() for k in store._kept.values()]
    for _ in range(200):
        prompt = rng.integers(0, 4, rng.integers(1, 25)).tolist()
        best = max([common_prefix(np.array(s), np.array(prompt)) for s in stored] + [0])  # the oracle
        want = min(best, len(prompt) - 1)
        cache = FlatKVCache(2, 1, 3, 1)
        assert store.fill(cache, prompt) == cache.length == want
        if want:
            assert torch.equal(cache.kv[:, :, :, :want], _cache(prompt[:want]).kv[:, :, :, :want])
    assert store.fill(FlatKVCache(2, 1, 3, 4), [9, 9, 9]) == 0  # a token no kept sequence starts with


def test_kept_sequences_drop_what_they_cover_and_the_least_recently_used_go_first():
    store = PrefixCache(10 * ROW_BYTES / 2**20)  # room for 10 rows
    store.keep([1, 2, 3], _cache([1, 2, 3]))
    store.keep([1, 2, 3, 4, 5], _cache([1, 2, 3, 4, 5]))  # covers [1, 2, 3]: that one goes
    assert [k.ids.tolist() for k in store._kept.values()] == [[1, 2, 3, 4, 5]]
    store.keep([1, 2], _cache([1, 2]))  # already covered: nothing copied
    assert store.stats().entries == 1 and store.stats().bytes == 5 * ROW_BYTES
    store.keep([7, 7, 7], _cache([7, 7, 7]))
    store.fill(FlatKVCache(2, 1, 3, 1), [1, 2, 3, 4, 9])  # [1..5] used last: [7, 7, 7] is the oldest now
    store.keep([8, 8, 8, 8], _cache([8, 8, 8, 8]))  # 5 + 3 + 4 rows > 10: the oldest goes
    assert [k.ids.tolist() for k in store._kept.values()] == [[1, 2, 3, 4, 5], [8, 8, 8, 8]]
    store.keep(list(range(11)), _cache(list(range(11))))  # larger than the whole store: not kept
    assert store.stats().entries == 2 and store.stats().bytes == 9 * ROW_BYTES
    # Rows beyond the tokens given (a stop string cut the output) are not kept with them.
    store.clear()
    store.keep([4, 4], _cache([4, 4, 5, 6]))
    assert [k.ids.tolist() for k in store._kept.values()] == [[4, 4]] and store.stats().bytes == 2 * ROW_BYTES


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "64", True])
def test_a_bad_size_is_refused_naming_the_parameter(bad):
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Decoder(tiny_loaded(0), prefix_cache_mb=bad)


def test_the_default_is_on_where_reuse_is_exact_and_off_in_float32():
    assert Decoder(_blockified(0), weights="quantized").prefixes is not None
    assert Decoder(tiny_loaded(0), weights="float32").prefixes is None
    assert Decoder(tiny_loaded(0), weights="float32", prefix_cache_mb=8).prefixes is not None
    assert Decoder(_blockified(0), weights="quantized", prefix_cache_mb=0).prefixes is None
    with pytest.raises(ValueError, match="fast forward"):
        Decoder(tiny_loaded(0), hf_kernels=True, prefix_cache_mb=8)


@pytest.mark.parametrize("weights", ["quantized", "quantized-bf16", "quantized-int8"])
def test_a_prompts_rows_are_the_same_bits_however_it_is_split(weights, monkeypatch):
    """Prefilled whole, in two parts, after a part fed one token at a time, and across chunk
    boundaries: the same cache rows and the same last logits, bit for bit."""
    import lookupdec.products as products

    monkeypatch.setattr(products, "qmatmul_bf16_native", lambda: True)
    monkeypatch.setattr(products, "qmatmul_i8_native", lambda: True)
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 7)  # chunk edges inside a short prompt
    dec = Decoder(_blockified(2), weights=weights, prefix_cache_mb=0)
    verifier = dec.verifier
    prompt = np.random.default_rng(2).integers(3, TINY_VOCAB, 40).tolist()
    whole = verifier.new_cache(48)
    want = verifier.prefill(whole, prompt)
    for split in (1, 6, 7, 23, 39):
        cache = verifier.new_cache(4)
        if split == 23:  # the first part one token at a time, as decoding writes rows
            for i in range(split):
                verifier.fast.forward(cache, torch.tensor([prompt[i]]), torch.tensor([i]), None, None)
        else:
            verifier.prefill(cache, prompt[:split])
        got = verifier.prefill(cache, prompt)  # the rest on top of the first part's rows
        assert torch.equal(got, want), split
        assert torch.equal(cache.kv[:, :, :, :40], whole.kv[:, :, :, :40]), split


def _turns(dec, seed):
    rng = np.random.default_rng(seed)
    first = rng.integers(3, TINY_VOCAB, 30).tolist()
    out = dec.generate(first, method="ar", max_new_tokens=40).token_ids
    return first, first + list(out) + rng.integers(3, TINY_VOCAB, 12).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_every_method_with_reuse_equals_itself_without_on_unscaled_weights(seed):
    """Near-tie weights; the second turn starts with the first turn's prompt and output."""
    dec = Decoder(_blockified(seed), weights="quantized", draft_budget=24)
    plain = Decoder(_blockified(seed), weights="quantized", draft_budget=24, prefix_cache_mb=0)
    first, second = _turns(dec, seed)
    for method in ("ar", "pld", "recycle", "lookahead", "auto"):
        for kw in ({}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}):
            got = dec.generate(second, method=method, max_new_tokens=48, **kw)
            want = plain.generate(second, method=method, max_new_tokens=48, **kw)
            assert got.token_ids == want.token_ids, (method, kw)
            assert got.cached_tokens >= len(first) and want.cached_tokens == 0
    # Batched: two sequences reusing rows, stepped together.
    other = first[:20] + [5, 6, 7]
    got = dec.generate_batch([second, other], method="auto", max_new_tokens=32, batch_size=2)
    want = plain.generate_batch([second, other], method="auto", max_new_tokens=32, batch_size=2)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert got[0].cached_tokens > len(first) and got[1].cached_tokens == 20
    # The same long prompt twice in one batch: the second reuses the first's prompt rows while
    # the first is still decoding (kept at its prefill, not only when it finishes).
    dec.prefixes.clear()
    got = dec.generate_batch([second, second], method="pld", max_new_tokens=24, batch_size=2)
    want = plain.generate(second, method="pld", max_new_tokens=24)
    assert [r.token_ids for r in got] == [want.token_ids] * 2
    assert got[0].cached_tokens == 0 and got[1].cached_tokens == len(second) - 1


def test_float32_reuse_when_asked_for_keeps_the_logits_within_rounding():
    """The float formats' rows depend slightly on their forward's width: reuse there is asked for,
    and the prompt's last logits stay within float rounding of a full prefill's."""
    dec = Decoder(tiny_loaded(0), weights="float32", prefix_cache_mb=8)
    first, second = _turns(dec, 0)
    assert dec.prefixes.stats().entries == 1
    verifier = dec.verifier
    reused = verifier.new_cache(4)
    assert dec.prefixes.fill(reused, second) >= len(first)
    full = verifier.new_cache(4)
    torch.testing.assert_close(verifier.prefill(reused, second), verifier.prefill(full, second), rtol=0, atol=1e-4)


def test_an_entry_that_extends_a_kept_one_copies_only_the_new_rows_and_gives_back_every_row():
    """Kept at the prompt, at the finished sequence, then at a next turn: one entry whose parts are
    each keep's new rows; filled back, its rows are the cache's, bit for bit, across the parts."""
    dec = Decoder(_blockified(1), weights="quantized", prefix_cache_mb=0)
    store = PrefixCache(64)
    verifier = dec.verifier
    ids = np.random.default_rng(5).integers(3, TINY_VOCAB, 50).tolist()
    cache = verifier.new_cache(64)
    for n in (20, 35, 50):  # the prompt, the prompt and its output, the next turn
        verifier.prefill(cache, ids[:n])
        store.keep(ids[:n], cache)
    (kept,) = store._kept.values()
    assert [p.shape[3] for p in kept.parts] == [20, 15, 15]
    assert store.stats().bytes == kept.nbytes == cache.kv[:, :, :, :50].nbytes
    for n in (10, 20, 21, 42, 51):  # inside the first part, on a part's edge, across parts, all of it
        got = verifier.new_cache(4)
        reused = store.fill(got, ids[:n] + [7])
        assert reused == min(n, 50)
        assert torch.equal(got.kv[:, :, :, :reused], cache.kv[:, :, :, :reused]), n
    # A sequence that branches off inside the entry is kept whole, beside it.
    other = ids[:10] + [9] * 5
    other_cache = verifier.new_cache(16)
    verifier.prefill(other_cache, other)
    store.keep(other, other_cache)
    assert store.stats().entries == 2 and [p.shape[3] for p in store._kept[max(store._kept)].parts] == [15]


def test_reset_state_forgets_the_kept_prompts_as_a_new_process_would():
    dec = Decoder(_blockified(0), weights="quantized")
    first, second = _turns(dec, 0)
    assert dec.generate(second, method="ar", max_new_tokens=4).cached_tokens >= len(first)
    dec.reset_state()
    assert dec.prefixes.stats().entries == 0
    assert dec.generate(second, method="ar", max_new_tokens=4).cached_tokens == 0


@pytest.mark.slow
def test_the_embedded_models_next_turn_with_reuse_equals_it_without(real_loaded):
    """Quantized: the second turn of a chat (the first turn's prompt and output, then a new question)."""
    dec = Decoder(real_loaded, weights="quantized")
    plain = Decoder(real_loaded, weights="quantized", prefix_cache_mb=0)
    first = [{"role": "user", "content": "List three primary colours, one per line."}]
    answer = dec.generate(first, method="ar", max_new_tokens=32)
    second = first + [{"role": "assistant", "content": answer.text}, {"role": "user", "content": "Now three more."}]
    for method in ("ar", "pld", "auto"):
        got = dec.generate(second, method=method, max_new_tokens=32)
        assert got.token_ids == plain.generate(second, method=method, max_new_tokens=32).token_ids, method
        assert got.cached_tokens >= len(dec.encode(first))
