"""Structured output with lookup drafts: constrained auto vs constrained ar vs unconstrained.

Three tasks on Spec-Bench's summarization and RAG passages
(``../shared/data/spec_bench_question.jsonl`` beside the checkout, or ``--data``):

- ``extract``: a JSON object whose string values are spans of the document
  (its first sentence, a person, a place, a number), under a JSON Schema;
- ``label``: one topic label from a choice list;
- ``regex``: the first number or date the document mentions, under a regex.

For each task and prompt it runs constrained ``ar``, constrained ``--method``
(default auto; the document is passed as a reference) and unconstrained
``--method``, greedy. It reports per task and run: validity rate (outputs valid
against the task's constraint: JSON parsed and validated with ``jsonschema``,
the label in the list, the regex matched), how many constrained outputs were cut
by ``--max-new-tokens`` before the constraint was complete (``incomplete``: they
cannot be valid; every complete constrained output must be), the share of extracted string values
that are spans of the document, tokens/s, tau (tokens per forward), the share
of wall time spent in the grammar engine, the speedup over constrained ar, and
whether constrained auto equals constrained ar token for token (exit 1 if not).

Usage (from the repository root)::

    .venv/bin/python benchmarks/structured.py --per-category 10 --max-new-tokens 256
    .venv/bin/python benchmarks/structured.py --per-category 1 --max-new-tokens 16   # a quick check

Writes ``structured.json`` and ``structured.md`` into ``--out`` (default
``benchmarks/results/structured``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbench.tasks import DEFAULT_QUESTIONS as DATA  # noqa: E402

EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "first_sentence": {"type": "string", "maxLength": 400},
        "person": {"type": "string", "maxLength": 80},
        "place": {"type": "string", "maxLength": 80},
        "number": {"type": "string", "maxLength": 40},
    },
    "required": ["first_sentence", "person", "place", "number"],
    "additionalProperties": False,
}
LABELS = ["politics", "sports", "science", "business", "health", "crime", "entertainment", "environment", "other"]
NUMBER_RE = (r"(January|February|March|April|May|June|July|August|September|October|November|December) "
             r"[0-9]{1,2}(, [0-9]{4})?|[0-9]{1,3}(,[0-9]{3}){0,4}(\.[0-9]{1,4})?( (percent|million|billion|years))?")
# Every repetition is bounded (up to 10^15, 4 decimals): with an unbounded one the model may write
# digits until max_new_tokens runs out, which leaves the output incomplete, not a number.

TASKS = {
    "extract": ("Read the document and answer with a JSON object with the keys first_sentence (the document's first "
                "sentence, copied exactly), person (a person named in it, copied), place (a place named in it, "
                "copied) and number (a number it mentions, copied).", EXTRACT_SCHEMA),
    "label": ("Read the document and answer with one topic label among: " + ", ".join(LABELS) + ".", LABELS),
    "regex": ("Read the document and answer with the first number or date it mentions, copied exactly.", NUMBER_RE),
}


@dataclass
class Row:
    task: str
    run: str
    prompts: int
    valid: float
    incomplete: int
    span_rate: float | None
    tokens_per_s: float
    tau: float
    engine_share: float
    speedup_vs_constrained_ar: float | None
    exact_vs_constrained_ar: bool | None


def documents(path: str, per_category: int) -> list[str]:
    """The first ``per_category`` summarization and RAG passages (the instruction around them removed)."""
    out, seen = [], {"summarization": 0, "rag": 0}
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        cat = rec.get("category")
        if cat in seen and seen[cat] < per_category:
            text = rec["turns"][0]
            if cat == "summarization":
                text = text.removeprefix("Summarize:").strip()
            else:
                text = text.rsplit("\n", 1)[0].strip()  # the passage without its question
            out.append(text)
            seen[cat] += 1
    return out


def grammar_for(task: str):
    from lookupdec import Regex

    spec = TASKS[task][1]
    return Regex(spec) if task == "regex" else spec


def is_valid(task: str, text: str) -> bool:
    if task == "extract":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), EXTRACT_SCHEMA)
        except Exception:
            return False
        return True
    if task == "label":
        return text in LABELS
    return re.fullmatch(NUMBER_RE, text) is not None


def spans(text: str, doc: str) -> list[bool]:
    try:
        obj = json.loads(text)
    except Exception:
        return []
    return [v in doc for v in obj.values() if isinstance(v, str) and v] if isinstance(obj, dict) else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--per-category", type=int, default=10, help="passages per category (summarization, rag)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tasks", default="extract,label,regex")
    ap.add_argument("--method", default="auto", help="the drafting method compared with ar")
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--max-doc-chars", type=int, default=3000, help="cut documents to this many characters")
    ap.add_argument("--out", default="benchmarks/results/structured")
    args = ap.parse_args(argv)

    from lookupdec.decoder import Decoder

    # Every configuration runs the same prompts: none may find another's rows (prefix reuse off).
    dec = Decoder(args.model, prefix_cache_mb=0)
    dec.cost_curve()
    docs = [d[: args.max_doc_chars] for d in documents(args.data, args.per_category)]
    rows, mismatches = [], 0
    for task in args.tasks.split(","):
        instruction, _ = TASKS[task]
        grammar = grammar_for(task)
        runs = {"constrained ar": ("ar", grammar), f"constrained {args.method}": (args.method, grammar),
                f"unconstrained {args.method}": (args.method, None)}
        acc = {name: {"valid": 0, "spans": [], "tokens": 0, "secs": 0.0, "steps": 0, "engine": 0.0, "ids": [], "incomplete": 0}
               for name in runs}
        for doc in docs:
            messages = [{"role": "user", "content": f"Document:\n{doc}\n\n{instruction}"}]
            for name, (method, g) in runs.items():
                res = dec.generate(messages, method=method, max_new_tokens=args.max_new_tokens, grammar=g,
                                   references=[doc] if method in ("auto", "llma") else None, remember=False)
                a = acc[name]
                a["valid"] += is_valid(task, res.text)
                a["incomplete"] += bool(res.incomplete)
                a["spans"] += spans(res.text, doc) if task == "extract" else []
                a["tokens"] += res.new_tokens
                a["secs"] += res.elapsed_s
                a["steps"] += res.steps
                a["engine"] += res.constraint_s
                a["ids"].append(res.token_ids)
        base = acc["constrained ar"]
        base_tps = base["tokens"] / base["secs"] if base["secs"] else 0.0
        for name, a in acc.items():
            tps = a["tokens"] / a["secs"] if a["secs"] else 0.0
            exact = None
            if name.startswith("constrained") and name != "constrained ar":
                exact = a["ids"] == base["ids"]
                mismatches += not exact
            rows.append(Row(task, name, len(docs), a["valid"] / max(len(docs), 1), a["incomplete"],
                            (sum(a["spans"]) / len(a["spans"])) if a["spans"] else None, tps,
                            a["tokens"] / a["steps"] if a["steps"] else 0.0,
                            a["engine"] / a["secs"] if a["secs"] else 0.0,
                            tps / base_tps if base_tps and name != "constrained ar" else None, exact))
            r = rows[-1]
            print(f"{task:8s} {name:24s} valid {r.valid:6.1%}  incomplete {r.incomplete:2d}  tok/s {r.tokens_per_s:7.1f}  tau {r.tau:5.2f}  "
                  f"engine {r.engine_share:6.2%}  speedup {'' if r.speedup_vs_constrained_ar is None else f'{r.speedup_vs_constrained_ar:.2f}x'}"
                  f"  spans {'' if r.span_rate is None else f'{r.span_rate:.0%}'}"
                  f"  exact {'' if r.exact_vs_constrained_ar is None else r.exact_vs_constrained_ar}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured.json").write_text(json.dumps({"args": vars(args), "rows": [asdict(r) for r in rows]}, indent=1))
    lines = ["| task | run | prompts | valid | incomplete | spans | tokens/s | tau | engine share | speedup vs constrained ar | exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.task} | {r.run} | {r.prompts} | {r.valid:.1%} | {r.incomplete} | "
                     f"{'' if r.span_rate is None else f'{r.span_rate:.0%}'} | {r.tokens_per_s:.1f} | {r.tau:.2f} | "
                     f"{r.engine_share:.2%} | "
                     f"{'' if r.speedup_vs_constrained_ar is None else f'{r.speedup_vs_constrained_ar:.2f}x'} | "
                     f"{'' if r.exact_vs_constrained_ar is None else r.exact_vs_constrained_ar} |")
    (out / "structured.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'structured.json'} and {out / 'structured.md'}")
    if mismatches:
        print(f"{mismatches} constrained runs differ from constrained ar", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
