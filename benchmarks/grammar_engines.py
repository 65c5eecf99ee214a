"""Time one token mask of three grammar engines on the embedded model's tokenizer (SmolLM2, 49152 ids).

For each engine: compile a JSON Schema, walk a valid output token by token and
time the mask computed before each token; then time a rollback of 8 tokens and
a fork (copy) of the matcher state. Run:

    python benchmarks/grammar_engines.py [--repeat 3]

Prints one line per engine (median / p90 mask ms, compile ms, rollback/fork ms).
Engines not installed are skipped (only llguidance is a lookupdec dependency).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "year", "tags"], "additionalProperties": False}
TEXT = '{"title": "A study of lookup decoding in practice", "year": 2024, "tags": ["speculative", "decoding"]}'


def _stats(xs):
    xs = sorted(xs)
    return statistics.median(xs) * 1e3, xs[int(0.9 * (len(xs) - 1))] * 1e3


def bench_llguidance(tok_json: str, ids: list[int], vocab: int, eos: int):
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos)
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    m = llguidance.LLMatcher(lltok, grammar)
    t2 = time.perf_counter()
    assert not m.is_error(), m.get_error()
    bm = allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        a = time.perf_counter()
        fill_next_token_bitmask(m, bm)
        times.append(time.perf_counter() - a)
        assert m.consume_token(t), m.get_error()
    a = time.perf_counter()
    m.rollback(8)
    rb = time.perf_counter() - a
    a = time.perf_counter()
    m.deep_copy()
    fk = time.perf_counter() - a
    return times, (t1 - t0), (t2 - t1), rb, fk


def bench_xgrammar(hf_tok, ids: list[int], vocab: int, eos: int):
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab, stop_token_ids=[eos])
    t1 = time.perf_counter()
    comp = xgr.GrammarCompiler(info, max_threads=1)
    cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True)
    m = xgr.GrammarMatcher(cg, max_rollback_tokens=64)
    t2 = time.perf_counter()
    bm = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for t in ids:
        a = time.perf_counter()
        m.fill_next_token_bitmask(bm)
        times.append(time.perf_counter() - a)
        assert m.accept_token(t)
    a = time.perf_counter()
    m.rollback(8)
    rb = time.perf_counter() - a
    a = time.perf_counter()
    m.fork()
    fk = time.perf_counter() - a
    return times, (t1 - t0), (t2 - t1), rb, fk


def bench_outlines(hf_name_json: str, ids: list[int], vocab: int, eos: int, tok):
    import numpy as np
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    # Vocabulary from decoded token strings (byte-level tokens decoded one by one).
    voc = {}
    for i in range(vocab):
        if i == eos:
            continue
        s = tok.id_to_token(i)
        if s is not None:
            voc.setdefault(s, []).append(i)
    v = Vocabulary(eos, voc)
    t1 = time.perf_counter()
    regex = build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern=r"[ ]?")
    index = Index(regex, v)
    g = Guide(index, max_rollback=64)
    t2 = time.perf_counter()
    mask = np.zeros((vocab + 31) // 32, np.int32)
    times = []
    for t in ids:
        a = time.perf_counter()
        g.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
        times.append(time.perf_counter() - a)
        try:
            g.advance(t)
        except Exception:
            break
    a = time.perf_counter()
    try:
        g.rollback_state(8)
    except Exception:
        pass
    rb = time.perf_counter() - a
    return times, (t1 - t0), (t2 - t1), rb, float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    from transformers import PreTrainedTokenizerFast

    from lookupdec.tokenizer import load_tokenizer

    tok = load_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    eos = hf.eos_token_id
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    print(f"tokenizer vocab {vocab}, eos {eos}, {len(ids)} tokens walked")
    runs = {"llguidance": lambda: bench_llguidance(tok.to_str(), ids, vocab, eos),
            "xgrammar": lambda: bench_xgrammar(hf, ids, vocab, eos),
            "outlines-core": lambda: bench_outlines(None, ids, vocab, eos, tok)}
    for name, fn in runs.items():
        try:
            for _ in range(args.repeat):
                times, tok_s, comp_s, rb, fk = fn()
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        med, p90 = _stats(times)
        print(f"{name:14s} mask median {med:.3f} ms p90 {p90:.3f} ms over {len(times)} | tokenizer {tok_s*1e3:.0f} ms "
              f"compile {comp_s*1e3:.0f} ms | rollback(8) {rb*1e3:.3f} ms fork {fk*1e3:.3f} ms")


if __name__ == "__main__":
    main()
