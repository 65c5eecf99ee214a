"""Constrained decoding with drafts is exactly constrained ``ar``.

Greedy: token for token, for every method and for drafters whose trees break the
grammar. Sampling: a chi-square test of the first tokens against the exact
constrained distribution computed from the model. JSON Schema outputs parse and
validate with ``jsonschema``. Errors come before any model work.
"""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from lookupdec import Choice, ConstraintError, Lark, Regex
from lookupdec.decoder import Decoder
from lookupdec.index import build_index_from_tokens
from lookupdec.tree import DraftTree
from tests.conftest import FLAT, EOS_ID, TINY_VOCAB, batch_of, char_tokenizer, tiny_loaded
from tests.oracles.grammar import FiniteLanguage, enumerate_regex
from tests.test_sampling import assert_matches

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "ok": {"type": "boolean"},
                         "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "n", "ok", "tag"], "additionalProperties": False}
GRAMMARS = {
    "schema": SCHEMA,
    "regex": Regex(r"([a-z]{1,6} ){2,6}[0-9]{1,3}\."),
    "choice": ["the weather is fine", "the weather is bad", "no idea"],
    "lark": Lark('start: "(" item ("," item)* ")"\nitem: /[a-z]{1,4}/ | start\n'),
}
METHODS = ["pld", "llma", "rest", "history", "recycle", "lookahead", "auto"]
PROMPT = 'the weather is fine today {"name": "abc", "n": 12, "ok": true, "tag": "red"} (ab,cd) wind 12.'


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    out = {}
    for seed, scale in ((0, 4.0), (5, 1.0)):  # scale 1: unscaled weights, near-ties
        lm = tiny_loaded(seed, scale=scale)
        d = tmp_path_factory.mktemp(f"g{seed}")
        rng = np.random.default_rng(seed)
        prompt_ids = lm.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
        build_index_from_tokens([rng.integers(3, 100, 200).tolist() for _ in range(5)] + [prompt_ids],
                                d / "i", tokenizer=lm.tokenizer)
        out[(seed, scale)] = Decoder(lm, indexes=str(d / "i"), history=str(d / "h"), cost_curve=FLAT)
    return out


@pytest.mark.parametrize("key", [(0, 4.0), (5, 1.0)])
@pytest.mark.parametrize("gname", list(GRAMMARS))
def test_greedy_constrained_output_equals_constrained_ar_for_every_method(decoders, key, gname):
    dec = decoders[key]
    grammar = GRAMMARS[gname]
    ref = dec.generate(PROMPT, method="ar", max_new_tokens=60, grammar=grammar, chat_template=False, remember=False)
    # Seed the history store with the reference so "history" has something right to draft.
    dec.history.append(ref.token_ids)
    drafted = 0
    for method in METHODS:
        refs = [PROMPT, dec.tokenizer.decode(list(ref.token_ids), skip_special_tokens=True) or "x"]
        out = dec.generate(PROMPT, method=method, max_new_tokens=60, grammar=grammar, chat_template=False,
                           references=refs if method in ("llma", "auto") else None, remember=False)
        assert out.token_ids == ref.token_ids, (gname, method)
        assert out.stop_reason == ref.stop_reason and out.incomplete == ref.incomplete
        drafted += sum(out.accepted_by_source.values())
    assert drafted > 0  # drafts (or forced tokens) were accepted somewhere


class BreakingDrafter:
    """Trees mixing the true constrained continuation with tokens the grammar forbids
    (random ids, EOS too early, digits where letters must come)."""

    name = "breaking"

    def __init__(self, truth, seed: int) -> None:
        self.truth = list(truth)
        self.rng = np.random.default_rng(seed)
        self.proposed = self.cut = 0

    def begin(self, prompt_ids):
        self.pos = 0

    def commit(self, outcome):
        self.pos += len(outcome.new_tokens)

    def propose(self, request):
        true = self.truth[self.pos:self.pos + 6]
        seqs = []
        for _ in range(3):
            k = int(self.rng.integers(0, len(true) + 1))
            seqs.append(true[:k] + self.rng.integers(0, TINY_VOCAB, int(self.rng.integers(1, 4))).tolist())
        seqs.append(true[:2] + [EOS_ID])
        if self.rng.random() < 0.7:
            seqs.append(true)
        tree = DraftTree.from_sequences([s for s in seqs if s]).prune(request.budget)
        self.proposed += len(tree)
        return tree


