"""Prompt prefill on the embedded model: its two paths, and what prefix reuse saves.

- ``paths``: for each weight format in ``--weights`` and prompt length in ``--lengths`` (random
  tokens), one prefill on an empty cache through each of ``lookupdec.prefill``'s paths, torch's
  SDPA and the native attention 128 rows at a time, the two alternating call by call
  (``alternation.alternated_ms``). ``FastForward.forward(..., causal=True)`` takes the chunks in the
  quantized formats (their rows are then the same bits however a prompt is split), SDPA in the float
  formats.
- ``reuse``: ``Decoder.generate(prompt, method="ar", max_new_tokens=1)`` (the public call: a
  prompt's prefill and its first token) in the quantized format, with prefix reuse and without,
  alternating call by call. With reuse, the store holds only what an earlier, different request
  left: for a Spec-Bench first turn, another question's (so the chat template's system prompt is
  kept); for an MT-bench second turn, the first turn's prompt and ``ar``'s answer to it.

Usage (from the repository root)::

    .venv/bin/python benchmarks/prefill.py --threads 2 --out benchmarks/out/prefill.json

Prints a JSON object (and writes it to ``--out``) naming the CPU, ISA and threads.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from alternation import alternated_ms  # noqa: E402
from json_report import print_and_write  # noqa: E402

QUESTIONS = REPO.parent / "shared" / "data" / "spec_bench_question.jsonl"


def _ints(text: str, name: str, ap) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x]
    except ValueError:
        ap.error(f"{name}: expected comma-separated integers, got {text!r}")
    if not out or min(out) < 1:
        ap.error(f"{name} must be integers of at least 1")
    return out


def time_paths(ff, lengths: list[int], repeats: int) -> dict:
    """Median ms of one prefill of ``ff`` (a ``FastForward``) through each path, per prompt length, and
    the path its ``forward`` takes for a prompt on an empty cache."""
    import torch

    from lookupdec.prefill import chunked_prefill, sdpa_prefill

    out = {}
    for n in lengths:
        ids, positions = torch.randint(100, ff.vocab - 1, (n,)), torch.arange(n)
        path = {}

        def prefill():
            path["run"](ff, ff.new_cache(n + 8), ids, positions)

        out[str(n)] = alternated_ms(prefill, {"sdpa": lambda: path.update(run=sdpa_prefill),
                                              "chunks": lambda: path.update(run=chunked_prefill)}, repeats)
    return {"default": "chunks" if ff.rows_independent else "sdpa", "ms": out}


def time_reuse(dec, questions: list[dict], repeats: int, answer_tokens: int) -> list[dict]:
    """Per prompt: median ms of the public call with reuse and without, and the rows reused."""
    store = dec.prefixes
    rows = []
    other = [{"role": "user", "content": "An unrelated earlier request."}]
    for q in questions:
        first = [{"role": "user", "content": q["turns"][0]}]
        cases = [("first turn", first, other)]
        if len(q["turns"]) > 1:
            answer = dec.generate(first, method="ar", max_new_tokens=answer_tokens).text
            cases.append(("second turn", first + [{"role": "assistant", "content": answer},
                                                  {"role": "user", "content": q["turns"][1]}], first))
        for kind, prompt, before in cases:
            ids = dec.encode(prompt)
            seen = {}

            def call():
                seen["cached"] = dec.generate(ids, method="ar", max_new_tokens=1, remember=False).cached_tokens

            def with_reuse():
                dec.prefixes = store
                store.clear()
                dec.generate(before, method="ar", max_new_tokens=answer_tokens if kind == "second turn" else 1)

            ms = alternated_ms(call, {"reuse": with_reuse, "none": lambda: setattr(dec, "prefixes", None)}, repeats)
            call()  # alternated_ms leaves the first variant set: the reuse this prompt gets
            rows.append({"question": q["question_id"], "category": q["category"], "case": kind,
                         "prompt_tokens": len(ids), "reused_tokens": seen["cached"], "ms": ms})
    dec.prefixes = store
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="quantized,float32", help="comma list of the paths' weight formats")
    ap.add_argument("--lengths", default="128,512,1024", help="prompt lengths of the paths (tokens)")
    ap.add_argument("--questions", type=Path, default=QUESTIONS, help="Spec-Bench question.jsonl")
    ap.add_argument("--every", type=int, default=40, help="reuse: every N-th question (480 / 40 = 12)")
    ap.add_argument("--answer-tokens", type=int, default=128, help="reuse: ar's first-turn answer before a second turn")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls of each variant")
    ap.add_argument("--skip", choices=("paths", "reuse"), default=None, help="leave one part out")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    lengths = _ints(args.lengths, "--lengths", ap)
    if args.threads < 1 or args.repeats < 1 or args.every < 1 or args.answer_tokens < 1:
        ap.error("--threads, --repeats, --every and --answer-tokens must be at least 1")
    weights = [w for w in args.weights.split(",") if w]
    from lookupdec.products import WEIGHT_FORMATS

    bad = [w for w in weights if w not in WEIGHT_FORMATS]
    if bad or not weights:
        ap.error(f"--weights: choose from {', '.join(WEIGHT_FORMATS)}, got {args.weights!r}")
    if args.skip != "reuse":
        try:
            questions = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            ap.error(f"--questions: cannot read {args.questions}: {exc}")
        questions = questions[::args.every]

    import torch

    from lookupdec import Decoder
    from lookupdec.costs import device_description

    torch.set_num_threads(args.threads)
    result = {"device": device_description("cpu"), "threads": args.threads}
    dec = Decoder(weights="quantized")  # the embedded model, its file's blocks read
    if args.skip != "paths":
        result["paths"] = {}
        for w in weights:
            ff = dec.verifier.fast if w == "quantized" else Decoder(weights=w, prefix_cache_mb=0).verifier.fast
            result["paths"][w] = time_paths(ff, lengths, args.repeats)
    if args.skip != "reuse":
        result["reuse"] = time_reuse(dec, questions, args.repeats, args.answer_tokens)
    print_and_write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
