"""TextStream: the streamed pieces and the final text equal a full decode, at linear cost."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.stream import TextStream

TEXT = ("Hello 👋🏽 world! 日本語のテキストと emoji 🎉🎉 mixed — «ok» naïve café. " * 3
        + "def f(x):\n    return x ** 2  # ✓\n")


@pytest.fixture(scope="module")
def tok():
    from lookupdec.tokenizer import load_tokenizer

    return load_tokenizer()  # the embedded model's byte-level BPE: multi-byte characters span tokens


def feed(stream, ids, rng):
    """Feed ids in random chunk sizes, as decoding steps commit them; return the kept count."""
    pos = 0
    while pos < len(ids):
        pos = min(len(ids), pos + int(rng.integers(1, 5)))
        keep = stream.update(ids[:pos])
        if keep is not None:
            return keep
    return len(ids)


def test_some_characters_really_span_several_tokens(tok):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    partial = [tok.decode(ids[:k]) for k in range(1, len(ids))]
    assert any(p.endswith("\ufffd") for p in partial)  # the hard case is present


@pytest.mark.parametrize("seed", range(5))
def test_streamed_pieces_and_final_text_equal_a_full_decode(tok, seed):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    pieces = []
    s = TextStream(tok, [], pieces.append)
    assert feed(s, ids, np.random.default_rng(seed)) == len(ids)
    s.finish(ids)
    full = tok.decode(ids, skip_special_tokens=True)
    assert s.text == full and "".join(pieces) == full
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("stop", ["日本語", "🎉", "naïve café. Hello", "return x"])
def test_stop_strings_cut_the_text_and_keep_the_right_tokens(tok, stop):
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    pieces = []
    s = TextStream(tok, ["never there", stop], pieces.append)
    keep = feed(s, ids, np.random.default_rng(0))
    s.finish(ids[:keep])
    full = tok.decode(ids, skip_special_tokens=True)
    assert s.text == full[:full.find(stop)]
    assert "".join(pieces) == s.text  # a stop string's start was never streamed
    # keep is the token that completes the stop string: one fewer does not hold it.
    assert stop in tok.decode(ids[:keep]) and stop not in tok.decode(ids[:keep - 1])


def test_decoding_work_is_linear_in_the_output(tok):
    class Counting:
        decoded = 0

        def decode(self, ids, skip_special_tokens=True):
            Counting.decoded += len(ids)
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode(TEXT * 12, add_special_tokens=False).ids
    s = TextStream(Counting(), ["never there"], lambda _: None)
    for n in range(1, len(ids) + 1):  # one token per step
        s.update(ids[:n])
    s.finish(ids)
    # A full decode per step would touch ~n^2/2 tokens; the window touches a few per step.
    assert Counting.decoded < 10 * len(ids) < len(ids) ** 2 / 20
