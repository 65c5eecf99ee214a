"""The native live index against its targets: index a 32,000-token prompt, query it, count its bytes.

Targets (issue "Every lookup source in one scored tree", point 2): a
32,000-token prompt indexed in at most 5 ms, a query in at most 10 µs median,
at most 16 bytes per token. The text is natural: Spec-Bench's questions,
tokenized with the embedded model's tokenizer and concatenated; queries are
PLD's (``PLDDrafter``'s index: max_n 8, min_n 1; the draft of the longest
match of 2+ tokens, 8 occurrences, depth 8, width 12), one after each token
appended, as decoding does. (The pure-Python oracle, tests/oracles/live.py, is
test code and is not timed here: benchmarks never import tests/.) Also timed: the
public calls a decode step makes (``PLDDrafter.begin`` and ``propose``), and
an adversarial sequence (32,000 copies of one token).

Usage:
    python benchmarks/live_index.py [--tokens 32000] [--queries 2000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's package and tests/
sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbench.tasks import DEFAULT_QUESTIONS as QUESTIONS  # noqa: E402


def natural_tokens(n: int) -> list[int]:
    from lookupdec.tokenizer import load_tokenizer

    tok = load_tokenizer()
    out: list[int] = []
    for line in QUESTIONS.read_text(encoding="utf-8").splitlines():
        for turn in json.loads(line)["turns"]:
            out.extend(tok.encode(turn, add_special_tokens=False).ids)
            if len(out) >= n:
                return out[:n]
    while len(out) < n:  # not enough text: repeat it
        out += out[: n - len(out)]
    return out


def best_of(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def query_times(cls, seq: list[int], n_queries: int) -> list[float]:
    """Per-query seconds of draft-sized lookups after each appended token."""
    idx = cls(max_n=8, min_n=1)
    idx.extend(seq[:-n_queries])
    times = []
    for t in seq[-n_queries:]:
        idx.append(t)
        t0 = time.perf_counter()
        idx.draft(8, 8, 12, min_n=2)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from lookupdec.drafters.base import DraftRequest
    from lookupdec.drafters.pld import PLDDrafter
    from lookupdec.index.live import LiveIndex

    seq = natural_tokens(args.tokens)
    arr = np.array(seq, np.int64)
    res: dict[str, object] = {"tokens": args.tokens, "queries": args.queries}
    for name, cls, reps in (("native", LiveIndex, args.repeats),):
        build = best_of(lambda: cls(max_n=8, min_n=1).extend(arr), reps)
        q = query_times(cls, seq, args.queries)
        res[name] = {"index_ms": build * 1e3, "query_median_us": statistics.median(q) * 1e6,
                     "query_p99_us": float(np.percentile(q, 99)) * 1e6}
    idx = LiveIndex(max_n=8, min_n=1)
    idx.extend(arr)
    res["native"]["bytes_per_token"] = idx.nbytes / args.tokens
    same = [7] * args.tokens
    idx = LiveIndex(max_n=8, min_n=1)
    idx.extend(same)
    res["adversarial_query_us"] = best_of(lambda: idx.draft(8, 8, 12, min_n=2), 5) * 1e6
    d = PLDDrafter()
    res["pld_begin_ms"] = best_of(lambda: d.begin(seq), args.repeats) * 1e3
    d.begin(seq)
    res["pld_propose_us"] = best_of(lambda: d.propose(DraftRequest(64, 128)), 50) * 1e6
    n = res["native"]
    print(f"{args.tokens} natural tokens (Spec-Bench questions, embedded tokenizer); {args.queries} queries")
    print(f"{'':15} {'index ms':>9} {'query median µs':>16} {'query p99 µs':>13}")
    for name in ("native",):
        r = res[name]
        print(f"{name:15} {r['index_ms']:>9.2f} {r['query_median_us']:>16.2f} {r['query_p99_us']:>13.2f}")
    print(f"native bytes/token {n['bytes_per_token']:.2f}; 32,000 copies of one token: query "
          f"{res['adversarial_query_us']:.0f} µs; PLDDrafter.begin {res['pld_begin_ms']:.2f} ms, "
          f"propose {res['pld_propose_us']:.1f} µs")
    print(f"targets: index <= 5 ms: {n['index_ms'] <= 5}; median query <= 10 µs: {n['query_median_us'] <= 10}; "
          f"<= 16 B/token: {n['bytes_per_token'] <= 16}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
