"""Speculative sampling reproduces the target's distribution exactly.

Statistical checks use a chi-square statistic against the exact
distribution: for df degrees of freedom its mean is df and its standard
deviation sqrt(2 df); the bound df + 6 sqrt(2 df) fails a correct sampler with
probability far below 1e-4, while the broken samplers below exceed it by far.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupdec.decoder import Decoder
from lookupdec.sampling import TINY_TEMPERATURE, SamplingParams, draw, sample, target_probs
from lookupdec.tree import DraftTree
from lookupdec.verify import Acceptance, sample_accept
from tests.conftest import TINY_VOCAB, batch_of, tiny_loaded


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    n = counts.sum()
    expected = probs * n
    live = expected > 0
    assert counts[~live].sum() == 0, "a token with probability 0 was drawn"
    stat = float((((counts - expected) ** 2)[live] / expected[live]).sum())
    return stat, int(live.sum()) - 1


def assert_matches(counts, probs):
    stat, df = chi_square(np.asarray(counts, float), np.asarray(probs, float))
    assert stat < df + 6 * np.sqrt(2 * max(df, 1)), (stat, df)


def hf_reference_probs(logits, p: SamplingParams):
    """transformers' own warpers, in generate()'s order, as the reference."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits.unsqueeze(0).clone()
    scores = TemperatureLogitsWarper(p.temperature)(None, scores)
    if p.top_k:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(None, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=5), SamplingParams(1.3, top_p=0.8),
                                    SamplingParams(0.9, top_p=0.6, top_k=7)])
def test_target_probs_equals_transformers_warpers(params):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(50, generator=g) * 3
        torch.testing.assert_close(target_probs(logits, params), hf_reference_probs(logits, params), atol=1e-6, rtol=1e-5)


def test_sampling_params_are_validated():
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(top_k=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_a_top_p_that_rounds_to_zero_still_keeps_the_most_likely_token():
    """A top_p below float32's smallest number compared as 0 and dropped every token (NaN probabilities)."""
    logits = torch.tensor([0.5, 2.0, -1.0, 1.9])
    for top_p in (1e-300, 1e-50, 1e-3):
        p = target_probs(logits, SamplingParams(0.7, top_p=top_p))
        assert p.tolist() == [0.0, 1.0, 0.0, 0.0], top_p
        assert draw(logits, SamplingParams(0.7, top_p=top_p), 0.999) == 1


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, TINY_TEMPERATURE / 10])
def test_a_temperature_too_small_for_float32_samples_the_limit_distribution(temperature):
    """Logits over a temperature below float32's range overflowed (infinite or NaN scores, a native
    error): the distribution is that of the largest logits, ties shared, every other token at 0."""
    logits = torch.tensor([3.0, 1.0, 3.0, -2.0])
    for params in (SamplingParams(temperature), SamplingParams(temperature, top_k=3),
                   SamplingParams(temperature, top_p=0.9)):
        p = target_probs(logits, params)
        assert torch.isfinite(p).all(), params
        assert p.tolist() == [0.5, 0.0, 0.5, 0.0], params
        assert {draw(logits, params, u) for u in (0.0, 0.3, 0.6, 0.999)} == {0, 2}, params


def test_below_the_switch_the_distribution_is_the_one_of_the_same_logits_at_temperature_one():
    """softmax(c * x / (c * t)) is softmax(x / t): logits scaled by 1e-21 at temperature 1e-21 (the
    float64 route, below ``TINY_TEMPERATURE``) against the same logits at 1.0 (the float32 route)."""
    g = torch.Generator().manual_seed(0)
    scale = TINY_TEMPERATURE / 10
    for _ in range(10):
        logits = torch.randn(50, generator=g) * 3
        for top_p, top_k in ((1.0, 0), (0.8, 0), (1.0, 7), (0.6, 9)):
            small = target_probs(logits * scale, SamplingParams(scale, top_p, top_k))
            torch.testing.assert_close(small.float(), target_probs(logits, SamplingParams(1.0, top_p, top_k)),
                                       atol=1e-6, rtol=1e-5)


V = 6
# Draft tree under the root: children 2, 0, 5 (tried in that order); node 0 (token 2) has children 1, 3.
TREE = DraftTree.from_sequences([[2, 1], [2, 3], [0], [5]])


def _setup(params):
    g = torch.Generator().manual_seed(1)
    root_logits = torch.randn(V, generator=g) * 1.5
    next_logits = torch.randn(V, V, generator=g) * 1.5  # row x: logits after token x
    p1 = target_probs(root_logits, params)
    p2 = target_probs(next_logits, params)  # (V, V): p2[x] = distribution of the 2nd token after x
    return p1, p2