@pytest.mark.parametrize("gname", list(GRAMMARS))
def test_drafts_that_break_the_grammar_are_pruned_and_the_output_stays_exact(decoders, gname):
    dec = decoders[(5, 1.0)]
    grammar = GRAMMARS[gname]
    ref = dec.generate(PROMPT, method="ar", max_new_tokens=60, grammar=grammar, chat_template=False, remember=False)
    drafter = BreakingDrafter(ref.token_ids, seed=len(gname))
    out = dec.generate(PROMPT, max_new_tokens=60, grammar=grammar, chat_template=False, drafter=drafter,
                       remember=False)
    assert out.token_ids == ref.token_ids
    verified = sum(s.draft_size for s in out.step_stats)
    # Forbidden nodes never reached the forward: fewer rows verified than proposed (plus forced ones added).
    assert verified < drafter.proposed + 60
    assert out.steps < ref.steps  # the right branches were still used


def test_pruned_plans_hold_only_paths_the_grammar_allows():
    """Step by step through Sequence: every node of every planned tree is on an allowed path (oracle)."""
    from lookupdec.drafters.base import NoDrafter
    from lookupdec.sampling import SamplingParams
    from lookupdec.sequence import Sequence

    lm = tiny_loaded(2)
    dec = Decoder(lm)
    words = enumerate_regex(r"[ab]{1,3}-[0-2]{2}", "ab-012", 6)
    lang = FiniteLanguage(words)
    tok = char_tokenizer()
    rng = np.random.default_rng(0)

    class Junk(NoDrafter):
        name = "junk"

        def propose(self, request):
            n = 14
            parents = [int(rng.integers(-1, i)) for i in range(n)]
            ids = [tok.convert_tokens_to_ids(c) for c in "ab-012z"] + [EOS_ID]
            return DraftTree(np.array([ids[int(rng.integers(len(ids)))] for _ in range(n)]), np.array(parents, np.int32))

    con = dec.constraint(Regex(r"[ab]{1,3}-[0-2]{2}"))
    seq = Sequence(dec, dec.encode("ab-01 ba-22", chat_template=False), Junk(), "junk", 20,
                   SamplingParams(0.0, 1.0, 0), None, [], None, constraint=con)
    seq.prefill()
    planned = 0
    while not seq.done:
        done_text = tok.decode(seq.new, skip_special_tokens=True)
        plan = seq.plan()
        for i in range(len(plan.tree)):
            path = plan.tree.tokens[plan.tree.path(i)].tolist()
            if path[-1] == EOS_ID:
                assert lang.eos_allowed(done_text + tok.decode(path[:-1])) and EOS_ID not in path[:-1]
            else:
                assert lang.is_prefix(done_text + tok.decode(path)), (done_text, path)
            planned += 1
        res = dec.verifier.forward(seq.cache, seq.past, plan.root, plan.tree, extra=plan.extra, topk=plan.topk)
        seq.finish(plan, res, 0.0)
    out = seq.result()
    assert planned > 0 and out.stop_reason == "eos" and not out.incomplete
    assert tok.decode(list(out.token_ids), skip_special_tokens=True) in words


def _exact_first_two(lm, prompt_ids, grammar, temperature):
    """The exact law of the first two constrained tokens: masked, renormalised softmax rows from the model."""
    dec = Decoder(lm, hf_kernels=True)
    con = dec.constraint(grammar)
    model = lm.model
    with torch.no_grad():
        logits = model(batch_of(model, prompt_ids)).logits[0, -1].cpu()
    p1 = torch.softmax(logits / temperature, -1).numpy() * con.mask()
    p1 /= p1.sum()
    joint = {}
    for y in np.flatnonzero(p1):
        with torch.no_grad():
            l2 = model(batch_of(model, prompt_ids + [int(y)])).logits[0, -1].cpu()
        p2 = torch.softmax(l2 / temperature, -1).numpy() * con.mask_after([int(y)])
        p2 /= p2.sum()
        for z in np.flatnonzero(p2):
            joint[(int(y), int(z))] = p1[y] * p2[z]
    return joint


class SampledJunk:
    """A sampling drafter: its tree is drawn from q (uniform over a few ids, forbidden ones included)."""

    name = "sampled"

    def __init__(self, ids) -> None:
        self.ids = ids

    def set_sampling(self, params, generator):
        self.gen = generator

    def begin(self, prompt_ids):
        pass

    def commit(self, outcome):
        pass

    def propose(self, request):
        if request.budget < 2 or request.max_depth < 2:
            return DraftTree.empty()
        q = np.zeros((2, TINY_VOCAB))
        q[:, self.ids] = 1.0 / len(self.ids)
        draws = torch.multinomial(torch.tensor(q), 1, generator=self.gen).flatten().tolist()
        return DraftTree(np.array(draws), np.array([-1, 0], np.int32), q=q)


