"""The Decoder's inputs opened and checked: datastores, a history store, reference documents, a
predicted output, the sampling switch, arguments under their earlier names, and the settings a
request or a batch takes (draft budget, seeds, stop strings, callbacks, text that must be valid
Unicode), each refused with its name before any model work."""
from __future__ import annotations

import operator
import os


# The most draft nodes a Decoder may verify a step (the CLI's --draft-budget range too): a step's
# attention bias is (1 + budget) x (cache + 1 + budget) floats.
MAX_DRAFT_BUDGET = 1024


def _integer(value, name: str, low: int, high: int | None = None) -> int:
    """``value`` as an int when it is a whole number from ``low`` to ``high`` (None: no limit; numpy's
    too, never a bool); else ValueError naming ``name``.

    Example:
        >>> _integer(3.0, "n", 1), _integer(0, "n", 0, 4)
        (3, 0)
        >>> _integer("3", "n", 1)
        Traceback (most recent call last):
        ...
        ValueError: n must be an integer >= 1, got '3'
    """
    try:
        ok = (not isinstance(value, bool) and int(value) == value and low <= value
              and (high is None or value <= high))
    except (TypeError, ValueError, OverflowError):  # None, a string, nan or inf
        ok = False
    if not ok:
        span = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


def checked_budget(draft_budget) -> int:
    """``draft_budget`` as an int in 0..``MAX_DRAFT_BUDGET``; else ValueError naming it."""
    return _integer(draft_budget, "draft_budget", 0, MAX_DRAFT_BUDGET)


def check_cost_curve(curve) -> None:
    """TypeError unless ``curve`` is None or a ``CostCurve``."""
    from lookupdec.costs import CostCurve

    if curve is not None and not isinstance(curve, CostCurve):
        raise TypeError(f"cost_curve must be a lookupdec.costs.CostCurve (or None: measured here), got "
                        f"{type(curve).__name__}")


def check_cost_refresh(policy) -> None:
    """ValueError naming it unless ``policy`` is "fit", "measure" or "off" (``Decoder``'s ``cost_refresh``)."""
    if policy not in ("fit", "measure", "off"):
        raise ValueError(f"cost_refresh must be 'fit', 'measure' or 'off', got {policy!r}")


def check_max_new_tokens(max_new_tokens) -> None:
    """ValueError naming it unless ``max_new_tokens`` is an integer >= 0."""
    _integer(max_new_tokens, "max_new_tokens", 0)


def check_callback(fn, name: str, takes: str) -> None:
    """TypeError naming ``name`` unless ``fn`` is None or callable (``takes``: what it is called with)."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function taking {takes}, got {type(fn).__name__}")


def checked_stops(stop) -> list[str]:
    """``stop`` (None, a string or strings) as a list of valid strings; else TypeError / ValueError naming it."""
    if stop is not None and not isinstance(stop, (str, list, tuple, set, frozenset)):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    for i, x in enumerate(stops):
        if not isinstance(x, str):
            raise TypeError(f"stop strings must be strings; stop[{i}] is a {type(x).__name__}")
        checked_text(x, f"stop[{i}]")
    return stops


def checked_batch(prompts, batch_size, **per_prompt) -> list:
    """``generate_batch``'s prompts as a list, checked with its batch size and per-prompt lists (None or one
    entry per prompt); else TypeError / ValueError naming the argument."""
    _integer(batch_size, "batch_size", 1)
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of prompts (each as generate takes one), got "
                        f"{type(prompts).__name__}; for one prompt call generate")
    for name, per in per_prompt.items():
        if per is not None and not isinstance(per, (list, tuple)):
            raise TypeError(f"{name} must be a list with one entry per prompt, got {type(per).__name__}")
        if per is not None and len(per) != len(prompts):
            raise ValueError(f"{name} needs one entry per prompt: {len(per)} for {len(prompts)} prompts")
    return list(prompts)


def nth_seed(seed, i: int) -> int:
    """Prompt ``i``'s seed in a batch: ``seed + i``, wrapped into the seeds a generator takes."""
    check_seed(seed)
    s = int(seed) + i
    return s - (1 << 64) if s > SEED_RANGE[1] else s


