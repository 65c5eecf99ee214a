"""Host time of a decoding step, measured from outside: the wall time between one forward and the next.

The host share the other benchmarks report is the result's own step accounting (``StepStats``:
drafting and other ms over the step's total). This checks it from outside: it wraps the
decoder's verifier so that every forward is timed where ``Decoder.generate`` calls it, and
reports, per method, the time between forwards (everything the step does in Python: drafting,
acceptance, the cache commit, the gate and the cost model's bookkeeping) beside the forward
itself, and the share the steps' own accounting gives. The two shares should agree (the lazy
``lm_head`` rows an acceptance walk computes count as forward in the accounting and as
between-forwards time here: the gap between them).

Methods run interleaved, one prompt at a time, on the first turn of the first question of each
Spec-Bench category (or ``--limit`` of them). Name the machine (``lscpu``) with the figures.

Usage:
    .venv/bin/python benchmarks/step_host.py --methods ar,pld,auto --max-new-tokens 128
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if __package__ in (None, ""):  # run as a script: make the checkout's package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_question.jsonl"


class ForwardClock:
    """Wraps ``verifier.forward``: the start and end of every forward since ``reset``."""

    def __init__(self, verifier) -> None:
        self.marks: list[tuple[float, float]] = []
        inner = verifier.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            self.marks.append((t0, time.perf_counter()))
            return out

        verifier.forward = timed  # the instance's attribute: Sequence.run calls it through the decoder's verifier

    def reset(self) -> None:
        self.marks = []


def measure(decoder, prompts: list[str], methods: list[str], max_new_tokens: int) -> dict[str, dict]:
    """Per method: steps, tokens, forward and between-forwards seconds, and the steps' own host ms."""
    clock = ForwardClock(decoder.verifier)
    acc = {m: {"steps": 0, "tokens": 0, "forward_s": 0.0, "between": [], "stats_host_ms": 0.0, "stats_ms": 0.0}
           for m in methods}
    for prompt in prompts:
        for m in methods:  # interleaved: a slow spell of the machine hits every method alike
            clock.reset()
            res = decoder.generate(prompt, method=m, max_new_tokens=max_new_tokens)
            marks = clock.marks
            a = acc[m]
            a["steps"] += len(marks)
            a["tokens"] += res.new_tokens
            a["forward_s"] += sum(e - s for s, e in marks)
            a["between"] += [b[0] - e[1] for e, b in zip(marks, marks[1:])]
            steps = res.step_stats[1:]  # the prefill's is not a forward of the verifier's
            a["stats_host_ms"] += sum(s.draft_ms + s.other_ms for s in steps)
            a["stats_ms"] += sum(s.draft_ms + s.other_ms + s.verify_ms for s in steps)
    return acc


def table(acc: dict[str, dict]) -> str:
    rows = ["| method | steps | tokens a step | between forwards, mean / median us | forward, mean ms | "
            "host share between forwards | host share, steps' own accounting |", "|---|---:|---:|---:|---:|---:|---:|"]
    for m, a in acc.items():
        between, steps = a["between"], max(a["steps"], 1)
        fwd = a["forward_s"]
        mean_gap = statistics.fmean(between) if between else 0.0
        share = 100 * mean_gap / (mean_gap + fwd / steps) if between else 0.0
        own = 100 * a["stats_host_ms"] / a["stats_ms"] if a["stats_ms"] else 0.0
        rows.append(f"| `{m}` | {a['steps']} | {a['tokens'] / steps:.2f} | "
                    f"{1e6 * mean_gap:.0f} / "
                    f"{1e6 * statistics.median(between) if between else 0:.0f} | {1e3 * fwd / steps:.2f} | "
                    f"{share:.2f}% | {own:.2f}% |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="a Spec-Bench question.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="first turns of this many categories (default: all)")
    ap.add_argument("--methods", default="ar,pld,auto", help="comma-separated methods (default: ar,pld,auto)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="quantized", help="the Decoder's weight format (default: quantized)")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1 or args.threads < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--max-new-tokens, --threads and --limit must be at least 1")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from specbench.tasks import load_questions

    try:
        questions = load_questions(args.questions, per_category=1)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))
    prompts = [q.turns[0] for q in questions][: args.limit]

    import torch

    from lookupdec import Decoder
    from lookupdec.methods import METHODS

    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        ap.error(f"unknown method(s) {unknown or args.methods!r}; choose from {', '.join(METHODS)}")
    torch.set_num_threads(args.threads)
    decoder = Decoder(weights=args.weights)
    decoder.generate(prompts[0], method=methods[-1], max_new_tokens=8)  # warm-up: the cost curve, first-call work
    print(table(measure(decoder, prompts, methods, args.max_new_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
