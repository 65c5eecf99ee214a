"""Verification cost curve: c(w), our verify forward over w tokens on a ~500-row
KV cache, next to c_hf(1), transformers' own single-token decoding forward.

Usage:
    python benchmarks/cost_curve.py [--threads 2] [--past 500] [--repeats 7] [--out benchmarks/cost_curve.json]

Each width: warm-up, then the median of ``--repeats`` timed forwards; after
each forward the cache is cropped back to ``past`` rows (not timed). Runs on the
embedded model (float32, CPU) with fast kernels (prepacked oneDNN weights) and
without them. The machine may be shared: medians, not means.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

WIDTHS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--widths", type=str, default=",".join(map(str, WIDTHS)))
    ap.add_argument("--out", default="benchmarks/cost_curve.json")
    args = ap.parse_args()

    import torch
    from transformers import DynamicCache

    from lookupdec.fast_kernels import pack_linears
    from lookupdec.kvcache import new_cache
    from lookupdec.models import load_model
    from lookupdec.tree import DraftTree
    from lookupdec.verify import TreeVerifier

    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    lm = load_model(None)
    model = lm.model
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, args.past).tolist()

    def timed(fn, reset) -> float:
        for _ in range(2):
            fn(); reset()
        ts = []
        for _ in range(args.repeats):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t); reset()
        return statistics.median(ts) * 1e3

    def hf_one() -> float:
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(torch.tensor([prompt]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = torch.tensor([[5]])

        def fn():
            with torch.inference_mode():
                model(input_ids=ids, past_key_values=cache, use_cache=True)
        return timed(fn, lambda: cache.crop(-1))

    def ours() -> dict[int, float]:
        verifier = TreeVerifier(model)
        cache = new_cache(model.config, args.past + 128)
        verifier.prefill(cache, prompt)
        out = {}
        for w in widths:
            # A tree of w - 1 nodes: a few branches, as drafters produce.
            seqs = [rng.integers(100, 40000, 6).tolist() for _ in range((w - 1 + 5) // 6)]
            tree = DraftTree.from_sequences(seqs).prune(w - 1) if w > 1 else DraftTree.empty()

            def reset():
                verifier.commit(cache, args.past, ())
                cache.crop(-1)
            out[w] = timed(lambda: verifier.forward(cache, args.past, 7, tree), reset)
        return out

    rows = {"hf_1_plain": hf_one()}
    rows["ours_plain"] = ours()
    pack_linears(model)
    rows["hf_1_packed"] = hf_one()
    rows["ours_packed"] = ours()

    c_hf = rows["hf_1_plain"]
    print(f"embedded model, float32, {args.threads} threads, past {args.past} rows, median of {args.repeats}")
    print(f"c_hf(1) = {c_hf:.1f} ms (transformers forward, default kernels); with packed weights {rows['hf_1_packed']:.1f} ms")
    print(f"{'w':>4} {'c(w) plain ms':>14} {'c(w) fast ms':>13} {'fast / c_hf(1)':>15}")
    for w in widths:
        print(f"{w:>4} {rows['ours_plain'][w]:>14.1f} {rows['ours_packed'][w]:>13.1f} {rows['ours_packed'][w] / c_hf:>15.2f}")
    with open(args.out, "w") as f:
        json.dump({"threads": args.threads, "past": args.past, "repeats": args.repeats, "c_hf_1_ms": c_hf,
                   "c_hf_1_packed_ms": rows["hf_1_packed"],
                   "c_plain_ms": {str(k): v for k, v in rows["ours_plain"].items()},
                   "c_fast_ms": {str(k): v for k, v in rows["ours_packed"].items()}}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
