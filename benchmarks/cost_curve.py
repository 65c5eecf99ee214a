"""Verification cost curve and memory: c(w) next to transformers' single-token forward, ar next to
transformers' ``generate()``, and peak memory of both.

Usage:
    python benchmarks/cost_curve.py [--threads 2] [--past 500] [--repeats 15] [--ar-tokens 128]
                                    [--widths 1,2,...] [--no-rss] [--weights float32|float16|auto]
                                    [--out benchmarks/out/cost_curve.json]

``--weights`` picks the fast forward's weight format (one curve per format: run once per
format; the default output file then names the format). Peak memory per format against
transformers' own loader is ``benchmarks/memory.py``.

c(w): one verify forward of ``Decoder()``'s verifier over the root plus a tree of
w - 1 nodes on top of ``--past`` cached rows, measured by ``lookupdec.costs.measure``
(the routine ``auto`` measures its own curve with): warm-up, then the median of
``--repeats``. The verifier computes the logits of the root and the tree's most
likely path in the forward, others only when an acceptance walk visits them, so
"all rows" adds every row's logits (the most a step can cost). c_hf(1):
transformers' own single-token forward of a separately loaded copy of the model
(default kernels, ``DynamicCache`` of ``--past`` rows), before and after the curve.
ar: 3 chat prompts x ``--ar-tokens`` new tokens, greedy, ours vs transformers'
``generate()``, best of 2 rounds each. Memory: peak RSS (VmHWM) and RSS after
generating 64 tokens, each in a fresh process that loads the embedded model
and generates (ours: ``Decoder().generate``; peer: ``load_model`` and
``model.generate``). The machine may be shared: medians, not means.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from child_env import checkout_env  # noqa: E402

AR_PROMPTS = [
    "Explain how a suffix array is built and what it is used for.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for writing clear Python code, with one example each.",
]

# Loads the embedded model and generates 64 tokens; prints VmHWM and VmRSS in MiB.
_MEMORY_PROBE = r"""
import sys, torch
torch.set_num_threads(1)
def status(key):
    return int([l for l in open("/proc/self/status") if l.startswith(key)][0].split()[1]) / 1024
prompt = "Write a haiku about rain."
if sys.argv[1] == "lookupdec":
    from lookupdec import Decoder
    Decoder().generate(prompt, method="ar", max_new_tokens=64)
else:
    from lookupdec.models import load_model
    from lookupdec.prompts import encode_prompt
    lm = load_model()
    ids = torch.tensor([encode_prompt(lm.tokenizer, prompt)])
    lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
