"""``parse_request`` on thousands of mutated request bodies: a ParsedRequest or a 400 naming a field, nothing else.

Bodies start from valid chat and completions requests; each has one to three fields replaced by
values of every JSON kind (and Python's NaN, infinities, huge integers and lone surrogates, which
``json.loads`` produces from ``NaN``, ``1e999``, long digit strings and ``"\\udcff"``), nested ones
included. Seeded, so a failure replays.
"""
from __future__ import annotations

import random

import pytest

from lookupdec.decoder_args import SEED_RANGE
from lookupdec.server.protocol import APIError, ParsedRequest, parse_request

SCALARS = [None, True, False, 0, 1, -1, 2, 4, 0.5, 1.5, -0.0, 3, 10 ** 30, -(10 ** 30), float("nan"), float("inf"),
           float("-inf"), "", "x", "content", "text", "user", "system", "json_schema", "\udcff", "a" * 1000]
FIELDS = ["messages", "prompt", "max_tokens", "max_completion_tokens", "max_new_tokens", "temperature", "top_p",
          "top_k", "seed", "stop", "stream", "stream_options", "prediction", "references", "response_format", "n",
          "model", "user", "logprobs", "suffix", "frobnicate"]
BASES = [
    (True, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    (True, {"messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": [{"type": "text", "text": "q"}]}],
            "prediction": {"type": "content", "content": "p"}, "references": ["r"], "stream": True,
            "stream_options": {"include_usage": True}, "stop": ["x"], "seed": 3, "temperature": 0.7}),
    (False, {"prompt": "hi", "max_tokens": 4}),
    (False, {"prompt": [1, 2, 3], "response_format": {"type": "json_object"}}),
]


def value(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth > 2 or kind < 0.55:
        return rng.choice(SCALARS)
    if kind < 0.8:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    names = ["type", "content", "text", "role", "include_usage", "json_schema", "schema", "x"]
    keys = rng.sample(names, rng.randint(0, 3))
    return {k: value(rng, depth + 1) for k in keys}


def mutate(rng: random.Random, body: dict) -> dict:
    out = dict(body)
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(FIELDS)
        if rng.random() < 0.15:
            out.pop(target, None)
        elif rng.random() < 0.3 and isinstance(out.get(target), (list, dict)) and out[target]:
            inner = out[target]
            inner = list(inner) if isinstance(inner, list) else dict(inner)
            key = rng.randrange(len(inner)) if isinstance(inner, list) else rng.choice(list(inner))
            inner[key] = value(rng)
            out[target] = inner
        else:
            out[target] = value(rng)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_mutated_bodies_parse_or_get_a_400_naming_a_field(seed):
    rng = random.Random(seed)
    accepted = refused = 0
    for _ in range(1500):
        chat, base = rng.choice(BASES)
        body = mutate(rng, base) if rng.random() < 0.97 else rng.choice(SCALARS + [[], [{}]])
        try:
            req = parse_request(body, chat)
        except APIError as err:
            refused += 1
            assert err.status == 400 and str(err), body
            assert err.param is None or isinstance(err.param, str)
            continue
        accepted += 1
        assert isinstance(req, ParsedRequest)
        assert 0 <= req.temperature <= 2 and 0 < req.top_p <= 1 and req.top_k >= 0
        assert req.max_tokens is None or req.max_tokens >= 1
        assert req.seed is None or SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]
        assert all(isinstance(s, str) and s for s in req.stop)
        for text in [*req.stop, *(req.references or ()), req.prediction or ""]:
            text.encode("utf-8")  # what reaches the tokenizer is valid Unicode
    assert accepted > 50 and refused > 500  # both outcomes were exercised
