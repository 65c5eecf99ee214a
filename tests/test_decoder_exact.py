"""Greedy speculative decoding is token-for-token plain greedy decoding.

Reference: transformers' own greedy ``generate()`` on the same tiny random
Llama (default kernels), and our ``ar`` (with fast kernels on, the same
kernels as the speculative runs).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import EOS_ID, TINY_VOCAB, batch_of, hf_greedy, tiny_loaded
from lookupdec.decoder import Decoder
from lookupdec.tree import DraftTree


class OracleDrafter:
    """Drafts a tree holding the true continuation (known in advance) up to
    ``depth`` tokens, mixed with random wrong branches; some steps draft a
    wrong first token only."""

    name = "oracle"

    def __init__(self, truth: list[int], depth: int, seed: int, branches: int = 3) -> None:
        self.truth, self.depth, self.branches = truth, depth, branches
        self.rng = np.random.default_rng(seed)

    def begin(self, prompt_ids):
        self.pos = 0  # tokens generated so far

    def commit(self, outcome):
        self.pos += len(outcome.new_tokens)

    def propose(self, request):
        budget = request.budget
        seqs = []
        true = self.truth[self.pos:self.pos + self.depth]
        for _ in range(self.branches):
            cut = int(self.rng.integers(0, len(true) + 1))
            seqs.append(true[:cut] + self.rng.integers(3, TINY_VOCAB, int(self.rng.integers(1, 4))).tolist())
        if true and self.rng.random() < 0.7:
            seqs.insert(int(self.rng.integers(0, len(seqs) + 1)), true)
        return DraftTree.from_sequences(seqs).prune(budget)


class RandomDrafter:
    """Random trees (random tokens and shapes): almost never right, must never hurt."""

    name = "random"

    def __init__(self, seed: int, size: int = 12) -> None:
        self.rng, self.size = np.random.default_rng(seed), size

    def begin(self, prompt_ids):
        pass

    def commit(self, outcome):
        pass

    def propose(self, request):
        n = int(self.rng.integers(0, self.size + 1))
        parents = [int(self.rng.integers(-1, i)) for i in range(n)]
        return DraftTree(self.rng.integers(0, TINY_VOCAB, n), np.array(parents, np.int32))


class ContextDrafter:
    """A minimal prompt-lookup drafter: every earlier occurrence of the last
    2-gram contributes its next ``depth`` tokens to the tree."""

    name = "ctx"

    def __init__(self, depth: int = 6) -> None:
        self.depth = depth

    def begin(self, prompt_ids):
        self.seq = list(prompt_ids)

    def commit(self, outcome):
        self.seq.extend(outcome.new_tokens)

    def propose(self, request):
        budget = request.budget
        s, key = self.seq, self.seq[-2:]
        conts = [s[i + 2:i + 2 + self.depth] for i in range(len(s) - 2) if s[i:i + 2] == key]
        conts = [c for c in conts if c]
        return DraftTree.from_sequences(conts).prune(budget) if conts else DraftTree.empty()


def _prompt(rng, n):
    return rng.integers(3, TINY_VOCAB, n).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_and_random_trees_match_transformers_greedy(seed):
    lm = tiny_loaded(seed)
    dec = Decoder(lm, hf_kernels=True, draft_budget=24)
    rng = np.random.default_rng(seed)
    for plen in (1, 7, 40):
        prompt = _prompt(rng, plen)
        ref = hf_greedy(lm.model, prompt, 48)
        for depth in (1, 3, 9):
            out = dec.generate(prompt, max_new_tokens=48, drafter=OracleDrafter(ref, depth, seed * 31 + depth))
            assert list(out.token_ids) == ref, (seed, plen, depth)
            # The oracle's true path is found: fewer forwards than tokens.
            if depth > 1 and len(ref) > 10:
                assert out.steps < len(ref)
        out = dec.generate(prompt, max_new_tokens=48, drafter=RandomDrafter(seed))
        assert list(out.token_ids) == ref


@pytest.mark.parametrize("seed", [0, 3])
def test_context_drafter_matches_transformers_greedy(seed):
    lm = tiny_loaded(seed)
    dec = Decoder(lm, hf_kernels=True)
    rng = np.random.default_rng(100 + seed)
    for plen in (5, 30):
        prompt = _prompt(rng, plen)
        ref = hf_greedy(lm.model, prompt, 64)
        out = dec.generate(prompt, max_new_tokens=64, drafter=ContextDrafter())
        assert list(out.token_ids) == ref
        assert out.new_tokens == len(ref) and out.steps == len(out.step_stats)


def test_max_new_tokens_reached_mid_acceptance():
    lm = tiny_loaded(0)
    dec = Decoder(lm, hf_kernels=True)
    prompt = [5, 6, 7, 8]
    ref = hf_greedy(lm.model, prompt, 40)
    for limit in (1, 2, 5, 13):
        # The oracle drafts 9 true tokens, more than the tokens left.
        out = dec.generate(prompt, max_new_tokens=limit, drafter=OracleDrafter(ref + [3] * 9, 9, 0, branches=0))
        assert list(out.token_ids) == ref[:limit]
        assert out.stop_reason == "length"
        # Drafts never run past the limit: each step's tree is clipped.
        assert all(s.accepted + 1 <= limit for s in out.step_stats)


def test_eos_inside_a_draft_stops_there():
    lm = tiny_loaded(0)
    dec = Decoder(lm, hf_kernels=True)
    prompt = [5, 6, 7, 8]
    ref = hf_greedy(lm.model, prompt, 30)
    eos_at = 10
    # Pretend the 11th reference token is EOS: the model never agrees, so instead
    # make EOS the model's own choice by declaring that token an EOS id.
    eos_tok = ref[eos_at]
    first = ref.index(eos_tok)
    lm2 = lm.__class__(lm.model, lm.tokenizer, lm.name, (EOS_ID, eos_tok), lm.max_context)
    dec = Decoder(lm2, hf_kernels=True)
    out = dec.generate(prompt, max_new_tokens=30, drafter=OracleDrafter(ref, 9, 0, branches=1))
    assert list(out.token_ids) == ref[:first + 1]  # the EOS token is kept, nothing after it
    assert out.stop_reason == "eos"


@pytest.mark.cpu
def test_fast_kernels_tree_decoding_equals_fast_kernels_ar():
    lm = tiny_loaded(4)
    dec = Decoder(lm, hf_kernels=False)
    assert dec.fast_kernels and dec.verifier.backend == "fast"  # a Llama on the CPU: the lean forward
    rng = np.random.default_rng(4)
    for plen in (3, 25):
        prompt = _prompt(rng, plen)
        ar = dec.generate(prompt, method="ar", max_new_tokens=48)
        assert ar.steps == ar.new_tokens  # one forward per token
        for drafter in (ContextDrafter(), OracleDrafter(list(ar.token_ids), 6, 1), RandomDrafter(2)):
            out = dec.generate(prompt, max_new_tokens=48, drafter=drafter)
            assert out.token_ids == ar.token_ids


def test_chain_fallback_for_models_without_tree_masks():
    """Forcing chain verification (what models without 4D-mask attention get) stays exact."""
    lm = tiny_loaded(5)
    dec = Decoder(lm, hf_kernels=True, tree_masks=False)
    prompt = [9, 10, 11, 12, 9, 10]
    ref = hf_greedy(lm.model, prompt, 40)
    out = dec.generate(prompt, max_new_tokens=40, drafter=OracleDrafter(ref, 5, 3))
    assert list(out.token_ids) == ref
    # Chain verification verifies one path: never more nodes than the depth.
    assert all(s.draft_size <= 5 + 3 for s in out.step_stats)  # one path: true part + 3 wrong at most


def test_eager_attention_model_verifies_trees_exactly():
    lm = tiny_loaded(6, attn="eager")
    dec = Decoder(lm, hf_kernels=True)
    assert dec.verifier.tree_masks
    prompt = [20, 21, 22, 23]
    ref = hf_greedy(lm.model, prompt, 40)
    out = dec.generate(prompt, max_new_tokens=40, drafter=OracleDrafter(ref, 6, 4))
    assert list(out.token_ids) == ref


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unscaled_weights_with_near_ties_still_equal_ar(seed):
    """transformers' own initialisation: the top two logits are often nearly equal, so a verify
    row whose rounding depended on the tree's width would flip an argmax here first."""
    import torch

    lm = tiny_loaded(seed, scale=1.0)
    rng = np.random.default_rng(seed)
    prompt = _prompt(rng, 30)
    ref = hf_greedy(lm.model, prompt, 64)
    # Near-ties are really present along this output.
    with torch.no_grad():
        logits = lm.model(batch_of(lm.model, prompt + ref)).logits[0, len(prompt) - 1:-1]
    top2 = torch.topk(logits, 2).values
    assert float((top2[:, 0] - top2[:, 1]).min()) < 2e-3
    for fast in (True, False):
        dec = Decoder(lm, hf_kernels=not fast, draft_budget=24)
        ar = dec.generate(prompt, method="ar", max_new_tokens=64)
        if not fast:
            assert list(ar.token_ids) == ref[:len(ar.token_ids)]
        for depth in (2, 6):
            out = dec.generate(prompt, max_new_tokens=64, drafter=OracleDrafter(list(ar.token_ids), depth, seed))
            assert out.token_ids == ar.token_ids and out.steps < ar.steps
        out = dec.generate(prompt, max_new_tokens=64, drafter=RandomDrafter(seed, size=24))
        assert out.token_ids == ar.token_ids