print(status("VmHWM"), status("VmRSS"))
"""


def memory(which: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, which], capture_output=True, text=True, check=True,
                         cwd=REPO, env=checkout_env())
    peak, rss = out.stdout.split()
    return float(peak), float(rss)


def main() -> None:
    from lookupdec.weights import WEIGHTS_CHOICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--widths", type=str, default="1,2,4,8,12,16,24,32,48,64")
    ap.add_argument("--ar-tokens", type=int, default=128, help="0 skips the ar vs generate() comparison")
    ap.add_argument("--no-rss", action="store_true", help="skip the memory comparison")
    ap.add_argument("--weights", default="float32", choices=WEIGHTS_CHOICES,
                    help="the fast forward's weight format")
    ap.add_argument("--out", default=None, help="default benchmarks/out/cost_curve[_WEIGHTS].json")
    args = ap.parse_args()
    if args.out is None:
        args.out = "benchmarks/out/cost_curve.json" if args.weights == "float32" else \
            f"benchmarks/out/cost_curve_{args.weights}.json"

    import numpy as np
    import torch
    from transformers import DynamicCache

    from lookupdec.costs import device_description, measure
    from lookupdec.decoder import Decoder
    from lookupdec.kvcache import with_cache
    from lookupdec.models import load_model
    from lookupdec.tree import DraftTree

    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    dec = Decoder(weights=args.weights)
    verifier = dec.verifier
    hf = load_model(None)  # a separate copy: transformers' forward, default kernels
    prompt = np.random.default_rng(0).integers(100, 40000, args.past).tolist()

    def hf_one() -> float:
        cache = DynamicCache(config=hf.model.config)
        with torch.inference_mode():
            hf.model(torch.tensor([prompt]), **with_cache(hf.model, cache), use_cache=True, logits_to_keep=1)
            ids, ts = torch.tensor([[5]]), []
            for i in range(3 + args.repeats):
                t = time.perf_counter()
                hf.model(input_ids=ids, **with_cache(hf.model, cache), use_cache=True)
                if i >= 3:
                    ts.append(time.perf_counter() - t)
                cache.crop(-1)
        return statistics.median(ts) * 1e3

    c_hf = hf_one()
    curve = measure(verifier, widths=widths, past=args.past - 1, far_past=4 * args.past, repeats=args.repeats,
                    warmup=3)
    c_hf_after = hf_one()
    # Every row's logits: the same forwards, then the full product.
    all_rows = {}
    cache = verifier.new_cache(args.past + max(widths) + 8)
    with torch.inference_mode():
        verifier.prefill(cache, prompt)
        rng = np.random.default_rng(1)
        for w in widths:
            seqs = [rng.integers(100, 40000, 6).tolist() for _ in range((w - 1 + 5) // 6)]
            tree = DraftTree.from_sequences(seqs).prune(w - 1) if w > 1 else DraftTree.empty()
            ts = []
            for i in range(3 + args.repeats):
                t = time.perf_counter()
                verifier.forward(cache, args.past, 7, tree).logits
                if i >= 3:
                    ts.append(time.perf_counter() - t)
                from lookupdec.kvcache import keep_rows

                keep_rows(cache, args.past, [])
            all_rows[w] = statistics.median(ts) * 1e3
    c_ref = min(c_hf, c_hf_after)
    print(f"{device_description('cpu')}; embedded model, float32, weights {dec.weights or '-'}, {args.threads} threads, "
          f"{args.past} cached rows, "
          f"median of {args.repeats}, backend {verifier.backend}")
    print(f"c_hf(1) = {c_hf:.1f} ms before, {c_hf_after:.1f} ms after (transformers forward, default kernels)")
    print(f"{'w':>4} {'c(w) ms':>9} {'c(w)/c_hf(1)':>13} {'c(w)/c(1)':>10} {'all rows ms':>12} {'ratio':>6}")
    for w, ms in zip(curve.widths, curve.ms):
        print(f"{w:>4} {ms:>9.1f} {ms / c_ref:>13.2f} {ms / curve.ms[0]:>10.2f} {all_rows[w]:>12.1f} "
              f"{all_rows[w] / c_ref:>6.2f}")

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
        ta = sum(r["ours_tokens"] for r in ar_rows) / sum(r["ours_s"] for r in ar_rows)
        tb = sum(r["hf_tokens"] for r in ar_rows) / sum(r["hf_s"] for r in ar_rows)
        print(f"ar {ta:.1f} tok/s vs generate() {tb:.1f} tok/s: {ta / tb:.2f}x; same tokens: "
              f"{[r['same_tokens'] for r in ar_rows]}")
    mem = {}
    if not args.no_rss:
        del dec, hf
        mem = {"lookupdec": memory("lookupdec"), "transformers": memory("transformers")}
        (p1, r1), (p2, r2) = mem["lookupdec"], mem["transformers"]
        print(f"peak RSS: lookupdec {p1:.0f} MiB, transformers generate() {p2:.0f} MiB ({p1 / p2:.2f}x); "
              f"RSS after generating: {r1:.0f} vs {r2:.0f} MiB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": device_description("cpu"), "machine": platform.machine(), "threads": args.threads,
                   "past": args.past, "repeats": args.repeats, "backend": verifier.backend, "weights": dec.weights,
                   "c_hf_1_ms": c_hf, "c_hf_1_after_ms": c_hf_after,
                   "c_ms": {str(w): m for w, m in zip(curve.widths, curve.ms)},
                   "c_all_rows_ms": {str(k): v for k, v in all_rows.items()},
                   "ar": ar_rows, "memory_mib": mem}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
