"""OpenAI response bodies and stream chunks built from a finished generation.

Example:
    >>> usage_of(type("R", (), {"prompt_tokens": 5, "new_tokens": 3, "accepted_by_source": {"prediction": 2},
    ...                         "cached_tokens": 4})(), 4)  # doctest: +NORMALIZE_WHITESPACE
    {'prompt_tokens': 5, 'completion_tokens': 3, 'total_tokens': 8, 'prompt_tokens_details': {'cached_tokens': 4},
     'completion_tokens_details': {'accepted_prediction_tokens': 2, 'rejected_prediction_tokens': 2}}
"""
from __future__ import annotations

import json


def finish_reason(stop_reason: str) -> str:
    """OpenAI's ``finish_reason``: "length" when max_tokens ran out, else "stop" (EOS or a stop string)."""
    return "length" if stop_reason == "length" else "stop"


def usage_of(result, prediction_tokens: int) -> dict:
    """The ``usage`` object.

    ``accepted_prediction_tokens`` counts the draft tokens accepted from the prediction;
    ``rejected_prediction_tokens`` the prediction's other tokens (its length minus the accepted);
    ``cached_tokens`` the prompt tokens whose rows an earlier request left (``lookupdec.prefix_cache``).
    """
    accepted = int(result.accepted_by_source.get("prediction", 0))
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.new_tokens,
            "total_tokens": result.prompt_tokens + result.new_tokens,
            "prompt_tokens_details": {"cached_tokens": int(result.cached_tokens)},
            "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": max(prediction_tokens - accepted, 0)}}


class Shapes:
    """Bodies for one request: chat (``chat.completion``) or text (``text_completion``).

    Args:
        chat: which endpoint.
        id: the job's id.
        created: unix time.
        model: the served model id.
    """

    def __init__(self, chat: bool, id: str, created: int, model: str) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + id
        self.created = created
        self.model = model

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, result, prediction_tokens: int) -> dict:
        """The non-streamed response."""
        fr = finish_reason(result.stop_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                      "finish_reason": fr}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": fr}
            body = self._head("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage_of(result, prediction_tokens)
        return body

    def chunk(self, text: str | None = None, finish: str | None = None, first: bool = False,
              usage: dict | None = None, with_usage: bool = False) -> str:
        """One server-sent event: a text delta, the finish reason, or (``usage``) the usage chunk."""
        if self.chat:
            body = self._head("chat.completion.chunk")
            if usage is not None:
                body["choices"] = []
            else:
                delta = {}
                if first:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            body = self._head("text_completion")
            body["choices"] = [] if usage is not None else [
                {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        if with_usage or usage is not None:
            body["usage"] = usage
        return sse(body)


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
