"""The grammar engine's view of a tokenizer (llguidance ``LLTokenizer``), built once per tokenizer.

Why llguidance (measured with ``benchmarks/grammar_engines.py`` on this CPU,
SmolLM2's 49152-token vocabulary): its token mask took a median of 0.02-0.03 ms
(p90 under 0.1 ms) per step on a JSON Schema walk, rollback and copy of a
matcher state are O(1)-ish (a few microseconds), and ``validate_tokens``
checks a whole drafted path without changing the state, which is what pruning a
draft tree needs. xgrammar's masks were faster still (0.005-0.007 ms) but it has
no Lark grammars and pulls in triton and a TVM runtime; outlines-core compiles
only regular expressions (JSON Schema through a regex, no recursive grammars).
llguidance covers JSON Schema, regex and Lark/GBNF in one small wheel.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


class _TokenList:
    """The object llguidance's ``TokenizerWrapper`` reads: token bytes per id and an encoder."""

    def __init__(self, tokenizer: Any, n_vocab: int, eos: int) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        size = backend.get_vocab_size(with_added_tokens=True)
        special = set()
        for tid, added in getattr(backend, "get_added_tokens_decoder", lambda: {})().items():
            if getattr(added, "special", False):
                special.add(int(tid))
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = sorted(special)
        toks = []
        for i in range(min(size, n_vocab)):
            toks.append(b"" if i in special else backend.decode([i], skip_special_tokens=False).encode("utf-8"))
        self.tokens = toks
        self._backend = backend

    def __call__(self, s) -> list[int]:
        text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        return self._backend.encode(text, add_special_tokens=False).ids


def ll_tokenizer(tokenizer: Any, n_vocab: int, eos_ids: Sequence[int]):
    """The ``llguidance.LLTokenizer`` for ``tokenizer``, cached per tokenizer object.

    A byte-level BPE/SentencePiece ``tokenizer.json`` is read by llguidance
    itself; other fast tokenizers (e.g. word-level ones) fall back to each
    token's decoded text.

    Args:
        tokenizer: a ``transformers`` fast tokenizer or a ``tokenizers.Tokenizer``.
        n_vocab: the model's vocabulary size (mask length; ids without text are never allowed).
        eos_ids: the model's end-of-sequence ids (allowed when the grammar is complete).
    Returns:
        The ``LLTokenizer``.
    Raises:
        ConstraintError: llguidance is not installed.
    """
    from lookupdec.constraints.spec import ConstraintError

    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - an install problem
        raise ConstraintError("structured output needs the llguidance package: pip install 'lookupdec[grammar]'") from exc
    eos = [int(e) for e in eos_ids]
    key = (int(n_vocab), tuple(eos))
    try:
        per = _CACHE.setdefault(tokenizer, {})
    except TypeError:
        per = {}
    if key in per:
        return per[key]
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    lltok = None
    for spec in _json_specs(backend):
        try:
            candidate = llguidance.LLTokenizer(spec, n_vocab=int(n_vocab), eos_token=eos or None)
        except Exception:
            continue
        if reads_like(candidate, backend, int(n_vocab)):
            lltok = candidate
            break
    if lltok is None:
        wrapper = llguidance.TokenizerWrapper(_TokenList(tokenizer, int(n_vocab), eos[0] if eos else 0))
        lltok = llguidance.LLTokenizer(wrapper, n_vocab=int(n_vocab), eos_token=eos or None)
    per[key] = lltok
    return lltok


def _json_specs(backend: Any) -> list[str]:
    """The tokenizer's JSON for llguidance: as it is, then (for a byte-level BPE whose decoder is not
    plain ``ByteLevel``) with that decoder, which is how llguidance knows to map ``Ġ`` back to a space.

    transformers 5.17 (5.24 no longer) converted a GGUF's byte-level tokenizer with a SentencePiece-style decoder
    chain (byte fallback, fuse, replace ``▁``, then byte level); the text it decodes is right, but
    llguidance, reading that chain, took every ``Ġ`` for the two bytes ``c4 a0``.
    """
    import json
    from copy import copy

    try:
        b = copy(backend)
        b.no_padding()
        b.no_truncation()
        text = b.to_str()
    except Exception:
        return []
    specs = [text]
    d = json.loads(text)
    pre = json.dumps(d.get("pre_tokenizer"))
    if '"ByteLevel"' in pre and (d.get("decoder") or {}).get("type") != "ByteLevel":
        d["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        specs.append(json.dumps(d))
    return specs


def reads_like(lltok: Any, backend: Any, n_vocab: int, samples: int = 1500) -> bool:
    """Whether llguidance's bytes for a spread of tokens are the text the tokenizer itself decodes.

    Each token is decoded after an anchor token and the anchor's text removed, so a leading space
    that a decoder strips at the start of a text (SentencePiece's ``▁``) is kept. Tokens that are
    special, empty or part of a multi-byte character (decoded as U+FFFD) are not compared.
    """
    size = min(backend.get_vocab_size(with_added_tokens=True), n_vocab)
    special = {int(t) for t, a in getattr(backend, "get_added_tokens_decoder", lambda: {})().items()
               if getattr(a, "special", False)}
    anchor_ids = backend.encode("a", add_special_tokens=False).ids
    if len(anchor_ids) != 1:
        return True  # nothing to compare against: trust the file
    anchor = anchor_ids[0]
    head = backend.decode([anchor], skip_special_tokens=False)
    compared = 0
    for i in range(0, size, max(1, size // samples)):
        if i in special:
            continue
        text = backend.decode([anchor, i], skip_special_tokens=False)
        if not text.startswith(head) or "\ufffd" in text:
            continue
        text = text[len(head):]
        if not text:
            continue
        compared += 1
        if lltok.decode_bytes([i]) != text.encode("utf-8"):
            return False
    return compared > 0