@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["deterministic", "sampled"])
def test_sampled_constrained_output_has_the_constrained_distribution(drafter_kind):
    lm = tiny_loaded(7, scale=1.0)
    dec = Decoder(lm)
    grammar = Regex(r"[a-d]{3}")
    prompt = dec.encode("abcd dcba", chat_template=False)
    exact = _exact_first_two(lm, prompt, grammar, 1.0)
    tok = char_tokenizer()
    letters = [tok.convert_tokens_to_ids(c) for c in "abcd"]
    if drafter_kind == "deterministic":
        from tests.test_sampling import TopTokensDrafter

        # Allowed and forbidden branches (x, z, EOS are never allowed second or third).
        drafter = TopTokensDrafter([[a, b] for a in letters[:3] for b in letters[:2]] +
                                   [[tok.convert_tokens_to_ids("x"), EOS_ID]])
    else:
        drafter = SampledJunk(letters + [tok.convert_tokens_to_ids("z"), EOS_ID])
    keys = sorted(exact)
    counts = np.zeros(len(keys))
    index = {k: i for i, k in enumerate(keys)}
    accepted = 0
    for seed in range(1500):
        out = dec.generate(prompt, max_new_tokens=4, temperature=1.0, seed=seed, drafter=drafter, grammar=grammar)
        assert tok.decode(list(out.token_ids), skip_special_tokens=True) in {a + b + c for a in "abcd"
                                                                             for b in "abcd" for c in "abcd"}
        counts[index[(out.token_ids[0], out.token_ids[1])]] += 1
        accepted += sum(s.accepted for s in out.step_stats)
    assert accepted > 300  # drafts were really accepted
    assert_matches(counts, np.array([exact[k] for k in keys]))


@pytest.mark.parametrize("method", ["ar", "pld", "auto"])
def test_every_json_schema_output_parses_and_validates(decoders, method):
    complete = 0
    for dec in decoders.values():
        for prompt in (PROMPT, "x y z", '{"name": "q", "n": 7, "ok": false, "tag": "blue"}'):
            for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
                out = dec.generate(prompt, method=method, max_new_tokens=100, grammar=SCHEMA, chat_template=False,
                                   temperature=temperature, seed=seed, remember=False)
                assert out.stop_reason == "eos" and not out.incomplete, out.text
                jsonschema.validate(json.loads(out.text), SCHEMA)
                complete += 1
    assert complete == 18


def test_a_grammar_that_cannot_finish_in_time_says_it_is_incomplete(decoders):
    dec = decoders[(0, 4.0)]
    out = dec.generate(PROMPT, method="pld", max_new_tokens=5, grammar=Regex(r"[a-z]{20}"), chat_template=False)
    assert out.stop_reason == "length" and out.incomplete and len(out.token_ids) == 5
    assert out.text.isalpha() and out.text.islower()
    done = dec.generate(PROMPT, method="pld", max_new_tokens=30, grammar=Regex(r"[a-z]{20}"), chat_template=False)
    assert done.stop_reason == "eos" and not done.incomplete and len(done.text) == 20
    free = dec.generate(PROMPT, method="pld", max_new_tokens=5, chat_template=False)
    assert not free.incomplete


def test_eos_comes_only_once_the_grammar_is_complete(decoders):
    """A choice whose shorter option is a prefix of a longer one: EOS is allowed after either."""
    dec = decoders[(5, 1.0)]
    for method in ("ar", "pld"):
        out = dec.generate(PROMPT, method=method, max_new_tokens=30, grammar=Choice(["no", "no idea at all"]),
                           chat_template=False)
        assert out.text in ("no", "no idea at all") and out.token_ids[-1] == EOS_ID


@pytest.mark.parametrize("bad", ["[0-9]+", Regex("[0-"), Lark("start: missing"), {"type": "nosuchtype"}, []])
def test_bad_grammars_fail_before_any_model_work(bad):
    dec = Decoder(tiny_loaded(0))

    def boom(*a, **k):
        raise AssertionError("the model ran")

    dec.verifier.prefill = boom
    dec.verifier.forward = boom
    with pytest.raises(ConstraintError):
        dec.generate("hi", method="pld", max_new_tokens=5, grammar=bad)
