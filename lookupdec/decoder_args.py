"""The Decoder's inputs opened and checked: datastores, a history store, reference documents, and
arguments under their earlier names."""
from __future__ import annotations


def open_history_arg(history, tokenizer, budget: int | None):
    """``history`` (None, a directory, or an open HistoryStore) as an open store."""
    if history is None:
        return None
    from lookupdec.index.history import DEFAULT_BUDGET_TOKENS, HistoryStore, open_history

    if isinstance(history, HistoryStore):
        return history
    return open_history(history, tokenizer=tokenizer, budget_tokens=budget or DEFAULT_BUDGET_TOKENS)


def renamed_arguments(renamed: dict, indexes, hf_kernels: bool):
    """``indexes`` and ``hf_kernels`` given under their earlier names (``index=``, ``fast_kernels=``).

    The old names still work, with a ``DeprecationWarning``; any other unknown keyword is a TypeError.
    """
    import warnings

    for old, new in (("index", "indexes"), ("fast_kernels", "hf_kernels")):
        if old not in renamed:
            continue
        value = renamed.pop(old)
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
    return [i if isinstance(i, SuffixIndex) else open_index(i) for i in items]


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
        out.append(list(tokenizer(r, add_special_tokens=False)["input_ids"]))
    if not out:
        raise ValueError("references is an empty list; pass at least one document, or None")
    return out
