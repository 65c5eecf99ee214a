"""The small-LM fallback: exact q-aware acceptance, lossless drafts, the draft model's checks."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec.costs import CostCurve
from lookupdec.decoder import Decoder
from lookupdec.drafters.small_lm import SmallLMConfig, SmallLMDrafter
from lookupdec.errors import DraftError, TokenizerMismatchError
from lookupdec.proposals import check_tree
from lookupdec.sampling import SamplingParams
from lookupdec.tree import DraftTree, merge_trees
from tests.conftest import char_tokenizer, save_tiny, tiny_loaded, tiny_model
from tests.oracles.spec_sampling import step_law, target_law
from tests.test_sampling import _exact_marginals, assert_matches

# A target forward priced far above a draft token: drafting always pays, so every test drafts.
SLOW_TARGET = CostCurve((1, 64), (1000.0, 1010.0), 0, (0.0, 0.0), "test", "")
V = 4


def _table_dist(seed: int, temperature: float = 1.0):
    """A random "model" on V tokens: the next-token law depends on the whole context."""
    cache: dict[tuple, np.ndarray] = {}
    rng = np.random.default_rng(seed)

    def dist(ctx: tuple) -> np.ndarray:
        if ctx not in cache:
            logits = rng.normal(size=V) * 1.5 / temperature
            p = np.exp(logits - logits.max())
            if seed % 2 and len(ctx) % 2:
                p[rng.integers(V)] = 0.0  # some rows with a zero: supports differ between p and q
            cache[ctx] = p / p.sum()
        return cache[ctx]
    return dist


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("seeds", [(1, 2), (3, 4), (5, 5)])
def test_one_step_output_law_is_exactly_the_target_law(shape, seeds):
    """Every draft draw, coin flip and bonus draw enumerated: the first three tokens' law equals the target's
    to rounding, for a sampled chain and a tree of two siblings drawn without replacement (seeds (5, 5): the
    draft is the target, every draft accepted)."""
    target, draft = _table_dist(seeds[0]), _table_dist(seeds[1])
    ctx = (0,)
    got = step_law(shape, target, draft, ctx, V)
    want = target_law(target, ctx, V)
    assert abs(got.sum() - 1.0) < 1e-12
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_the_exact_check_sees_a_sibling_proposal_that_ignores_the_first_draw():
    """Storing q instead of q without the first sibling (the sibling was drawn without replacement) is wrong,
    and the enumeration shows it: the check has the power to catch a wrong q."""
    target, draft = _table_dist(1), _table_dist(2)
    bad = step_law("tree", target, draft, (0,), V, renormalise=False)
    assert np.abs(bad - target_law(target, (0,), V)).max() > 1e-3


def test_sampled_trees_keep_q_through_subset_and_refuse_merging():
    q = np.full((2, V), 1.0 / V)
    t = DraftTree(np.array([1, 2]), np.array([-1, 0]), q=q)
    assert t.sampled
    assert t.subset([0]).q.shape == (1, V) and t.subset([0]).sampled
    assert merge_trees([t, DraftTree.empty()]).tree is t
    with pytest.raises(ValueError, match="sampled DraftTree cannot be merged"):
        merge_trees([t, DraftTree.chain([1])])
    bad = q.copy()
    bad[0, 1] = 0.0
    bad[0] /= bad[0].sum()
    with pytest.raises(ValueError, match="probability 0 under its q"):
        DraftTree(np.array([1, 2]), np.array([-1, 0]), q=bad)


class _NoQ:
    name = "noq"

    def begin(self, ids):
        pass

    def commit(self, outcome):
        pass

    def propose(self, request):
        return DraftTree(np.array([5]), np.array([-1]), sampled=True)


def test_a_sampled_draft_without_q_is_refused():
    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    with pytest.raises(DraftError, match="'noq' proposed a sampled tree without q"):
        dec.generate([5, 6, 7], max_new_tokens=4, temperature=1.0, seed=0, drafter=_NoQ())


@pytest.mark.parametrize("fast", [False, True])
def test_draft_and_auto_with_a_draft_model_equal_ar(fast):
    """Greedy: a draft model with other random weights and one layer (drafts often wrong), and the target cut to
    one layer; draft and auto (with the small LM) give ar's tokens, and the small LM's drafts were verified."""
    target = tiny_loaded(0)
    for draft in (dict(draft_model=tiny_loaded(5, layers=1)), dict(draft_layers=1)):
        dec = Decoder(target, hf_kernels=not fast, cost_curve=SLOW_TARGET, **draft)
        drafted = 0
        for prompt in ([5, 6, 7], [9, 30, 40, 50, 9, 30, 40, 12]):
            ar = dec.generate(prompt, method="ar", max_new_tokens=40)
            d = dec.generate(prompt, method="draft", max_new_tokens=40)
            a = dec.generate(prompt, method="auto", max_new_tokens=40)
            assert d.token_ids == ar.token_ids and a.token_ids == ar.token_ids
            drafted += sum(s.draft_size for s in d.step_stats)
        # (once the calibration learns that a useless draft is never accepted, it stops drafting)
        assert drafted > 0


def test_draft_equal_to_target_accepts_every_chain_token():
    """The draft model is the target: every step accepts its whole chain (draft size minus the top-2 sibling)."""
    target = tiny_loaded(0)
    dec = Decoder(target, hf_kernels=True, cost_curve=SLOW_TARGET, draft_model=target)
    out = dec.generate([5, 6, 7], method="draft", max_new_tokens=40)
    drafted = [s for s in out.step_stats if s.draft_size]
    assert len(drafted) >= 3
    assert all(s.accepted == s.draft_size - 1 for s in drafted), [(s.draft_size, s.accepted) for s in drafted]
    assert out.steps < 40 / 3
    # auto calls the small LM where lookup drafts little (this prompt has nothing to copy) and gets its tokens
    auto = dec.generate([5, 6, 7], method="auto", max_new_tokens=40)
    assert auto.token_ids == out.token_ids and auto.accepted_by_source.get("draft", 0) > 10


@pytest.mark.slow
@pytest.mark.parametrize("alternates", [0, 1])
def test_sampled_small_lm_drafts_follow_the_target(alternates):
    """Chi-square: the first three tokens' marginals with sampled small-LM drafts (a chain, and a top-2 first
    level) equal the exact marginals of the target (1,500 seeded draws, temperature 1, top-k 4, top-p 0.95)."""
    lm = tiny_loaded(7)
    dec = Decoder(lm, hf_kernels=True, draft_layers=1)
    params = SamplingParams(1.0, top_k=4, top_p=0.95)
    prompt = [10, 11, 12]
    exact = _exact_marginals(lm, prompt, params, 3)
    drafter = SmallLMDrafter(dec.draft, config=SmallLMConfig(default_depth=3, alternates=alternates))
    counts = [np.zeros(128) for _ in range(3)]
    accepted = 0
    for seed in range(1_500):
        out = dec.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=4, top_p=0.95, seed=seed, drafter=drafter)
        for k in range(3):
            counts[k][out.token_ids[k]] += 1
        accepted += sum(s.accepted for s in out.step_stats)
    assert accepted > 300  # speculation was really exercised (and some drafts rejected: the draft is 1 layer)
    for k in range(3):
        assert_matches(counts[k], exact[k])


def _other_tokenizer_dir(path):
    tiny_model(1, layers=1).save_pretrained(path)
    tok = char_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(path)
    return str(path)


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path):
    other = _other_tokenizer_dir(tmp_path / "other")
    with pytest.raises(TokenizerMismatchError, match=r"draft model .*other.* does not share the tokenizer of "
                                                     r"target model 'tiny-llama-0'.*vocabularies differ"):
        Decoder(tiny_loaded(0), hf_kernels=True, draft_model=other)


def test_cli_refuses_another_tokenizer_and_a_draft_method_without_model(tmp_path):
    from lookupdec.cli import main

    target = save_tiny(tmp_path / "target", 0)
    other = _other_tokenizer_dir(tmp_path / "other")
    r = CliRunner().invoke(main, ["generate", "--model", target, "--draft-model", other, "--method", "draft",
                                  "--prompt", "hi", "--max-new-tokens", "4"])
    assert r.exit_code != 0 and "does not share the tokenizer" in r.output and "Traceback" not in r.output
    assert r.output.count("Error") == 1
    r = CliRunner().invoke(main, ["generate", "--model", target, "--method", "draft", "--prompt", "hi"])
    assert r.exit_code != 0 and "--draft-model" in r.output
    r = CliRunner().invoke(main, ["generate", "--model", target, "--draft-layers", "1", "--method", "draft",
                                  "--prompt", "hi", "--max-new-tokens", "6", "--json"])
    assert r.exit_code == 0, r.output


def test_method_draft_needs_a_draft_model():
    dec = Decoder(tiny_loaded(0), hf_kernels=True)
    with pytest.raises(ValueError, match="method 'draft' needs a draft model"):
        dec.generate([5, 6], method="draft", max_new_tokens=2)


class _Sampled:
    """Proposes a fixed sampled tree: a chain 5 -> 6 and a sibling 7 of 5 (uniform q rows)."""

    name = "fixed"

    def begin(self, ids):
        pass

    def commit(self, outcome):
        pass

    def propose(self, request):
        q = np.full((3, 128), 1.0 / 128)
        return DraftTree(np.array([5, 7, 6]), np.array([-1, -1, 0]), q=q)


def test_sampled_trees_are_cut_by_shape_only():
    """Over the budget: refused (a cut by score would depend on the drawn tokens). Without tree masks: the path
    of first children (5 -> 6), chosen by shape, with its q rows."""
    with pytest.raises(DraftError, match="sampled tree of 3 nodes for a budget of 2"):
        Decoder(tiny_loaded(0), hf_kernels=True, draft_budget=2).generate(
            [5, 6], max_new_tokens=3, temperature=1.0, seed=0, drafter=_Sampled())
    dec = Decoder(tiny_loaded(0), hf_kernels=True, tree_masks=False)
    tree, kept = check_tree(_Sampled(), _Sampled().propose(None), dec.vocab_size, 8, 8, dec.verifier.tree_masks)
    assert tree.tokens.tolist() == [5, 6] and kept.tolist() == [0, 2] and tree.q.shape == (2, 128)
    tree, kept = check_tree(_Sampled(), _Sampled().propose(None), dec.vocab_size, 8, 1, dec.verifier.tree_masks)
    assert tree.tokens.tolist() == [5]
