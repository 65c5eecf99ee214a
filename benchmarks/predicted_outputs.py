"""Predicted Outputs on code editing: a file plus a small change request, answered with the edited file.

The prediction (OpenAI's ``prediction`` field; ``Decoder.generate(prediction=...)``) is the
original file. For each case of ``benchmarks/editset.py`` this runs, greedy, in one process
and interleaved per case (so a slow spell of the machine hits every method alike):

- ``hf``: transformers ``generate()``, plain greedy (the baseline users know);
- ``hf_pld``: transformers ``generate(prompt_lookup_num_tokens=10)`` (the file is in the prompt);
- ``ar``: lookupdec plain decoding;
- ``auto``: lookupdec's default method without the prediction (it still drafts from the prompt);
- ``auto+prediction``: the same with the prediction;
- ``llma+prediction``: the prediction as the only draft source.

Each case's answer is the edited file: every method generates as many tokens as plain decoding
takes to close the code block that holds it (``ANSWER_END``; ``--whole-output`` lets every method
run on to ``--max-new-tokens``, through whatever a small model writes after the block).

It reports per method tokens/s, tau (new tokens per forward, the prefill counted) and the ratio to ``ar`` and to
``auto`` without the prediction, over every case and over the cases whose output keeps at
least 80% of the file (``editset.kept_share``: the issue's target applies there). Beside the
whole call's rate it splits off the prefill, which gives the first token and which no draft
shortens: each lookupdec method's decode rate, and ``ar``'s ceiling (its time over its prefill's).
Every lookupdec method's tokens must equal ``ar``'s (exit 1 on a mismatch).

Usage (from the repository root)::

    .venv/bin/python benchmarks/predicted_outputs.py --cases 12 --max-new-tokens 512
    .venv/bin/python benchmarks/predicted_outputs.py --cases 1 --max-new-tokens 16 --methods ar,auto+prediction
    python3 benchmarks/predicted_outputs.py --cases 12 --methods ar,auto,auto+prediction --time-limit 150  # a lent GPU

Writes ``predicted_outputs.json`` and ``predicted_outputs.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from editset import edit_cases, kept_share  # noqa: E402

METHODS = ("ar", "hf", "hf_pld", "auto", "auto+prediction", "llma+prediction")  # ar first: the reference
KEEP_TARGET = 0.8
# The answer is the edited file: by default each case generates as many tokens as plain decoding
# (``ar``, greedy, untimed) takes to close the code block that holds it, and every method, the
# peers included, generates exactly that many. A small model rambles on after the block (the
# embedded one loops), and that text is no part of the edit the prediction is for.
ANSWER_END = "\n```"


@dataclass(frozen=True)
class Row:
    """One method on one case."""

    case: str
    method: str
    new_tokens: int
    seconds: float
    steps: int
    kept: float          # share of the original file the output repeats
    edit_made: bool      # the output contains the expected edited file
    exact: bool          # tokens equal ar's (the peers use transformers' kernels: reported, not required)
    accepted_prediction: int
    first_s: float = math.nan  # the prefill, which gives the first token (not timed for the peers)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=12, help="editing cases (benchmarks/editset.py order)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--whole-output", action="store_true",
                   help="let every method run to --max-new-tokens (or EOS); by default each case's answer ends "
                        "with the code block that holds the edited file (see ANSWER_END)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--weights", default="auto", help="the fast forward's weight format (Decoder(weights=...))")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="start no case after S seconds (the first always runs) and report the cases done: "
                        "for a machine lent for minutes")
    p.add_argument("--out", default="benchmarks/results/predicted_outputs")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or args.methods[:1] != ["ar"]:
        p.error(f"unknown methods {unknown}" if unknown else "every method is checked against ar: put ar first")
    if args.cases < 1 or args.max_new_tokens < 1:
        p.error("--cases and --max-new-tokens must be >= 1")
    return args


def run_one(name: str, dec, peer, prompt_ids, case, max_new: int):
    """(new token ids, seconds, steps, accepted prediction tokens, seconds to the first token) of one method
    on one case."""
    if name in ("hf", "hf_pld"):
        out = peer[name].generate(prompt_ids, max_new)
        return out.token_ids, None, out.steps, 0, math.nan
    method, _, pred = name.partition("+")
    t0 = time.perf_counter()
    res = dec.generate(list(prompt_ids), method=method, max_new_tokens=max_new, chat_template=False,
                       prediction=case.prediction() if pred else None, remember=False)
    secs = time.perf_counter() - t0
    first = res.step_stats[0]  # the prefill: the drafter's begin, the forward, the first token
    first_s = (first.draft_ms + first.verify_ms + first.other_ms) / 1e3
    return tuple(res.token_ids), secs, res.steps, int(res.accepted_by_source.get("prediction", 0)), first_s


def summarize(rows: list[Row], methods: list[str]) -> dict:
    """Per method: tokens/s (total tokens / total seconds), tau, and ratios, over all cases and the kept ones.

    Each answer's first token comes from the prefill of the prompt (the file and the request), which
    no draft shortens; so beside the whole call's tokens/s each method has its decode rate (the
    tokens after the first over the time after the prefill) and ``ar`` its ceiling: its seconds
    over its prefill's, the most any method that prefills the same prompt can gain on it.
    """
    out = {}
    kept_cases = {r.case for r in rows if r.method == "ar" and r.kept >= KEEP_TARGET}
    for subset, cases in (("all", {r.case for r in rows}), ("kept>=80%", kept_cases)):
        per = {}
        for m in methods:
            rs = [r for r in rows if r.method == m and r.case in cases]
            if not rs:
                continue
            toks, secs, steps = sum(r.new_tokens for r in rs), sum(r.seconds for r in rs), sum(r.steps for r in rs)
            per[m] = {"cases": len(rs), "tokens": toks, "tokens_per_s": toks / secs if secs else 0.0,
                      "tau": toks / max(1, steps), "exact": all(r.exact for r in rs),
                      "accepted_prediction": sum(r.accepted_prediction for r in rs)}
            first = sum(r.first_s for r in rs)
            if not math.isnan(first) and secs > first:
                per[m] |= {"first_token_s": first, "decode_tokens_per_s": (toks - len(rs)) / (secs - first)}
        for m, d in per.items():
            for base in ("ar", "auto", "hf"):
                if base in per and per[base]["tokens_per_s"]:
                    d[f"x_{base}"] = d["tokens_per_s"] / per[base]["tokens_per_s"]
            if "decode_tokens_per_s" in d and "decode_tokens_per_s" in per.get("ar", {}):
                d["decode_x_ar"] = d["decode_tokens_per_s"] / per["ar"]["decode_tokens_per_s"]
        if "first_token_s" in per.get("ar", {}):
            ar = per["ar"]
            ar["ceiling_x_ar"] = ar["tokens"] / ar["tokens_per_s"] / ar["first_token_s"]
        out[subset] = per
    return out


def markdown(summary: dict, info: dict) -> str:
    lines = [f"Predicted Outputs on code editing: {info['cases']} cases, {info['max_new_tokens']} new tokens at most, "
             f"answer {info.get('answer', 'whole output')}, greedy; {info['machine']}; torch {info['torch']}, "
             f"{info['threads']} threads, weights {info.get('weights') or '-'}.", ""]
    for subset, per in summary.items():
        if not per:
            lines += [f"**{subset}**: no case", ""]
            continue
        lines += [f"**{subset}** ({next(iter(per.values()))['cases'] if per else 0} cases)", "",
                  "| method | tokens/s | x ar | x auto (no prediction) | x hf | tau | accepted from prediction | "
                  "prefill s | decode tokens/s | decode x ar | exact |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m, d in per.items():
            f = lambda k, p=2: f"{d[k]:.{p}f}" if k in d else "-"  # noqa: E731
            lines.append(f"| {m} | {d['tokens_per_s']:.1f} | {f('x_ar')} | {f('x_auto')} | {f('x_hf')} | "
                         f"{d['tau']:.2f} | {d['accepted_prediction']} | {f('first_token_s')} | "
                         f"{f('decode_tokens_per_s', 1)} | {f('decode_x_ar')} | {'yes' if d['exact'] else 'NO'} |")
        if "ceiling_x_ar" in per.get("ar", {}):
            lines += ["", f"Ceiling with the prefill counted: `ar`'s seconds over its prefill's, "
                          f"{per['ar']['ceiling_x_ar']:.2f}x."]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from lookupdec import Decoder
    from lookupdec.costs import device_description
    from lookupdec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    from specbench.methods import HFGenerate

    # Every configuration runs the same prompts: none may find another's rows (prefix reuse off).
    dec = Decoder(args.model, weights=args.weights, prefix_cache_mb=0)
    peer = {}
    if any(m.startswith("hf") for m in args.methods):
        peer_loaded = load_model(args.model, dtype="float32")
        for name, n in (("hf", None), ("hf_pld", 10)):
            peer[name] = HFGenerate(name, peer_loaded.model.eval(), dec.loaded.eos_ids, n)
    if any(m not in ("hf", "hf_pld", "ar") for m in args.methods):
        dec.cost_curve()  # measured (or read) before any timing
    cases = edit_cases(args.cases)
    eos = set(int(e) for e in dec.loaded.eos_ids)
    strip = lambda ids: tuple(t for t in ids if t not in eos)  # noqa: E731  (an EOS the peer includes)
    # Warm-up: one short generation per method, not recorded.
    warm = dec.encode(cases[0].messages())
    for m in args.methods:
        run_one(m, dec, peer, warm, cases[0], 8)
    rows: list[Row] = []
    mismatches = []
    began = time.perf_counter()
    for i, case in enumerate(cases):
        if i and args.time_limit is not None and time.perf_counter() - began > args.time_limit:
            print(f"--time-limit {args.time_limit:g} s reached after {i} of {len(cases)} cases", file=sys.stderr)
            break
        prompt_ids = dec.encode(case.messages())
        budget = args.max_new_tokens
        if not args.whole_output:
            answer = dec.generate(list(prompt_ids), method="ar", max_new_tokens=budget, chat_template=False,
                                  stop=[ANSWER_END], remember=False)
            budget = max(1, answer.new_tokens)
        ref = None
        for m in args.methods:
            t0 = time.perf_counter()
            ids, secs, steps, acc, first_s = run_one(m, dec, peer, prompt_ids, case, budget)
            secs = secs if secs is not None else time.perf_counter() - t0
            ids = strip(ids)
            if m == "ar":
                ref = ids
            text = dec.tokenizer.decode(list(ids), skip_special_tokens=True)
            exact = ref is None or ids == ref
            if not exact and m not in ("hf", "hf_pld"):
                mismatches.append((case.name, m))
            rows.append(Row(case.name, m, len(ids), secs, steps, kept_share(case.source, text),
                            case.edited.strip() in text, exact, acc, first_s))
        ar_row = next((r for r in rows if r.case == case.name and r.method == "ar"), rows[-1])
        print(f"[{i + 1}/{len(cases)}] {case.name}: {ar_row.new_tokens} tokens, kept {ar_row.kept:.0%}, "
              f"edit {'made' if ar_row.edit_made else 'not made'}; "
              + ", ".join(f"{r.method} {r.tokens_per_s:.1f}" + ("" if r.exact else " (NOT ar's tokens)")
                          for r in rows if r.case == case.name) + " tokens/s",
              file=sys.stderr)
    summary = summarize(rows, args.methods)
    info = {"cases": len({r.case for r in rows}), "max_new_tokens": args.max_new_tokens, "torch": torch.__version__,
            "answer": "whole output" if args.whole_output else f"up to the code block's end ({ANSWER_END!r})",
            "threads": torch.get_num_threads(), "machine": device_description(dec.verifier.device),
            "model": dec.loaded.name, "weights": dec.weights, "python": platform.python_version(), "command": " ".join(sys.argv)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "predicted_outputs.json").write_text(json.dumps(
        {"info": info, "summary": summary, "rows": [asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in rows]},
        indent=1))
    md = markdown(summary, info)
    (out / "predicted_outputs.md").write_text(md)
    print(md)
    if mismatches:
        print(f"MISMATCH against ar: {mismatches}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
