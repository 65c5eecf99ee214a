"""`lookupdec serve` as a real process on 127.0.0.1, driven with the official `openai` client.

One server (tiny random model saved to a temp dir, method auto, max batch 4, queue 8, an API
key) serves every test of this module. The oracle is the same model decoded in this process
with ``ar`` (plain greedy decoding), one prompt at a time. The tiny model keeps its default
weight scale here (decisive argmaxes); exactness of batching on unscaled weights with near-ties
is tested in-process by tests/test_generate_batch.py.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from lookupdec.decoder import Decoder  # noqa: E402
from tests.conftest import TEST_DEVICE, save_tiny  # noqa: E402
from tests.server_proc import ServerProcess  # noqa: E402

KEY = "test-key"
# A context long enough for a generation that outlasts a disconnect or a full queue.
POSITIONS = 4096
LONG = 3000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("srv-tiny"), 0, max_positions=POSITIONS)


@pytest.fixture(scope="module")
def server(model_dir):
    # Prefix reuse on (float32 has it off by default): every comparison with the in-process oracle,
    # which prefills every prompt in full, covers it too. It lives in the fast forward's cache, so a
    # GPU run (LOOKUPDEC_TEST_DEVICE) serves without it.
    reuse = ["--prefix-cache-mb", "64"] if TEST_DEVICE == "cpu" else []
    srv = ServerProcess(["--model", model_dir, "--max-batch", "4", "--max-queue", "8", "--model-id", "tiny", *reuse], KEY)
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ref(model_dir):
    """The oracle: ``ar`` in this process, memoised by (prompt, chat, max tokens)."""
    import torch

    torch.set_num_threads(1)
    dec = Decoder(model_dir)
    memo = {}

    def expected(prompt, max_tokens: int, chat: bool = True, stop=None):
        key = (json.dumps(prompt), max_tokens, chat, json.dumps(stop))
        if key not in memo:
            res = dec.generate(prompt, method="ar", max_new_tokens=max_tokens, chat_template=chat, stop=stop)
            memo[key] = res
        return memo[key]

    expected.decoder = dec
    return expected


PROMPTS = ["abcabc abcabc", "hello world, hello", "The cat sat on the mat. The cat", "0123456789 0123",
           "xyz", "a b c d e f g a b c", "Repeat: red green blue red green", "lorem ipsum dolor sit amet"]


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    h = server.health()
    assert h["status"] == "ok" and h["active"] == 0 and h["model"] == "tiny"


def test_chat_and_completions_greedy_equal_ar(client, ref):
    for text in PROMPTS[:3]:
        r = client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=40, temperature=0)
        want = ref(_msgs(text), 40)
        assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
        assert r.usage.completion_tokens == want.new_tokens and r.usage.prompt_tokens == want.prompt_tokens
        assert r.choices[0].finish_reason == ("length" if want.stop_reason == "length" else "stop")
        c = client.completions.create(model="tiny", prompt=text, max_tokens=40, temperature=0)
        want = ref(text, 40, chat=False)
        assert c.choices[0].text == want.text and c.usage.completion_tokens == want.new_tokens
        assert c.object == "text_completion" and r.object == "chat.completion"


def test_streamed_equals_unstreamed_and_ends_with_usage(server, client, ref):
    text = PROMPTS[3]
    want = ref(_msgs(text), 48)
    chunks = list(client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=48, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    body = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert body == want.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length" if want.stop_reason == "length" else "stop"]
    assert chunks[-1].usage.completion_tokens == want.new_tokens and not chunks[-1].choices
    comp = list(client.completions.create(model="tiny", prompt=text, max_tokens=48, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in comp) == ref(text, 48, chat=False).text
    # The raw stream ends with the [DONE] sentinel.
    with httpx.stream("POST", server.url + "/v1/completions", headers=server.headers, timeout=60,
                      json={"prompt": text, "max_tokens": 5, "temperature": 0, "stream": True}) as r:
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") for x in lines)


def test_stop_string_cuts_the_text(client, ref):
    text = PROMPTS[0]
    full = ref(_msgs(text), 40).text
    stop = full[5:7]
    assert stop and full.index(stop) < len(full)
    r = client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].message.content == ref(_msgs(text), 40, stop=[stop]).text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_prediction_and_references_leave_the_output_unchanged(server, client, ref):
    text = PROMPTS[6]
    want = ref(_msgs(text), 60)
    before = server.metric('lookupdec_completion_tokens_total')
    r = client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=60, temperature=0,
                                       prediction={"type": "content", "content": want.text})
    assert r.choices[0].message.content == want.text
    d = r.usage.completion_tokens_details
    n_pred = len(ref.decoder.tokenizer(want.text, add_special_tokens=False)["input_ids"])
    assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == n_pred
    assert d.accepted_prediction_tokens > 0  # drafted from the prediction and accepted
    # A prediction as text parts, and references through extra_body.
    r2 = client.chat.completions.create(
        model="tiny", messages=_msgs(text), max_tokens=60, temperature=0,
        prediction={"type": "content", "content": [{"type": "text", "text": want.text[:20]},
                                                   {"type": "text", "text": want.text[20:]}]},
        extra_body={"references": [want.text, "unrelated words"]})
    assert r2.choices[0].message.content == want.text
    c = client.completions.create(model="tiny", prompt=text, max_tokens=30, temperature=0,
                                  extra_body={"references": [ref(text, 30, chat=False).text]})
    assert c.choices[0].text == ref(text, 30, chat=False).text
    assert server.metric('lookupdec_completion_tokens_total') == before + 2 * want.new_tokens + c.usage.completion_tokens


def test_a_chats_next_turn_reuses_the_first_turns_rows_and_says_so(server, client, ref):
    if TEST_DEVICE != "cpu":
        pytest.skip("prefix reuse is the fast forward's (CPU); this run's server uses transformers' forward")
    first = _msgs("count: one two three")
    r1 = client.chat.completions.create(model="tiny", messages=first, max_tokens=30, temperature=0)
    turn2 = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "again, the same"}]
    before = server.metric("lookupdec_prompt_cached_tokens_total")
    r2 = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=30, temperature=0)
    assert r2.choices[0].message.content == ref(turn2, 30).text
    first_ids = ref.decoder.encode(first)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert len(first_ids) <= cached < r2.usage.prompt_tokens  # at least the first turn's prompt, never the whole
    assert server.metric("lookupdec_prompt_cached_tokens_total") - before == cached


def test_token_id_prompt_and_response_format(client, ref):
    """A completions prompt given as token ids; a json_schema response_format: both equal ``ar`` in-process
    (constrained ``ar`` for the schema)."""
    pytest.importorskip("llguidance")
    from lookupdec.constraints import JsonSchema

    ids = [40, 41, 42, 43, 40, 41]
    c = client.completions.create(model="tiny", prompt=ids, max_tokens=20, temperature=0)
    assert c.choices[0].text == ref(ids, 20, chat=False).text and c.usage.prompt_tokens == len(ids)
    schema = {"type": "object", "properties": {"ok": {"type": "string", "enum": ["yes", "no"]}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.chat.completions.create(model="tiny", messages=_msgs(PROMPTS[1]), max_tokens=60, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "answer", "schema": schema}})
    want = ref.decoder.generate(_msgs(PROMPTS[1]), method="ar", max_new_tokens=60, grammar=JsonSchema(schema))
    assert r.choices[0].message.content == want.text and r.choices[0].finish_reason == "stop"
    assert not want.incomplete and json.loads(want.text)["ok"] in ("yes", "no")


def test_concurrent_greedy_requests_each_equal_ar_and_are_batched(server, client, ref):
    """Eight requests at once (four decoded together, four queued): each output is its own prompt's ``ar``."""
    N = 128  # long enough that the eight overlap however the client threads are scheduled
    steps0, batch0 = server.metric("lookupdec_batch_size_count"), server.metric("lookupdec_batch_size_sum")

    def one(i: int):
        text = PROMPTS[i]
        if i % 2:
            chunks = client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=N, temperature=0,
                                                    stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return client.chat.completions.create(model="tiny", messages=_msgs(text), max_tokens=N,
                                              temperature=0).choices[0].message.content

    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    for i, out in enumerate(outs):
        assert out == ref(_msgs(PROMPTS[i]), N).text, i
    steps = server.metric("lookupdec_batch_size_count") - steps0
    mean_batch = (server.metric("lookupdec_batch_size_sum") - batch0) / steps
    assert mean_batch > 1.5  # the requests really were verified together