def _rows(p1, p2):
    def row(r):
        return p1 if r == 0 else p2[int(TREE.tokens[r - 1])]
    return row


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=3), SamplingParams(1.0, top_p=0.7)])
def test_first_two_tokens_follow_the_target(params):
    """20k draws: the joint law of the first two tokens is p1(x) * p2[x](y)."""
    p1, p2 = _setup(params)
    row = _rows(p1, p2)
    gen = torch.Generator().manual_seed(123)
    counts = np.zeros((V, V))
    for _ in range(20_000):
        acc = sample_accept(TREE, row, gen)
        x = acc.tokens[0]
        # A one-token step is followed by a plain sampling step from p2[x].
        y = acc.tokens[1] if len(acc.tokens) > 1 else sample(p2[x], gen)
        counts[x, y] += 1
    exact = (p1[:, None] * p2).numpy()
    assert_matches(counts.ravel(), exact.ravel())


def test_the_check_catches_sampling_from_a_slightly_wrong_distribution():
    """The same library acceptance, fed rows at temperature 0.8 instead of 1.0: the chi-square check
    used above must reject it (it has the power to see a real error)."""
    p1, p2 = _setup(SamplingParams(1.0))
    q1, q2 = _setup(SamplingParams(0.8))
    gen = torch.Generator().manual_seed(5)
    counts = np.zeros(V)
    for _ in range(20_000):
        counts[sample_accept(TREE, _rows(q1, q2), gen).tokens[0]] += 1
    stat, df = chi_square(counts, p1.numpy())
    assert stat > df + 6 * np.sqrt(2 * df)


def test_rejected_children_are_removed_from_the_residual():
    """With p concentrated on two drafted tokens, a rejection of the first must yield the second."""
    p = torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0, 0.5])
    tree = DraftTree.from_sequences([[2], [5]])
    gen = torch.Generator().manual_seed(0)
    seen = {sample_accept(tree, lambda r: p, gen).tokens[0] for _ in range(200)}
    assert seen == {2, 5}
    acc = sample_accept(tree, lambda r: p, gen)
    assert isinstance(acc, Acceptance) and acc.accepted == 1 and len(acc.tokens) == 2


class TopTokensDrafter:
    """Drafts the model's own likely tokens (fixed, computed in advance) under the root."""

    name = "top"

    def __init__(self, seqs):
        self.tree = DraftTree.from_sequences(seqs)

    def begin(self, prompt_ids):
        pass

    def commit(self, outcome):
        pass

    def propose(self, request):
        return self.tree


def _exact_marginals(lm, prompt, params, depth):
    """Exact laws of the first ``depth`` generated tokens' marginals, by enumerating the support."""
    with torch.no_grad():
        def probs(ctx):
            return target_probs(lm.model(batch_of(lm.model, ctx)).logits[0, -1].cpu(), params)

        layer = {(): 1.0}
        marginals = []
        for _ in range(depth):
            nxt: dict[tuple, float] = {}
            m = torch.zeros(TINY_VOCAB, dtype=torch.float64)
            for path, w in layer.items():
                p = probs(prompt + list(path)).double()
                m += w * p
                for x in torch.nonzero(p).flatten().tolist():
                    nxt[path + (x,)] = w * float(p[x])
            marginals.append(m.numpy())
            layer = nxt
    return marginals


@pytest.mark.parametrize("backend", ["hf", pytest.param("fast", marks=pytest.mark.cpu), "chain"])
def test_end_to_end_token_distributions_match_plain_sampling(backend):
    """The first three generated tokens' marginals with speculation equal the exact marginals computed
    from the model (2,000 seeded draws), through transformers' forward, the fast forward, and the chain
    fallback; the drafted tree is three deep, so a step can accept two nodes before its bonus token."""
    lm = tiny_loaded(7)
    dec = Decoder(lm, hf_kernels=backend != "fast", tree_masks=False if backend == "chain" else None)
    assert dec.verifier.backend == ("fast" if backend == "fast" else "hf")
    params = SamplingParams(1.0, top_k=4, top_p=0.95)
    prompt = [10, 11, 12]
    exact = _exact_marginals(lm, prompt, params, 3)
    top = np.argsort(-exact[1])[:3].tolist()
    # After the prefill token the drafter proposes likely continuations, three deep, several branches.
    drafter = TopTokensDrafter([[y, z, w] for y in top for z in top[:2] for w in top[:2]])
    counts = [np.zeros(TINY_VOCAB) for _ in range(3)]
    accepted = deep = 0
    for seed in range(2_000):
        out = dec.generate(prompt, max_new_tokens=4, temperature=1.0, top_k=4, top_p=0.95, seed=seed,
                           drafter=drafter)
        for k in range(3):
            counts[k][out.token_ids[k]] += 1
        accepted += out.step_stats[1].accepted  # step 1 drafts the 2nd token on
        deep += out.step_stats[1].accepted >= 2
    assert accepted > 200 and deep > 20  # speculation, two levels deep included, was really exercised
    for k in range(3):
        assert_matches(counts[k], exact[k])


