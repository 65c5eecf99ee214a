"""OpenAI request bodies parsed and checked into named settings, and OpenAI's error shape.

Every field a request may carry is listed here; any other field is a 400 that names it
(a client that asks for something lookupdec does not do is told, never silently served
something else). A few OpenAI fields are accepted only at their no-op value
(``NOOP_FIELDS``: ``n`` 1, ``logprobs`` false, penalties 0, ...).

Example:
    >>> req = parse_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}, chat=True)
    >>> req.max_tokens, req.stream, req.prompt
    (8, False, [{'role': 'user', 'content': 'hi'}])
    >>> parse_request({"prompt": "x", "n": 2}, chat=False)
    Traceback (most recent call last):
    ...
    lookupdec.server.protocol.APIError: n must be 1 (lookupdec returns one choice per request), got 2
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lookupdec.decoder_args import check_seed, checked_text

# Fields accepted only at the value that changes nothing (and null).
NOOP_FIELDS: dict[str, tuple] = {
    "n": (1,),
    "best_of": (1,),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (False,),
    "store": (False,),
}
# Fields both endpoints take.
COMMON_FIELDS = {"model", "max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                 "stream_options", "prediction", "references", "response_format", "user"} | set(NOOP_FIELDS)
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "suffix"}
ROLES = {"system", "user", "assistant", "developer"}
MAX_STOPS = 4  # OpenAI's limit


class APIError(Exception):
    """An error answered in OpenAI's JSON shape.

    Args:
        message: what is wrong and how to fix it.
        status: the HTTP status.
        param: the request field at fault (dotted path), or None.
        type: OpenAI's error type ("invalid_request_error", "server_error", ...).
        code: a short machine-readable code, or None.
        headers: extra response headers (``Retry-After`` for a 429).
    """

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        """The response body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error JSON."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class ParsedRequest:
    """One checked completion request.

    Attributes:
        chat: True for /v1/chat/completions (the prompt is rendered with the chat template).
        prompt: the chat messages (``[{"role", "content"}]``, content as text), the prompt
            text, or token ids (completions only).
        max_tokens: the most tokens to generate (None: what the context has room for).
        max_tokens_param: the field that gave it (``max_tokens``, ``max_completion_tokens`` or
            ``max_new_tokens``; None when none did): errors name it.
        temperature, top_p, top_k: sampling settings (temperature 0: greedy).
        seed: the sampling seed, or None.
        stop: stop strings.
        stream: answer with server-sent events.
        include_usage: with ``stream``, send a last chunk with the usage.
        prediction: the predicted output's text (Predicted Outputs), or None.
        references: documents to draft from (extension field), or None.
        response_format: the ``response_format`` object (structured output), or None.
        model: the model name the client asked for (echoed nowhere; the served id is reported).
    """

    chat: bool
    prompt: Any
    max_tokens: int | None = None
    max_tokens_param: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    prediction: str | None = None
    references: tuple[str, ...] | None = None
    response_format: dict | None = None
    model: str | None = None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _bad(param: str, message: str) -> APIError:
    return APIError(message, 400, param)


def _text(value: str, param: str) -> str:
    """``value`` when it is valid Unicode; else a 400 naming ``param``."""
    try:
        return checked_text(value, param)
    except ValueError as exc:
        raise _bad(param, str(exc)) from None


def _text_parts(value, param: str) -> str:
    """A content value (a string, or a list of ``{"type": "text", "text"}`` parts) as one string."""
    if isinstance(value, str):
        return _text(value, param)
    if not isinstance(value, list):
        raise _bad(param, f"{param} must be a string or a list of text parts, got {type(value).__name__}")
    out = []
    for i, part in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _bad(where, f"{where} must be {{\"type\": \"text\", \"text\": str}} (only text parts are supported)")
        extra = set(part) - {"type", "text"}
        if extra:
            raise _bad(f"{where}.{sorted(extra)[0]}", f"{where} has an unsupported field {sorted(extra)[0]!r}")
        out.append(_text(part["text"], f"{where}.text"))
    return "".join(out)


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"{where} must be an object with 'role' and 'content'")
        extra = set(m) - {"role", "content"}  # a participant "name" would change the prompt: refused
        if extra:
            key = sorted(extra)[0]
            raise _bad(f"{where}.{key}", f"{where} has an unsupported field {key!r}")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
        if "content" not in m or m["content"] is None:
            raise _bad(f"{where}.content", f"{where}.content is required")
        # The chat template knows system/user/assistant; OpenAI's "developer" is the system turn.
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text_parts(m["content"], f"{where}.content")})
    return out