def check_decodable(loaded) -> None:
    """Refuse a model whose layers keep a state that verification cannot roll back (``LoadedModel``).

    Raises:
        ModelLoadError: naming the model, why, and what to use instead.
    """
    from lookupdec.errors import ModelLoadError
    from lookupdec.kvcache import unsupported_attention

    reason = unsupported_attention(loaded.model.config)
    if reason:
        raise ModelLoadError(f"model {loaded.name!r} cannot be decoded with lookupdec: {reason}, so a rejected draft "
                             "cannot be undone; use a model with (full or sliding-window) attention layers")


def open_history_arg(history, tokenizer, budget: int | None):
    """``history`` (None, a directory, or an open HistoryStore) as an open store."""
    budget = None if budget is None else _integer(budget, "history_budget", 1)
    if history is None:
        return None
    from lookupdec.index.history import DEFAULT_BUDGET_TOKENS, HistoryStore, open_history

    if isinstance(history, HistoryStore):
        return history
    return open_history(history, tokenizer=tokenizer, budget_tokens=DEFAULT_BUDGET_TOKENS if budget is None else budget)


def renamed_arguments(renamed: dict, indexes, hf_kernels: bool):
    """``indexes`` and ``hf_kernels`` given under their earlier names (``index=``, ``fast_kernels=``).

    The old names still work, with a ``DeprecationWarning``; any other unknown keyword is a TypeError.
    """
    import warnings

    for old, new in (("index", "indexes"), ("fast_kernels", "hf_kernels")):
        if old not in renamed:
            continue
        value = renamed.pop(old)
        if old == "fast_kernels":
            check_flag(value, old)
        warnings.warn(f"Decoder({old}=...) is renamed {new}=" + (" (the inverse)" if old == "fast_kernels" else ""),
                      DeprecationWarning, stacklevel=3)
        if old == "index":
            if indexes is not None:
                raise TypeError("give indexes= (index= is its earlier name), not both")
            indexes = value
        else:
            hf_kernels = not value
    if renamed:
        raise TypeError(f"Decoder() got an unexpected keyword argument {next(iter(renamed))!r}")
    return indexes, hf_kernels


def open_indexes(index) -> list:
    """``index`` (None, a path, a SuffixIndex, or a list of them) as a list of opened indexes."""
    if index is None:
        return []
    from lookupdec.index import SuffixIndex, open_index

    items = [index] if isinstance(index, (str, bytes)) or not isinstance(index, (list, tuple)) else list(index)
    for i in items:
        if not isinstance(i, (str, bytes, os.PathLike, SuffixIndex)):
            raise TypeError(f"indexes takes index directories (paths), open SuffixIndex objects or a list of them, "
                            f"got {type(i).__name__}")
    return [i if isinstance(i, SuffixIndex) else open_index(i) for i in items]


def unicode_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (a lone surrogate, and where), or None when it is.

    Example:
        >>> unicode_problem("caf\\udce9"), unicode_problem("café")
        ('surrogates not allowed at character 3', None)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{exc.reason} at character {exc.start}"
    return None


def checked_text(text: str, what: str) -> str:
    """``text`` when it is valid Unicode (what a tokenizer takes); else ValueError naming ``what``.

    A string decoded with ``surrogateescape``, or JSON's ``"\\udcff"``, holds lone surrogates,
    which no tokenizer encodes.

    Example:
        >>> checked_text("caf\\udce9", "prompt")
        Traceback (most recent call last):
        ...
        ValueError: prompt is not valid Unicode (surrogates not allowed at character 3); send UTF-8 text
    """
    problem = unicode_problem(text)
    if problem:
        raise ValueError(f"{what} is not valid Unicode ({problem}); send UTF-8 text")
    return text