def test_seeds_a_generator_cannot_take_are_refused_by_name_and_numpy_integers_are_taken():
    lm = tiny_loaded(8)
    dec = Decoder(lm, hf_kernels=True)
    for bad in (2 ** 64, -(2 ** 63) - 1, 10 ** 30, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed must be an integer"):
            dec.generate([5, 6, 7], method="ar", max_new_tokens=4, temperature=0.8, seed=bad)
        with pytest.raises(ValueError, match="seed must be an integer"):  # checked greedy too: the request is wrong
            dec.generate([5, 6, 7], method="ar", max_new_tokens=4, seed=bad)
    edge = [dec.generate([5, 6, 7], method="ar", max_new_tokens=6, temperature=0.8, seed=s).token_ids
            for s in (2 ** 64 - 1, -(2 ** 63))]
    assert all(len(t) == 6 for t in edge)
    assert dec.generate([5, 6, 7], method="ar", max_new_tokens=12, temperature=0.8, seed=np.int64(3)).token_ids == \
        dec.generate([5, 6, 7], method="ar", max_new_tokens=12, temperature=0.8, seed=3).token_ids


def test_same_seed_same_output_and_ar_equals_itself():
    lm = tiny_loaded(8)
    dec = Decoder(lm, hf_kernels=True)
    a = dec.generate([5, 6, 7], method="ar", max_new_tokens=20, temperature=0.8, seed=3)
    b = dec.generate([5, 6, 7], method="ar", max_new_tokens=20, temperature=0.8, seed=3)
    c = dec.generate([5, 6, 7], method="ar", max_new_tokens=20, temperature=0.8, seed=4)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_sample_draws_each_token_with_its_probability_and_never_one_without_mass():
    """The inverse-CDF sampler against its law: unnormalised weights with zeros between, a peaked
    vocabulary-sized vector, and the same seed giving the same draws."""
    weights = torch.tensor([0.3, 0.0, 0.75, 1.95, 0.0, 0.0, 0.5])
    g = torch.Generator().manual_seed(1)
    counts = np.bincount([sample(weights, g) for _ in range(20000)], minlength=len(weights))
    assert counts[1] == counts[4] == counts[5] == 0
    assert_matches(counts, (weights / weights.sum()).numpy())
    big = torch.softmax(torch.randn(49152, generator=torch.Generator().manual_seed(2)) * 4, 0)
    big[::2] = 0.0  # half the vocabulary without mass
    g = torch.Generator().manual_seed(3)
    draws = [sample(big, g) for _ in range(3000)]
    assert all(d % 2 == 1 for d in draws)
    top = torch.topk(big, 5).indices.tolist()
    counts = np.array([sum(d == t for d in draws) for t in top] + [sum(d not in top for d in draws)])
    probs = (big[top] / big.sum()).numpy()
    assert_matches(counts, np.append(probs, 1.0 - probs.sum()))
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert [sample(big, a) for _ in range(50)] == [sample(big, b) for _ in range(50)]


def test_position_uniforms_are_uniform_and_pairwise_independent_across_keys_and_positions():
    """The counter-based numbers every sampled position is drawn at (``position_uniform``): 200 keys x
    200 positions in 20 bins, and the pairs (position t, t + 1) in 10 x 10 bins, against the uniform
    law; the check has the power to reject numbers squeezed by 2% (the last assertion)."""
    from lookupdec.sampling import position_uniform

    u = np.array([[position_uniform(k, t) for t in range(200)] for k in range(200)])
    assert u.min() >= 0.0 and u.max() < 1.0
    assert_matches(np.bincount((u * 20).astype(int).ravel(), minlength=20), np.full(20, 0.05))
    pairs = (u[:, :-1] * 10).astype(int) * 10 + (u[:, 1:] * 10).astype(int)
    assert_matches(np.bincount(pairs.ravel(), minlength=100), np.full(100, 0.01))
    squeezed = np.bincount((u * 0.98 * 20).astype(int).ravel(), minlength=20)
    stat, df = chi_square(squeezed, np.full(20, 0.05))
    assert stat > df + 6 * np.sqrt(2 * df)
