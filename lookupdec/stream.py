"""Text of a generation as it grows: incremental decoding, stop strings, streaming.

Decoding the whole output again at every step costs O(n) per step, O(n^2) per
generation. ``TextStream`` decodes only a short window instead, the way
incremental detokenizers do: ``decode(tokens[prefix:])`` minus
``decode(tokens[prefix:read])`` is the text the tokens after ``read`` add,
decoded with a little left context (``prefix``) so that tokenizers whose
decoding depends on the previous token (leading spaces, byte pieces) give
the same characters as a full decode. While the new text ends in an
incomplete UTF-8 character (``\\ufffd``) nothing is committed and the window
grows until the character completes.

Stop strings are searched only in the text added since the last step (plus
the longest stop string's length of context before it). The final text is one
full decode of the kept tokens, so it equals ``tokenizer.decode`` exactly; the
pieces streamed through ``on_text`` are the committed text, held back while it
ends in what may be the start of a stop string.
"""
from __future__ import annotations

from typing import Callable, Sequence


class TextStream:
    """Text, stop strings and streaming for one generation.

    Args:
        tokenizer: has ``decode(ids, skip_special_tokens=True)``.
        stop: stop strings (empty ones are ignored).
        on_text: called with each new piece of final text, or None.

    Attributes:
        active: whether ``update`` needs calling at all (stop strings or streaming).
        text: the text so far (after ``finish``: exactly the decode of the kept tokens).

    Example:
        >>> class Chars:
        ...     def decode(self, ids, skip_special_tokens=True): return "".join(chr(i) for i in ids)
        >>> pieces = []
        >>> s = TextStream(Chars(), ["!"], pieces.append)
        >>> s.update([104, 105]), s.update([104, 105, 33, 120])
        (None, 3)
        >>> s.finish([104, 105, 33]); s.text, "".join(pieces)
        ('hi', 'hi')
    """

    def __init__(self, tokenizer, stop: Sequence[str], on_text: Callable[[str], None] | None) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.on_text = on_text
        self.active = bool(self.stop) or on_text is not None
        self.text = ""          # committed text: decode(tokens[:read])
        self._prefix = 0        # first token of the decoding window
        self._read = 0          # tokens whose text is committed
        self._checked = 0       # characters of text already searched for stop strings
        self._sent = 0          # characters of text already streamed
        self._stopped = False
        self._longest_stop = max((len(s) for s in self.stop), default=0)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def update(self, token_ids: list[int]) -> int | None:
        """Take the tokens so far; if their text now holds a stop string, return how many
        tokens to keep (through the one that completes it), else None."""
        if self._stopped or len(token_ids) <= self._read:
            return None
        window = self._decode(token_ids[self._prefix:])
        head = self._decode(token_ids[self._prefix:self._read])
        if len(window) <= len(head) or window.endswith("\ufffd"):
            return None  # an incomplete character: wait for the tokens that complete it
        self.text += window[len(head):]
        first_new = self._read
        self._prefix, self._read = self._read, len(token_ids)
        if self.stop:
            start = max(0, self._checked - self._longest_stop + 1)
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            self._checked = len(self.text)
            if hits:
                cut, s = min(hits)
                self.text = self.text[:cut]
                self._stopped = True
                # The token that completes the stop string (tokens before this step held none).
                for k in range(first_new + 1, len(token_ids) + 1):
                    if s in self._decode(token_ids[:k]):
                        return k
                return len(token_ids)
        self._emit(final=False)
        return None

    def _emit(self, final: bool) -> None:
        if self.on_text is None:
            return
        end = len(self.text)
        if not final:
            # Hold back what may be the start of a stop string.
            for s in self.stop:
                for k in range(min(len(s) - 1, end - self._sent), 0, -1):
                    if self.text[end - k:end] == s[:k]:
                        end -= k
                        break
        if end > self._sent:
            self.on_text(self.text[self._sent:end])
            self._sent = end

    def finish(self, token_ids: Sequence[int]) -> None:
        """The generation ended with ``token_ids`` kept: the final text, the rest streamed."""
        full = self._decode(list(token_ids))
        if self._stopped:
            cut = min((i for s in self.stop if (i := full.find(s)) >= 0), default=len(full))
            full = full[:cut]
        self.text = full
        self._emit(final=True)