def _prompt(value):
    """A completions prompt: a string, token ids, or a list holding exactly one of those."""
    if isinstance(value, list) and len(value) == 1 and (isinstance(value[0], str) or isinstance(value[0], list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise _bad("prompt", "prompt is empty; give some text")
        return _text(value, "prompt")
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return [int(t) for t in value]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise _bad("prompt", f"prompt holds {len(value)} prompts; send one prompt per request")
    raise _bad("prompt", "prompt must be a non-empty string or a non-empty list of token ids")


def _max_tokens(body: dict) -> tuple[int | None, str | None]:
    """The most tokens to generate and the field that gave it (``(None, None)``: none did)."""
    given = {k: body[k] for k in ("max_tokens", "max_completion_tokens", "max_new_tokens")
             if body.get(k) is not None}
    for k, v in given.items():
        if not _is_int(v) or v < 1:
            raise _bad(k, f"{k} must be an integer >= 1, got {v!r}")
    if len(set(given.values())) > 1:
        names = sorted(given)
        raise _bad(names[1], f"{' and '.join(names)} disagree ({', '.join(str(given[k]) for k in names)}); give one")
    return next(iter(given.values()), None), next(iter(given), None)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "stop must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise _bad("stop", f"stop takes at most {MAX_STOPS} strings, got {len(stops)}")
    if any(not s for s in stops):
        raise _bad("stop", "stop strings must not be empty")
    return tuple(_text(s, "stop") for s in stops)


def _prediction(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("prediction", "prediction must be {\"type\": \"content\", \"content\": ...}")
    extra = set(value) - {"type", "content"}
    if extra:
        key = sorted(extra)[0]
        raise _bad(f"prediction.{key}", f"prediction has an unsupported field {key!r}")
    if value.get("type") != "content":
        raise _bad("prediction.type", f"prediction.type must be 'content', got {value.get('type')!r}")
    if "content" not in value:
        raise _bad("prediction.content", "prediction.content is required")
    return _text_parts(value["content"], "prediction.content")


def _references(value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _bad("references", "references must be a non-empty list of document strings")
    for i, r in enumerate(value):
        if not isinstance(r, str) or not r.strip():
            raise _bad(f"references[{i}]", f"references[{i}] must be a non-empty string")
        _text(r, f"references[{i}]")
    return tuple(value)


def parse_request(body: Any, chat: bool) -> ParsedRequest:
    """Check an OpenAI request body and return its settings.

    Args:
        body: the decoded JSON body.
        chat: True for /v1/chat/completions, False for /v1/completions.
    Returns:
        A ``ParsedRequest``.
    Raises:
        APIError: status 400 naming the first bad or unsupported field.
    """
    if not isinstance(body, dict):
        raise _bad(None, "the request body must be a JSON object")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for key in body:
        if key not in allowed:
            raise _bad(key, f"unsupported field {key!r} for {'/v1/chat/completions' if chat else '/v1/completions'}")
    for key, ok in NOOP_FIELDS.items():
        v = body.get(key)
        if v is not None and not any(v == o and type(v) is type(o) or (_is_num(v) and _is_num(o) and v == o)
                                     for o in ok):
            if key == "n":
                raise _bad("n", f"n must be 1 (lookupdec returns one choice per request), got {v!r}")
            raise _bad(key, f"{key}={v!r} is not supported (only {ok[0]!r})")
    if not chat and body.get("suffix") not in (None, ""):
        raise _bad("suffix", "suffix is not supported")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "model must be a string")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", "user must be a string")
    if chat:
        if "messages" not in body:
            raise _bad("messages", "messages is required")
        prompt = _messages(body["messages"])
    else:
        if "prompt" not in body:
            raise _bad("prompt", "prompt is required")
        prompt = _prompt(body["prompt"])
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not _is_num(temperature) or not 0 <= temperature <= 2:
        raise _bad("temperature", f"temperature must be a number in [0, 2], got {temperature!r}")
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise _bad("top_p", f"top_p must be a number in (0, 1], got {top_p!r}")
    top_k = body.get("top_k", 0)
    if top_k is None:
        top_k = 0
    if not _is_int(top_k) or top_k < 0:
        raise _bad("top_k", f"top_k must be an integer >= 0 (0: off), got {top_k!r}")
    seed = body.get("seed")
    try:
        check_seed(seed)  # an integer a generator takes
    except ValueError as exc:
        raise _bad("seed", str(exc)) from None
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", f"stream must be true or false, got {stream!r}")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise _bad("stream_options", "stream_options is only allowed when stream is true")
        if not isinstance(opts, dict):
            raise _bad("stream_options", "stream_options must be an object")
        extra = set(opts) - {"include_usage"}
        if extra:
            key = sorted(extra)[0]
            raise _bad(f"stream_options.{key}", f"stream_options has an unsupported field {key!r}")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _bad("stream_options.include_usage", "stream_options.include_usage must be true or false")
    response_format = body.get("response_format")
    if response_format is not None:
        from lookupdec.constraints.openai_format import ResponseFormatError, from_response_format

        try:
            from_response_format(response_format)
        except ResponseFormatError as exc:
            raise _bad(getattr(exc, "param", "response_format"), str(exc)) from None
    max_tokens, max_tokens_param = _max_tokens(body)
    return ParsedRequest(
        chat=chat, prompt=prompt, max_tokens=max_tokens, max_tokens_param=max_tokens_param,
        temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), seed=None if seed is None else int(seed),
        stop=_stop(body.get("stop")), stream=stream, include_usage=include_usage, prediction=_prediction(body.get("prediction")),
        references=_references(body.get("references")), response_format=response_format, model=model)
