"""An index of a few documents held in memory: what LLMA drafts from.

Reference documents passed with a request (the retrieved passages of RAG, the
article to summarize) are small, so they are indexed on the spot like a
one-shard corpus datastore, with no files: the tokens with a separator after
each document, and their suffix array (SA-IS, ~1 ms for 30,000 tokens). The
result is a :class:`~lookupdec.index.suffix.SuffixIndex`, so references are
looked up exactly as corpus datastores are: the longest suffix of the
context found in any document, and what followed its occurrences.

This module must not import torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from lookupdec.index.manifest import MAX_TOKEN, SEP, ArrayFile, Manifest, ShardEntry
from lookupdec.index.suffix import SuffixIndex, _Shard



def memory_index(documents: Sequence[Sequence[int]]) -> SuffixIndex:
    """A SuffixIndex over token-id documents, built in memory.

    Args:
        documents: token ids of each document (empty documents are skipped).
    Returns:
        A SuffixIndex whose ``path`` is ``<memory>``.
    Raises:
        ValueError: no non-empty document, or a token id outside ``[0, 2^31 - 1]``.

    Example:
        >>> idx = memory_index([[1, 2, 3, 4], [9, 2, 3, 5]])
        >>> r = idx.lookup([7, 2, 3], max_n=2, min_n=1, depth=1)
        >>> r.match_len, sorted(r.tree.tokens.tolist())
        (2, [4, 5])
    """
    from lookupdec import _native

    docs = [np.asarray(d, dtype=np.int64) for d in documents]
    docs = [d for d in docs if d.size]
    if not docs:
        raise ValueError("no document to index: every reference is empty; pass documents with text")
    for i, d in enumerate(docs):
        if d.ndim != 1 or int(d.min()) < 0 or int(d.max()) > MAX_TOKEN:
            raise ValueError(f"document {i} holds token ids outside [0, {MAX_TOKEN}]")
    parts = []
    for d in docs:
        parts.append(d.astype(np.int32))
        parts.append(np.array([SEP], np.int32))
    tokens = np.concatenate(parts)
    sa = _native.suffix_array(tokens)
    n_tok = int(tokens.size) - len(docs)
    nbytes = tokens.size * 4
    entry = ShardEntry(ArrayFile("<memory>", "int32", int(tokens.size), nbytes, ""),
                       ArrayFile("<memory>", str(sa.dtype), int(sa.size), int(sa.nbytes), ""), len(docs), n_tok)
    manifest = Manifest(tokenizer=None, documents=len(docs), tokens=n_tok, skipped=0, shards=(entry,))
    return SuffixIndex(Path("<memory>"), manifest, [_Shard(tokens, sa)])
