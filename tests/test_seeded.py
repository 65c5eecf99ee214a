"""What the same seed reproduces (README "What is guaranteed", ``Decoder.generate``'s ``seed``).

Measured on tiny random models, and stated exactly:

- greedy: every method's output is ``ar``'s on every call, whatever the decoder
  learnt from earlier requests (calibration, recycle tables, history, cost model);
- sampled ``ar`` and ``pld`` (no state across requests, no pricing): the same seed
  gives the same output, on a fresh decoder or on the same one called again;
- sampled methods that price their drafts (``auto``, ``recycle``, ``lookahead``,
  ``history``, ``llma``, ``rest``, ``draft``): under speculative sampling the
  random draws consumed depend on the drafts, and the drafts depend on the
  decoder's state and on its cost model, which measured step times correct (and
  ``auto``'s drafting pauses on measured tokens/s, ``Decoder.generate``'s gate). The
  seed alone does not reproduce them; held fixed, the pricing leaves the seed and
  the decoder's earlier requests as the only inputs (tested below by freezing the
  cost model's online correction).
"""
from __future__ import annotations

import pytest

from lookupdec import Decoder
from lookupdec.costs import CostCurve
from lookupdec.pricing import CostModel
from tests.conftest import tiny_loaded

# Repetitive enough that every source drafts something (recycle and lookahead learn
# from the target's rows whatever the text).
PROMPTS = ["abcabcabc hello hello", "the cat the cat the"]
N = 32


def _results(dec: Decoder, method: str, temperature: float, seed: int | None = 7, **kw):
    return [dec.generate(p, method=method, max_new_tokens=N, temperature=temperature, seed=seed, **kw)
            for p in PROMPTS]


def _outputs(dec: Decoder, method: str, temperature: float, seed: int | None = 7, **kw) -> list[tuple[int, ...]]:
    return [tuple(r.token_ids) for r in _results(dec, method, temperature, seed, **kw)]


def _decoder(scale: float, tmp_path, name: str, **kw) -> Decoder:
    # Every decoder gets a history store of its own (empty at first), so "history" and
    # auto's history source have something to learn from across requests.
    return Decoder(tiny_loaded(0, scale=scale), history=tmp_path / name, **kw)


@pytest.mark.parametrize("scale", [4.0, 1.0])  # 1.0: unscaled weights, near-ties between the top two logits
def test_greedy_stateful_methods_equal_ar_on_every_call(scale, tmp_path):
    ar = _outputs(_decoder(scale, tmp_path, "ar"), "ar", 0.0)
    for method in ("auto", "recycle", "history", "lookahead"):
        dec = _decoder(scale, tmp_path, method)
        first = _outputs(dec, method, 0.0)
        # The second round drafts from what the first taught the decoder (tables, history,
        # calibration, cost model) and a different seed: greedy ignores both.
        second = _outputs(dec, method, 0.0, seed=123)
        assert first == ar and second == ar, method


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_sampled_ar_and_pld_repeat_with_the_same_seed(method, tmp_path):
    a, b = _decoder(1.0, tmp_path, "a"), _decoder(1.0, tmp_path, "b")
    first = _outputs(a, method, 1.0)
    assert _outputs(b, method, 1.0) == first  # a fresh decoder
    assert _outputs(a, method, 1.0) == first  # the same decoder called again (its history has grown)
    assert _outputs(a, method, 0.7, top_p=0.9) == _outputs(b, method, 0.7, top_p=0.9)
    # The seed is really used: another seed draws another output (a fixed draw, not a chance).
    assert _outputs(a, method, 1.0, seed=8) != first


@pytest.mark.parametrize("method", ["recycle", "lookahead", "history"])
def test_priced_methods_sampled_repeat_on_fresh_decoders_when_pricing_is_held_fixed(method, tmp_path, monkeypatch):
    # What the README states: for these methods the seed reproduces the output given the
    # decoder's earlier requests and its pricing. Hold the pricing fixed (a given curve, no
    # online correction from step times) and two fresh decoders fed the same requests agree.
    monkeypatch.setattr(CostModel, "observe", lambda self, timing: None)
    curve = CostCurve((1, 16, 64), (10.0, 10.5, 12.0), 0, (0.0, 0.0, 0.0), "test", "fixed")
    runs, steps = [], []
    for name in ("a", "b"):
        dec = _decoder(4.0, tmp_path, name, cost_curve=curve)  # decisive weights: drafts get accepted
        _results(dec, method, 0.0)  # a first round teaches the decoder (history, tables, calibration)
        # Sampled rounds, state carried on. History's drafts are rarely accepted here at 0.3 (1-6 of
        # ~90 tokens over seeds 7-11, none with seed 7): seed 9 is one where they are, so that the
        # agreement below is between runs whose drafts were in play.
        res = _results(dec, method, 0.3, seed=9) + _results(dec, method, 0.3, seed=9)
        runs.append([r.token_ids for r in res])
        steps.append([r.steps for r in res])
    assert runs[0] == runs[1] and steps[0] == steps[1]
    # Not a trivial agreement: tokens were sampled, and drafts were accepted (fewer steps than tokens).
    assert sum(map(len, runs[0])) > N and sum(steps[0]) < sum(map(len, runs[0]))


@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_sampled_ar_in_a_batch_gives_prompt_i_the_tokens_of_seed_plus_i(scale):
    # generate_batch seeds prompt i with seed + i: with ar (nothing drafted, nothing priced) the
    # batched draws are the single requests' draws, batched four at a time or one at a time.
    prompts = PROMPTS + ["xyz xyz", "hello"]
    dec = Decoder(tiny_loaded(0, scale=scale))
    single = [dec.generate(p, method="ar", max_new_tokens=N, temperature=1.0, seed=5 + i).token_ids
              for i, p in enumerate(prompts)]
    for batch_size in (4, 1):
        batched = dec.generate_batch(prompts, method="ar", batch_size=batch_size, max_new_tokens=N, temperature=1.0,
                                     seed=5)
        assert [r.token_ids for r in batched] == single, batch_size
    assert len(set(single)) == len(prompts)  # four different draws: the seeds differ per prompt
