"""OpenAI's ``response_format`` request field as a ``grammar=`` spec (the server's structured output).

Accepted shapes (as OpenAI's Chat Completions API defines them):

- ``{"type": "text"}``: no constraint;
- ``{"type": "json_object"}``: one JSON object (any keys);
- ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``:
  one JSON value valid against the schema. ``strict`` is accepted either way: the
  output always follows the schema exactly.
"""
from __future__ import annotations

from typing import Any

from lookupdec.constraints.spec import ConstraintError, JsonSchema

_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


class ResponseFormatError(ConstraintError):
    """A malformed ``response_format``; ``param`` names the offending field (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def from_response_format(value: Any) -> JsonSchema | None:
    """The ``grammar=`` spec a ``response_format`` asks for (None: plain text).

    Args:
        value: the request's ``response_format`` (a dict), or None.
    Returns:
        A ``JsonSchema``, or None for ``{"type": "text"}`` / None.
    Raises:
        ResponseFormatError: a shape OpenAI does not define, naming the field.

    Example:
        >>> from_response_format({"type": "json_object"})
        JsonSchema(schema={'type': 'object'})
        >>> from_response_format({"type": "text"}) is None
        True
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ResponseFormatError(f"response_format must be an object, got {type(value).__name__}",
                                  "response_format")
    kind = value.get("type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise ResponseFormatError(f"response_format has an unknown field {sorted(extra)[0]!r}",
                                  f"response_format.{sorted(extra)[0]}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonSchema({"type": "object"})
    if kind != "json_schema":
        raise ResponseFormatError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                                  "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ResponseFormatError("response_format.json_schema must be an object with a 'schema'",
                                  "response_format.json_schema")
    unknown = set(spec) - _JSON_SCHEMA_KEYS
    if unknown:
        raise ResponseFormatError(f"response_format.json_schema has an unknown field {sorted(unknown)[0]!r}",
                                  f"response_format.json_schema.{sorted(unknown)[0]}")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ResponseFormatError("response_format.json_schema.schema must be a JSON Schema object",
                                  "response_format.json_schema.schema")
    if "strict" in spec and not isinstance(spec["strict"], bool):
        raise ResponseFormatError("response_format.json_schema.strict must be true or false",
                                  "response_format.json_schema.strict")
    return JsonSchema(schema or {})
