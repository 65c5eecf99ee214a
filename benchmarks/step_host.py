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

With ``--compare-torch-glue`` each method also runs without the one-call native step
(``ext/step.pxi``: a plain or tree step's embedding, rotary rows, tree inputs and bias, final norm
and first ``lm_head`` rows in one call), in the same process, alternating which goes first prompt
by prompt, and the two are compared by their time a token, prompt by prompt.

Usage:
    .venv/bin/python benchmarks/step_host.py --methods ar,pld,auto --max-new-tokens 128
    .venv/bin/python benchmarks/step_host.py --methods ar,pld --compare-torch-glue
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


TORCH_GLUE = ", torch glue"  # the label's suffix of a method run without the one-call native step


def one_call_step(decoder, on: bool) -> None:
    """Turn the fast forward's one-call plain and tree steps (``ext/step.pxi``) on or off: off, each
    step runs torch's calls around the native layers, as before they existed (the same bits)."""
    ff = decoder.verifier.fast
    if not hasattr(ff, "_saved_native"):
        ff._saved_native = ff.native
    ff.native = ff._saved_native if on else None


def measure(decoder, prompts: list[str], methods: list[str], max_new_tokens: int,
            torch_glue: bool = False) -> dict[str, dict]:
    """Per method: steps, tokens, forward and between-forwards seconds, the steps' own host ms and the
    wall time; with ``torch_glue`` each method also runs without the one-call step (label + TORCH_GLUE),
    the two alternating which goes first, prompt by prompt."""
    clock = ForwardClock(decoder.verifier)
    runs = [(m, glue) for m in methods for glue in ((False, True) if torch_glue else (False,))]
    acc = {m + (TORCH_GLUE if glue else ""): {"steps": 0, "tokens": 0, "forward_s": 0.0, "between": [],
                                             "stats_host_ms": 0.0, "stats_ms": 0.0, "wall_s": [], "new": []}
           for m, glue in runs}
    for i, prompt in enumerate(prompts):
        order = runs if i % 2 == 0 else [(m, not glue) if torch_glue else (m, glue) for m, glue in runs]
        for m, glue in order:  # interleaved: a slow spell of the machine hits every method alike
            if torch_glue:
                one_call_step(decoder, not glue)
            clock.reset()
            t0 = time.perf_counter()
            res = decoder.generate(prompt, method=m, max_new_tokens=max_new_tokens)
            wall = time.perf_counter() - t0
            marks = clock.marks
            a = acc[m + (TORCH_GLUE if glue else "")]
            a["wall_s"].append(wall)
            a["new"].append(res.new_tokens)
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
            "host share between forwards | host share, steps' own accounting | tokens/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m, a in acc.items():
        between, steps = a["between"], max(a["steps"], 1)
        fwd = a["forward_s"]
        mean_gap = statistics.fmean(between) if between else 0.0
        share = 100 * mean_gap / (mean_gap + fwd / steps) if between else 0.0
        own = 100 * a["stats_host_ms"] / a["stats_ms"] if a["stats_ms"] else 0.0
        rows.append(f"| `{m}` | {a['steps']} | {a['tokens'] / steps:.2f} | "
                    f"{1e6 * mean_gap:.0f} / "
                    f"{1e6 * statistics.median(between) if between else 0:.0f} | {1e3 * fwd / steps:.2f} | "
                    f"{share:.2f}% | {own:.2f}% | {sum(a['new']) / max(sum(a['wall_s']), 1e-9):.1f} |")
    for name, a in acc.items():
        if not name.endswith(TORCH_GLUE):
            continue
        mine = acc[name[: -len(TORCH_GLUE)]]
        per = [(w / max(n, 1), wg / max(ng, 1)) for w, n, wg, ng in zip(mine["wall_s"], mine["new"], a["wall_s"], a["new"])]
        faster = sum(x < y for x, y in per)
        rows.append(f"\n`{name[: -len(TORCH_GLUE)]}`: the one-call step took less time a token on {faster} of "
                    f"{len(per)} prompts; torch glue / one call, mean of the per-prompt ratios "
                    f"{statistics.fmean(y / x for x, y in per):.3f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="a Spec-Bench question.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="first turns of this many categories (default: all)")
    ap.add_argument("--methods", default="ar,pld,auto", help="comma-separated methods (default: ar,pld,auto)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="quantized", help="the Decoder's weight format (default: quantized)")
    ap.add_argument("--compare-torch-glue", action="store_true",
                    help="also run each method without the one-call native step (torch's calls around the native "
                         "layers), alternating, and compare their time a token prompt by prompt")
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
    from lookupdec.products import QUANTIZED_FORMATS

    if args.compare_torch_glue and args.weights not in QUANTIZED_FORMATS:  # only their steps run natively
        ap.error(f"--compare-torch-glue needs a weight format with the one-call native step ({args.weights!r} has none)")
    torch.set_num_threads(args.threads)
    # Every configuration runs the same prompts: none may find another's rows (prefix reuse off).
    decoder = Decoder(weights=args.weights, prefix_cache_mb=0)
    if args.compare_torch_glue and getattr(decoder.verifier.fast, "native", None) is None:
        ap.error(f"--compare-torch-glue needs a weight format with the one-call native step ({args.weights!r} has none)")
    decoder.generate(prompts[0], method=methods[-1], max_new_tokens=8)  # warm-up: the cost curve, first-call work
    print(table(measure(decoder, prompts, methods, args.max_new_tokens, args.compare_torch_glue)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
