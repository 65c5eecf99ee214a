"""Verification cost curve: c(w), our verify forward over w tokens on a ~500-row
KV cache, next to c_hf(1), transformers' own single-token decoding forward;
then plain decoding (``ar``) tokens/s next to transformers' ``generate()``.

Usage:
    python benchmarks/cost_curve.py [--threads 2] [--past 500] [--repeats 15] [--ar-tokens 128]
                                    [--out benchmarks/cost_curve.json]

c(w): the verifier of ``Decoder(fast_kernels=True)`` (the fast backend for this
model), a tree of w - 1 nodes on top of ``--past`` cached rows; warm-up, then the
median of ``--repeats`` timed forwards; after each forward the cache is cut back
to ``past`` rows (not timed). The verifier computes the logits of the root and the
tree's most likely path ("rows") inside the forward, the others only when an
acceptance walk visits them: c(w) is the cost of a step whose walk stays on that
path; "all rows" is the cost with every row's logits (the most a step can cost). c_hf(1): a separately loaded copy of the model with
transformers' default kernels, one token on a ``DynamicCache`` of ``past`` rows.
ar: 3 chat prompts x ``--ar-tokens`` new tokens, greedy, ours (fast backend) vs
transformers' ``generate()`` (default kernels), interleaved, best of 2 rounds
per prompt. The machine may be shared: medians, not means.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

WIDTHS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]

AR_PROMPTS = [
    "Explain how a suffix array is built and what it is used for.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for writing clear Python code, with one example each.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--widths", type=str, default=",".join(map(str, WIDTHS)))
    ap.add_argument("--ar-tokens", type=int, default=128, help="0 skips the ar vs generate() comparison")
    ap.add_argument("--out", default="benchmarks/cost_curve.json")
    args = ap.parse_args()

    import torch
    from transformers import DynamicCache

    from lookupdec.decoder import Decoder
    from lookupdec.models import load_model
    from lookupdec.tree import DraftTree

    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    dec = Decoder(load_model(None), fast_kernels=True)
    verifier = dec.verifier
    hf = load_model(None)  # a separate copy: transformers' forward, default kernels
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, args.past).tolist()

    def timed(fn, reset) -> float:
        for _ in range(3):
            fn(); reset()
        ts = []
        for _ in range(args.repeats):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t); reset()
        return statistics.median(ts) * 1e3

    def hf_one() -> float:
        cache = DynamicCache(config=hf.model.config)
        with torch.inference_mode():
            hf.model(torch.tensor([prompt]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = torch.tensor([[5]])

        def fn():
            with torch.inference_mode():
                hf.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return timed(fn, lambda: cache.crop(-1))

    out_all: dict[int, float] = {}
    fetched: dict[int, int] = {}

    def ours() -> dict[int, float]:
        cache = verifier.new_cache(args.past + 128)
        verifier.prefill(cache, prompt[:-1])
        out = {}
        for w in widths:
            # A tree of w - 1 nodes: a few branches, as drafters produce.
            seqs = [rng.integers(100, 40000, 6).tolist() for _ in range((w - 1 + 5) // 6)]
            tree = DraftTree.from_sequences(seqs).prune(w - 1) if w > 1 else DraftTree.empty()
            past = args.past - 1
            out[w] = timed(lambda: verifier.forward(cache, past, 7, tree), lambda: cache.crop(past))
            # Every row's logits, as a walk that leaves the main path at the root would need at most.
            out_all[w] = timed(lambda: verifier.forward(cache, past, 7, tree).logits, lambda: cache.crop(past))
            res = verifier.forward(cache, past, 7, tree)
            fetched[w] = res.rows.computed
            cache.crop(past)
        return out

    c_hf = hf_one()
    c_ours = ours()
    c_hf_after = hf_one()  # the machine may drift: measured before and after
    print(f"embedded model, float32, {args.threads} threads, past {args.past} rows, median of {args.repeats}, "
          f"backend {verifier.backend}")
    print(f"c_hf(1) = {c_hf:.1f} ms before, {c_hf_after:.1f} ms after (transformers forward, default kernels)")
    c_ref = min(c_hf, c_hf_after)
    print(f"{'w':>4} {'c(w) ms':>9} {'c(w) / c_hf(1)':>15} {'rows':>5} {'all rows ms':>12} {'ratio':>6}")
    for w in widths:
        print(f"{w:>4} {c_ours[w]:>9.1f} {c_ours[w] / c_ref:>15.2f} {fetched[w]:>5} {out_all[w]:>12.1f} "
              f"{out_all[w] / c_ref:>6.2f}")

    ar_rows = []
    if args.ar_tokens:
        for text in AR_PROMPTS:
            ids = dec.encode(text)
            best_ours = best_hf = float("inf")
            for _ in range(2):
                res = dec.generate(ids, method="ar", max_new_tokens=args.ar_tokens)
                best_ours = min(best_ours, res.elapsed_s)
                x = torch.tensor([ids])
                t = time.perf_counter()
                with torch.inference_mode():
                    out = hf.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.ar_tokens,
                                            do_sample=False, eos_token_id=list(hf.eos_ids), pad_token_id=0,
                                            top_p=None, top_k=None, temperature=None)
                best_hf = min(best_hf, time.perf_counter() - t)
            hf_new = out[0, len(ids):].tolist()
            ar_rows.append({"prompt": text, "ours_tokens": res.new_tokens, "ours_s": best_ours,
                            "hf_tokens": len(hf_new), "hf_s": best_hf, "same_tokens": list(res.token_ids) == hf_new})
        print(f"{'prompt':>6} {'ours tok/s':>11} {'generate() tok/s':>17} {'ratio':>6} {'same output':>12}")
        for i, r in enumerate(ar_rows):
            a, b = r["ours_tokens"] / r["ours_s"], r["hf_tokens"] / r["hf_s"]
            print(f"{i:>6} {a:>11.1f} {b:>17.1f} {a / b:>6.2f} {str(r['same_tokens']):>12}")
        ta = sum(r["ours_tokens"] for r in ar_rows) / sum(r["ours_s"] for r in ar_rows)
        tb = sum(r["hf_tokens"] for r in ar_rows) / sum(r["hf_s"] for r in ar_rows)
        print(f"{'all':>6} {ta:>11.1f} {tb:>17.1f} {ta / tb:>6.2f}")
    with open(args.out, "w") as f:
        json.dump({"threads": args.threads, "past": args.past, "repeats": args.repeats, "backend": verifier.backend,
                   "c_hf_1_ms": c_hf, "c_hf_1_after_ms": c_hf_after,
                   "c_ms": {str(k): v for k, v in c_ours.items()},
                   "c_all_rows_ms": {str(k): v for k, v in out_all.items()},
                   "logit_rows_fetched": {str(k): v for k, v in fetched.items()}, "ar": ar_rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
