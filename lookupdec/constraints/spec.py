"""What a user may pass as ``grammar=``, and its translation into the engine's grammar text.

Accepted forms:

- a ``dict`` (a JSON Schema), or ``JsonSchema(schema)`` (a dict or JSON text);
- ``Regex(pattern)``: the whole output matches the regular expression;
- ``Lark(text)``: a Lark-style grammar (llguidance's dialect; a GBNF/EBNF text
  with ``::=`` rules is converted first);
- a ``list``/``tuple`` of strings, or ``Choice(options)``: exactly one of them.

A bare ``str`` is refused (a regex and a grammar are both strings): wrap it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from lookupdec.errors import LookupdecError


#: llguidance's JSON layout used unless a schema sets its own "x-guidance".
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(LookupdecError, ValueError):
    """A ``grammar=`` argument that is malformed or that the grammar engine cannot compile."""


@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid against ``schema`` (a dict, or its JSON text)."""

    schema: Any


@dataclass(frozen=True)
class Regex:
    """Output matches the regular expression ``pattern`` as a whole (Rust ``regex`` syntax)."""

    pattern: str


@dataclass(frozen=True)
class Lark:
    """Output is derived from the grammar ``text``'s ``start`` rule (Lark syntax, or GBNF with ``::=``)."""

    text: str


@dataclass(frozen=True)
class Choice:
    """Output is exactly one of ``options``."""

    options: tuple[str, ...]

    def __init__(self, options: Sequence[str]) -> None:
        object.__setattr__(self, "options", tuple(options))


@dataclass(frozen=True)
class GrammarText:
    """A user spec translated for the engine.

    Attributes:
        kind: "json_schema", "regex", "lark" or "choice".
        grammar: llguidance's grammar text (its JSON grammar format).
        schema: the JSON Schema dict for kind "json_schema" (else None).
    """

    kind: str
    grammar: str
    schema: dict | None = None


def as_spec(grammar: Any) -> JsonSchema | Regex | Lark | Choice:
    """Normalise a ``grammar=`` argument to one of the spec classes.

    Args:
        grammar: a dict, a list/tuple of strings, or a spec instance.
    Returns:
        The spec.
    Raises:
        ConstraintError: a bare string, an empty or non-string choice list, another type.

    Example:
        >>> as_spec(["yes", "no"])
        Choice(options=('yes', 'no'))
    """
    if isinstance(grammar, (JsonSchema, Regex, Lark, Choice)):
        spec = grammar
    elif isinstance(grammar, dict):
        spec = JsonSchema(grammar)
    elif isinstance(grammar, (list, tuple)):
        spec = Choice(grammar)
    elif isinstance(grammar, str):
        raise ConstraintError("grammar= got a bare string, which could be a regex or a grammar: pass "
                              "lookupdec.Regex(pattern), lookupdec.Lark(text) or lookupdec.JsonSchema(text)")
    else:
        raise ConstraintError(f"grammar= takes a JSON Schema dict, a list of choices, or JsonSchema/Regex/Lark/"
                              f"Choice; got {type(grammar).__name__}")
    if isinstance(spec, Choice):
        if not spec.options or not all(isinstance(o, str) and o for o in spec.options):
            raise ConstraintError(f"a choice list needs at least one non-empty string option, got {list(spec.options)!r}")
    for attr in ("pattern", "text"):
        if isinstance(getattr(spec, attr, ""), str) is False:
            raise ConstraintError(f"{type(spec).__name__}.{attr} must be a string")
    return spec


def grammar_text(grammar: Any) -> GrammarText:
    """Translate a ``grammar=`` argument into llguidance's grammar text (no tokenizer needed).

    Args:
        grammar: as for :func:`as_spec`.
    Returns:
        The ``GrammarText``.
    Raises:
        ConstraintError: as :func:`as_spec`; JSON text that does not parse; a schema,
            regex or grammar the engine rejects (its message included); llguidance missing.
    """
    spec = as_spec(grammar)
    try:
        from llguidance import LLMatcher
    except ImportError as exc:  # pragma: no cover - an install problem
        raise ConstraintError("structured output needs the llguidance package: pip install 'lookupdec[grammar]'") from exc
    schema = None
    try:
        if isinstance(spec, JsonSchema):
            schema = spec.schema
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as exc:
                    raise ConstraintError(f"the JSON Schema is not valid JSON: {exc}") from exc
            if not isinstance(schema, dict):
                raise ConstraintError(f"a JSON Schema must be a JSON object, got {type(schema).__name__}")
            # One canonical layout (", " and ": ", no other whitespace): a model cannot wander
            # into endless whitespace, and drafts copied from JSON text match it. A schema's own
            # "x-guidance" settings win.
            kind, text = "json_schema", LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_LAYOUT)
        elif isinstance(spec, Regex):
            kind, text = "regex", LLMatcher.grammar_from_regex(spec.pattern)
        elif isinstance(spec, Lark):
            src = spec.text
            if "::=" in src:
                from llguidance import gbnf_to_lark

                src = gbnf_to_lark(src)
            kind, text = "lark", LLMatcher.grammar_from_lark(src)
        else:
            alts = " | ".join(json.dumps(o) for o in spec.options)
            kind, text = "choice", LLMatcher.grammar_from_lark(f"start: {alts}\n")
    except ConstraintError:
        raise
    except Exception as exc:  # llguidance raises ValueError / RuntimeError with its own message
        raise ConstraintError(f"cannot compile the {type(spec).__name__} constraint: {exc}") from exc
    problem = LLMatcher.validate_grammar(text)
    if problem:
        raise ConstraintError(f"cannot compile the {type(spec).__name__} constraint: {problem.strip()}; fix the "
                              "grammar (llguidance syntax: https://github.com/guidance-ai/llguidance)")
    return GrammarText(kind, text, schema)