def test_load_200_requests_none_lost_or_mixed_up(server, client, ref):
    """200 requests at concurrency 8 (mixed lengths, every third streamed, greedy and sampled):
    every one answered 200 exactly once, greedy ones with their own prompt's ``ar`` output."""
    lengths = [4, 17, 33, 64]
    jobs = [(i, PROMPTS[i % len(PROMPTS)], lengths[i % 4], i % 3 == 0, i % 5 == 4) for i in range(200)]
    for _, text, n, _, sampled in jobs:
        if not sampled:
            ref(_msgs(text), n)

    def one(job):
        i, text, n, stream, sampled = job
        kw = dict(model="tiny", messages=_msgs(text), max_tokens=n, temperature=0.9 if sampled else 0, seed=i)
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            ids = {c.id for c in chunks}
            assert len(ids) == 1
            return i, ids.pop(), "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), \
                [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        r = client.chat.completions.create(**kw)
        return i, r.id, r.choices[0].message.content, [r.choices[0].finish_reason]

    with cf.ThreadPoolExecutor(8) as pool:  # bounded: a hung request fails at the client's 120 s timeout
        outs = list(pool.map(one, jobs))
    assert sorted(o[0] for o in outs) == list(range(200))
    assert len({o[1] for o in outs}) == 200  # one response id per request: none duplicated
    for (i, text, n, _, sampled), (_, _, out, finishes) in zip(jobs, outs):
        assert len(finishes) == 1 and finishes[0] in ("stop", "length")
        if not sampled:
            assert out == ref(_msgs(text), n).text, i
    h = server.health()
    assert h["active"] == 0 and h["queued"] == 0


