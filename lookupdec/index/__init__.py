"""The corpus datastore: a sharded suffix-array index on disk (torch-free).

Build one with :func:`build_index` (corpus files) or
:func:`build_index_from_tokens` (token ids), open it with :func:`open_index`,
and ask :meth:`SuffixIndex.lookup` for the continuations of a context.

Example:
    >>> from lookupdec.index import build_index_from_tokens, open_index
    >>> _ = build_index_from_tokens([[1, 2, 3, 4], [1, 2, 3, 5]], "/tmp/doc.index", overwrite=True)  # doctest: +SKIP
    >>> open_index("/tmp/doc.index").lookup([9, 2, 3], max_n=2).tree.tokens.tolist()             # doctest: +SKIP
    [4, 5]

This package never imports torch.
"""
from lookupdec.index.build import IndexSummary, build_index, build_index_from_tokens
from lookupdec.index.suffix import Lookup, SuffixIndex, open_index
from lookupdec.index.append import append_to_index, compact_index

__all__ = ["build_index", "build_index_from_tokens", "open_index", "SuffixIndex", "Lookup", "IndexSummary", "append_to_index", "compact_index"]
