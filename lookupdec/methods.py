"""The drafting methods by name, and how a drafter is made for one request.

A method is a drafter class (or a function returning a drafter), imported on
first use. Its constructor takes
the request's inputs it uses as keyword arguments:

- user inputs: ``references`` (token-id lists of documents passed with the
  request), ``prediction`` (token ids of the request's predicted output), ``indexes`` (opened corpus datastores), ``history`` (a store of
  earlier outputs);
- decoder state: ``calibration`` (the shared acceptance rates), ``cost``
  (a callable returning the verifier's cost curve), ``vocab_size``,
  ``draft_model`` (the small-LM fallback's ``DraftModel``, or None), ``state``
  (the decoder's ``DrafterState``: what drafting keeps across its requests).

A user input given to a method whose constructor does not take it is an
error, never silently ignored.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

# Drafting methods by name -> "module:Class".
METHODS: dict[str, str] = {
    "ar": "lookupdec.drafters.base:NoDrafter",
    "pld": "lookupdec.drafters.pld:PLDDrafter",
    "llma": "lookupdec.drafters.single:llma_method",
    "rest": "lookupdec.drafters.single:rest_method",
    "history": "lookupdec.drafters.single:history_method",
    "recycle": "lookupdec.drafters.single:recycle_method",
    "lookahead": "lookupdec.drafters.single:lookahead_method",
    "auto": "lookupdec.drafters.auto:AutoDrafter",
    "draft": "lookupdec.drafters.small_lm:draft_method",
}

# Inputs a user passes with a request, and what to call them in messages.
USER_INPUTS = {"references": "references", "prediction": "a prediction", "indexes": "an index",
               "history": "a history store"}


def method_class(method: str):
    """The drafter class registered as ``method``.

    Raises:
        ValueError: an unknown method name.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(METHODS))}")
    module, _, cls_name = METHODS[method].partition(":")
    return getattr(importlib.import_module(module), cls_name)


def method_inputs(method: str) -> set[str]:
    """The user inputs (``USER_INPUTS`` keys) the method's drafter takes."""
    params = inspect.signature(method_class(method)).parameters
    return {k for k in USER_INPUTS if k in params}


def method_prices(method: str) -> bool:
    """Whether the method's drafter sizes its drafts with the cost curve (takes ``cost``).

    Example:
        >>> method_prices("auto"), method_prices("pld"), method_prices("ar")
        (True, False, False)
    """
    return "cost" in inspect.signature(method_class(method)).parameters


def make_drafter(method: str, **context: Any):
    """Instantiate the drafter registered as ``method`` for one request.

    Args:
        method: a ``METHODS`` key.
        **context: user inputs and decoder state (see the module docstring);
            None or empty values count as not given.
    Returns:
        The drafter.
    Raises:
        ValueError: an unknown method, or a user input the method does not use
            (the message names the methods that do).

    Example:
        >>> make_drafter("pld", calibration=None).name
        'pld'
        >>> make_drafter("pld", references=[[1, 2]])
        Traceback (most recent call last):
        ...
        ValueError: method 'pld' does not use references; use one of: auto, llma
    """
    cls = method_class(method)
    params = inspect.signature(cls).parameters
    for key, what in USER_INPUTS.items():
        if context.get(key) and key not in params:
            users = sorted(m for m in METHODS if key in inspect.signature(method_class(m)).parameters)
            raise ValueError(f"method {method!r} does not use {what}; use one of: {', '.join(users) or 'none'}")
    return cls(**{k: v for k, v in context.items() if k in params and v is not None})
