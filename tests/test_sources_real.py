"""Every lookup source on the embedded model: greedy output equals ar's, token for token."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

ARTICLE = ("The city council approved a plan on Tuesday to build three new libraries by 2028. "
           "The libraries will open from nine in the morning to eight in the evening, and each will have "
           "a reading room for children, a study hall and a small cafe. The plan costs 40 million dollars.")


def test_llma_rest_history_and_auto_equal_ar_on_the_real_model(real_loaded, tmp_path):
    from lookupdec.decoder import Decoder
    from lookupdec.index import build_index_from_tokens

    tok = real_loaded.tokenizer
    corpus = [ARTICLE, "Libraries open from nine in the morning to eight in the evening on weekdays.",
              "def add(a, b):\n    return a + b\n"]
    build_index_from_tokens([tok(t, add_special_tokens=False)["input_ids"] for t in corpus], tmp_path / "i",
                            tokenizer=tok)
    dec = Decoder(real_loaded, indexes=str(tmp_path / "i"), history=str(tmp_path / "h"))
    prompt = dec.encode("Summarize: " + ARTICLE)
    ref = dec.generate(prompt, method="ar", max_new_tokens=64)  # also remembered in the history
    drafted = {}
    for method in ("llma", "rest", "history", "auto"):
        out = dec.generate(prompt, method=method, max_new_tokens=64,
                           references=[ARTICLE] if method in ("llma", "auto") else None)
        assert out.token_ids == ref.token_ids, method
        drafted[method] = sum(out.accepted_by_source.values())
    # Each source drafted something that was accepted (history: the same request was answered before).
    assert all(n > 0 for n in drafted.values()), drafted
