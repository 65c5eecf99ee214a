"""The grammar engine reads a byte-level tokenizer's token bytes right, whatever decoder chain its
JSON declares. transformers 5.17 converted the embedded GGUF's tokenizer with a SentencePiece-style
chain (byte fallback, fuse, replace "▁", byte level): the text it decodes is right, but llguidance,
reading that chain as it stood, took every "Ġ" for the bytes c4 a0, so a grammar that needs a space
forced the wrong tokens and a commit failed (seen on the README's structured-output example)."""
from __future__ import annotations

import llguidance
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lookupdec.constraints import Constraint, Regex
from lookupdec.constraints.engine import ll_tokenizer, reads_like

TEXT = '{"ab": "ab", "b": 1}'
MERGES = [("Ġ", "a"), ("Ġa", "b"), ("Ġ", '"'), ("{", '"'), ('"', ":"), ('"', ",")]


def byte_level(decoder) -> PreTrainedTokenizerFast:
    """A byte-level BPE: <unk> <s> </s>, the 256 byte symbols, a few merges (spaces fused into words)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[c] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, MERGES, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


CHAINS = {
    "byte level": decoders.ByteLevel(),
    "GGUF chain (transformers 5.17)": decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                                         decoders.Replace("▁", " "), decoders.ByteLevel()]),
}


def test_the_fixture_is_the_hard_case_the_text_is_right_and_the_raw_json_misread():
    plain, chain = (byte_level(d) for d in CHAINS.values())
    ids = plain.encode(TEXT, add_special_tokens=False)
    assert ids == chain.encode(TEXT, add_special_tokens=False) and plain.decode(ids) == chain.decode(ids) == TEXT
    space_quote = plain.convert_tokens_to_ids("Ġ\"")
    assert space_quote in ids
    n = len(plain.get_vocab())
    raw = llguidance.LLTokenizer(chain.backend_tokenizer.to_str(), n_vocab=n, eos_token=[2])
    assert raw.decode_bytes([space_quote]) == "Ġ\"".encode()  # what llguidance made of the chain's JSON
    assert not reads_like(raw, chain.backend_tokenizer, n)
    assert reads_like(llguidance.LLTokenizer(plain.backend_tokenizer.to_str(), n_vocab=n, eos_token=[2]),
                      plain.backend_tokenizer, n)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_the_engine_reads_every_token_as_the_tokenizer_decodes_it(chain):
    tok = byte_level(CHAINS[chain])
    n = len(tok.get_vocab())
    ll = ll_tokenizer(tok, n, (2,))
    for t in range(3, n):
        want = tok.decode([tok.convert_tokens_to_ids("a"), t])[1:].encode()
        if "\ufffd" not in want.decode("utf-8", "replace"):
            assert ll.decode_bytes([t]) == want, tok.convert_ids_to_tokens(t)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_grammar_with_spaces_allows_and_commits_each_token_of_its_text(chain):
    tok = byte_level(CHAINS[chain])
    n = len(tok.get_vocab())
    con = Constraint(Regex(r'\{"ab": "ab", "b": [0-9]\}'), tok, n, (2,))
    for t in tok.encode(TEXT, add_special_tokens=False):
        assert con.mask()[t], tok.convert_ids_to_tokens(t)
        con.commit([t])
    assert con.is_complete and con.mask()[2]
