"""Structured output: constraints (JSON Schema, regex, Lark/GBNF grammar, choice list) on generation.

``Constraint`` holds one request's grammar state (llguidance underneath, see
``engine``); the decoder's ``Sequence`` prunes drafts with it, joins its forced
tokens to the draft and masks every verified row with the state of the path
leading to it, so constrained output equals constrained ``ar``.
"""
from lookupdec.constraints.constraint import Constraint, Joined, constrain_draft, extend_best_leaf, join_forced
from lookupdec.constraints.openai_format import ResponseFormatError, from_response_format
from lookupdec.constraints.spec import (Choice, ConstraintError, GrammarText, JsonSchema, Lark, Regex, as_spec,
                                        grammar_text)

__all__ = ["Choice", "Constraint", "ConstraintError", "GrammarText", "Joined", "JsonSchema", "constrain_draft",
           "extend_best_leaf", "Lark", "Regex",
           "as_spec", "from_response_format", "grammar_text", "join_forced", "ResponseFormatError"]
