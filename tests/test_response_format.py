"""OpenAI's response_format mapped to grammar specs: every shape, and each bad one naming its field."""
from __future__ import annotations

import pytest

from lookupdec.constraints import JsonSchema, grammar_text
from lookupdec.constraints.openai_format import ResponseFormatError, from_response_format

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_shapes():
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == JsonSchema({"type": "object"})
    got = from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}})
    assert got == JsonSchema(SCHEMA)
    assert grammar_text(got).schema == SCHEMA  # the engine compiles it


@pytest.mark.parametrize("value,param", [
    ("json", "response_format"),
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": []}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}}, "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "format": 1}}, "response_format.json_schema.format"),
    ({"type": "text", "extra": 1}, "response_format.extra"),
])
def test_bad_shapes_name_the_field(value, param):
    with pytest.raises(ResponseFormatError) as err:
        from_response_format(value)
    assert err.value.param == param and isinstance(err.value, ValueError)