def reference_ids(tokenizer, references) -> list[list[int]] | None:
    """The token ids of each reference document, checked (None stays None).

    Raises:
        TypeError, ValueError: one string instead of a list, a non-string, an empty document or list.
    """
    if references is None:
        return None
    if isinstance(references, str):
        raise TypeError("references must be a list of documents (strings), not one string; wrap it in a list")
    out = []
    for i, r in enumerate(references):
        if not isinstance(r, str):
            raise TypeError(f"references[{i}] is a {type(r).__name__}; references must be strings")
        if not r.strip():
            raise ValueError(f"references[{i}] is empty; pass documents with text, or no references")
        out.append(list(tokenizer(checked_text(r, f"references[{i}]"), add_special_tokens=False)["input_ids"]))
    if not out:
        raise ValueError("references is an empty list; pass at least one document, or None")
    return out


def prediction_ids(tokenizer, prediction) -> list[int] | None:
    """The token ids of a predicted output (None for None or a blank one).

    Raises:
        TypeError: a prediction that is not a string.
    """
    if prediction is None:
        return None
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a string, got {type(prediction).__name__}")
    if not prediction.strip():
        return None
    return list(tokenizer(checked_text(prediction, "prediction"), add_special_tokens=False)["input_ids"])


# The seeds a torch generator takes.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


def check_seed(seed) -> None:
    """Raise ValueError, naming the seed, unless it is None or an integer a generator takes.

    Example:
        >>> check_seed(2 ** 64)
        Traceback (most recent call last):
        ...
        ValueError: seed must be an integer from -2**63 to 2**64 - 1, got 18446744073709551616
    """
    if seed is None:
        return
    try:
        value = None if isinstance(seed, bool) else operator.index(seed)  # numpy integers too
    except TypeError:
        value = None
    if value is None or not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ValueError(f"seed must be an integer from -2**63 to 2**64 - 1, got {seed!r}")


def _number(value, name: str, integral: bool = False):
    """``value`` unchanged if it is a real number (an integer where ``integral``; numpy's too, never a bool or a
    string), else a TypeError naming ``name``."""
    import numbers

    kind = numbers.Integral if integral else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {'an integer' if integral else 'a number'}, got {value!r}")
    return value


def sampling_params(temperature, top_p, top_k, do_sample: bool | None):
    """The request's ``SamplingParams``, with transformers' ``do_sample`` switch (see ``Decoder.generate``).

    Example:
        >>> [sampling_params(0.7, 1.0, 0, s).temperature for s in (None, False, True)], \\
        ...     sampling_params(0.0, 1.0, 0, True).temperature
        ([0.7, 0.0, 0.7], 1.0)
        >>> sampling_params("0.7", 1.0, 0, None)
        Traceback (most recent call last):
        ...
        TypeError: temperature must be a number, got '0.7'
    """
    from lookupdec.sampling import SamplingParams

    temperature = float(_number(temperature, "temperature"))
    if do_sample is not None and not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True, False or None, got {do_sample!r}")
    if do_sample is not None:
        temperature = (temperature or 1.0) if do_sample else 0.0
    return SamplingParams(temperature, float(_number(top_p, "top_p")), int(_number(top_k, "top_k", integral=True)))


def check_flag(value, name: str, none_ok: bool = False) -> None:
    """Raise TypeError, naming the setting, unless ``value`` is True or False (or None where ``none_ok``):
    a string such as "no" would otherwise count as true."""
    if not (isinstance(value, bool) or (none_ok and value is None)):
        raise TypeError(f"{name} must be True or False{' or None' if none_ok else ''}, got {value!r}")


def checked_prompt(prompt_ids: list[int], vocab_size: int, max_context: int, max_new_tokens: int) -> list[int]:
    """``prompt_ids`` if every id is in the vocabulary and ``max_new_tokens`` more fit the context.

    Raises:
        PromptError: a token id outside ``[0, vocab_size)``.
        ContextTooLongError (a PromptError): naming both lengths and the largest max_new_tokens that fits.
    """
    from lookupdec.errors import ContextTooLongError, PromptError

    bad = next(((i, t) for i, t in enumerate(prompt_ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise PromptError(f"prompt token id {bad[1]} (position {bad[0]}) is outside the model's vocabulary "
                         f"[0, {vocab_size}); token-id prompts must come from this model's tokenizer")
    if len(prompt_ids) + max_new_tokens > max_context:
        raise ContextTooLongError(len(prompt_ids), max_new_tokens, max_context)
    return prompt_ids