def test_bad_requests_get_400_naming_the_field(server):
    msgs = _msgs("hi")
    table = [
        ({"messages": msgs, "n": 2}, "n"),
        ({"messages": msgs, "frobnicate": 1}, "frobnicate"),
        ({"messages": msgs, "temperature": "hot"}, "temperature"),
        ({"messages": msgs, "temperature": 3}, "temperature"),
        ({"messages": msgs, "top_p": 0}, "top_p"),
        ({"messages": msgs, "max_tokens": 0}, "max_tokens"),
        ({"messages": msgs, "max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
        ({"messages": msgs, "max_completion_tokens": "5"}, "max_completion_tokens"),
        ({"messages": msgs, "seed": 1.5}, "seed"),
        ({"messages": msgs, "seed": 2 ** 64}, "seed"),  # more than a generator takes
        ({"messages": msgs, "stop": [1]}, "stop"),
        ({"messages": msgs, "stream": "yes"}, "stream"),
        ({"messages": msgs, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": msgs, "prediction": {"type": "diff", "content": "x"}}, "prediction.type"),
        ({"messages": msgs, "prediction": {"type": "content"}}, "prediction.content"),
        ({"messages": msgs, "references": "one string"}, "references"),
        ({"messages": msgs, "references": ["ok", 3]}, "references[1]"),
        ({"messages": msgs, "logprobs": True}, "logprobs"),
        ({"messages": msgs, "response_format": {"type": "yaml"}}, "response_format.type"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0]"),
        # JSON's "\udcff" decodes to a lone surrogate, which no tokenizer encodes.
        ({"messages": [{"role": "user", "content": "ab \udcff"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udcff"}]}]},
         "messages[0].content[0].text"),
        ({"messages": msgs, "stop": ["\udcff"]}, "stop"),
        ({"messages": msgs, "references": ["ok", "\udcff"]}, "references[1]"),
        ({"messages": msgs, "prediction": {"type": "content", "content": "\udcff"}}, "prediction.content"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": _msgs("x" * 5000), "max_tokens": 4}, "messages"),  # longer than the context
        ({"messages": msgs, "max_tokens": POSITIONS}, "messages"),  # prompt + max_tokens over the context
    ]
    json_headers = {**server.headers, "content-type": "application/json"}  # bodies ASCII-escaped, as JSON allows
    for body, param in table:
        r = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body), headers=json_headers, timeout=30)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], (body, err)
    # A context-length error names the request's own token-limit field, not the library's max_new_tokens.
    for limit in ("max_tokens", "max_completion_tokens"):
        r = httpx.post(server.url + "/v1/chat/completions", content=json.dumps({"messages": msgs, limit: POSITIONS}),
                       headers=json_headers, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert f"{limit} is {POSITIONS}" in err["message"] and f"set {limit} to at most" in err["message"], err
        assert "max_new_tokens" not in err["message"], err
    r = httpx.post(server.url + "/v1/completions", content=json.dumps({"prompt": "x" * 5000}), headers=json_headers,
                   timeout=30)  # no limit given: the prompt alone fills the context
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and err["code"] == "context_length_exceeded", r.text
    assert err["message"].startswith("the prompt takes") and "shorten the prompt to fewer than" in err["message"], err
    comp = [({"prompt": ["a", "b"]}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
            ({"prompt": "\udcff"}, "prompt"), ({"prompt": [5, 10 ** 6]}, "prompt"), ({"prompt": [-1]}, "prompt"),
            ({"prompt": "a", "messages": msgs}, "messages")]
    for body, param in comp:
        r = httpx.post(server.url + "/v1/completions", content=json.dumps(body), headers=json_headers, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers=server.headers, timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    # JSON nested past Python's recursion limit (json.loads raised RecursionError: a 500).
    r = httpx.post(server.url + "/v1/chat/completions", content=b"[" * 200_000 + b"]" * 200_000,
                   headers=server.headers, timeout=30)
    assert r.status_code == 400 and "nests JSON too deeply" in r.json()["error"]["message"], r.text
    # A body over the limit is refused, whether its length is declared or it is streamed.
    from lookupdec.server.app import MAX_BODY_BYTES

    big = b'{"messages": [], "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    r = httpx.post(server.url + "/v1/chat/completions", content=big, headers=server.headers, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    r = httpx.post(server.url + "/v1/chat/completions", content=iter([big[:1 << 20], big[1 << 20:]]),
                   headers=server.headers, timeout=60)  # chunked: no Content-Length
    assert r.status_code == 413, r.text
    assert server.health()["status"] == "ok"


def test_api_key_enforced(server):
    body = {"messages": _msgs("hi"), "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 401
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.post(server.url + "/v1/chat/completions", json=body, headers=server.headers, timeout=30).status_code == 200


def _wait_idle(server, timeout=60.0) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        h = server.health()
        if h["active"] == 0 and h["queued"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"the server kept {server.health()} sequences")


def test_disconnect_mid_stream_frees_the_sequence(server):
    """A client that goes away after its first chunks: its sequence is dropped long before its
    3,000 tokens, and counted as cancelled."""
    done0 = server.metric("lookupdec_completion_tokens_total")
    cancelled0 = server.metric("lookupdec_cancelled_total")
    body = {"prompt": "abc", "max_tokens": LONG, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=server.headers, timeout=60) as r:
        lines = r.iter_lines()  # kept open: leaving a for loop over it would close the connection
        got = 0
        while got < 3:
            got += next(lines).startswith("data: {")
        assert server.health()["active"] == 1  # still decoding
    _wait_idle(server)
    assert server.metric("lookupdec_cancelled_total") == cancelled0 + 1
    assert server.metric("lookupdec_completion_tokens_total") == done0  # it never completed


def test_overload_gets_429_with_retry_after(server):
    """4 long requests decoding and 8 waiting fill the server: the next gets 429 with Retry-After;
    once those clients go away, everything is freed."""
    cancelled0 = server.metric("lookupdec_cancelled_total")
    done0 = server.metric("lookupdec_completion_tokens_total")
    body = {"prompt": "abc", "max_tokens": LONG, "temperature": 0, "stream": True}
    streams = []
    with httpx.Client(headers=server.headers, timeout=60) as http:
        try:
            for _ in range(12):
                s = http.stream("POST", server.url + "/v1/completions", json=body)
                r = s.__enter__()
                assert r.status_code == 200
                streams.append(s)
            h = server.health()
            assert h["active"] == 4 and h["queued"] == 8
            r = httpx.post(server.url + "/v1/completions", json=dict(body, stream=False), headers=server.headers,
                           timeout=30)
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0).completions.create(
                    model="tiny", prompt="abc", max_tokens=2)
        finally:
            for s in streams:
                s.__exit__(None, None, None)
    _wait_idle(server)
    cancelled = server.metric("lookupdec_cancelled_total") - cancelled0
    completed = (server.metric("lookupdec_completion_tokens_total") - done0) / LONG
    assert cancelled >= 8 and cancelled + completed == 12  # the queued ones at least were dropped; none lost


@pytest.mark.slow
def test_sampling_through_concurrent_requests_keeps_the_target_distribution(server, client):
    """1,200 sampled requests (method auto) at concurrency 8, their steps verified in shared forwards:
    the first three tokens' marginals equal the exact marginals of the model (chi-square)."""
    import re

    import numpy as np

    from lookupdec.sampling import SamplingParams
    from tests.conftest import EOS_ID, char_tokenizer, tiny_loaded
    from tests.test_sampling import _exact_marginals, assert_matches

    # A prompt whose first three tokens are never special ones (EOS would end the draw, <unk> is
    # not in the text): every output's text gives back its three tokens.
    prompt = [96, 97, 98]
    exact = _exact_marginals(tiny_loaded(0, max_positions=POSITIONS), prompt, SamplingParams(1.0, 0.95, 4), 3)
    assert max(float(m[:EOS_ID + 1].sum()) for m in exact) == 0
    vocab = char_tokenizer().get_vocab()

    def ids_of(text: str) -> list[int]:  # the char tokenizer's text back to ids (fillers print as <xN>)
        return [int(m.group(1)) if m.group(1) else vocab[m.group(0)] for m in re.finditer(r"<x(\d+)>|.", text, re.S)]

    def one(seed: int) -> list[int]:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=1.0, top_p=0.95,
                                      seed=seed, extra_body={"top_k": 4})
        return ids_of(r.choices[0].text)

    batch0, steps0 = server.metric("lookupdec_batch_size_sum"), server.metric("lookupdec_batch_size_count")
    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(1200)))
    assert (server.metric("lookupdec_batch_size_sum") - batch0) / (server.metric("lookupdec_batch_size_count")
                                                                   - steps0) > 1.3  # really batched
    for k in range(3):
        counts = np.bincount([ids[k] for ids in outs], minlength=len(exact[k]))
        assert_matches(counts, exact[k])
