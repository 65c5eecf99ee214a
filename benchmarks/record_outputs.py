"""Record a model's greedy outputs on Spec-Bench questions, for offline replay.

Each line of the output JSONL is one generation::

    {"question_id": 81, "task": "mt_bench", "category": "writing", "turn": 0,
     "prompt_ids": [...], "output_ids": [...], "references": [[...], ...],
     "topk_ids": [[...], ...], "topk_probs": [[...], ...]}

``prompt_ids`` is the chat-templated prompt exactly as the model saw it,
``output_ids`` the greedy continuation (ending with EOS when the model stopped
by itself), and ``references`` the token ids of the documents inside the
turn's prompt (``specbench.documents``: the article of summarization, the
passages of RAG; empty for other tasks), which ``llma`` and ``auto`` draft from. mt_bench questions have two turns; the second turn's prompt holds
the first question, the model's first answer and the second question, as in
Spec-Bench. ``topk_ids[j]`` / ``topk_probs[j]`` are the target's
top-k next tokens and their probabilities (softmax of the raw logits, 4
decimals) at the position of ``output_ids[j]`` (its context: the prompt and
``output_ids[:j]``); Token Recycling's replay reads them (``--topk 0`` leaves
them out). ``benchmarks/simulate.py`` replays these records through drafters.

Usage::

    python benchmarks/record_outputs.py --per-category 2 --max-new-tokens 128 \\
        -o benchmarks/out/greedy_pc2_128.jsonl

Greedy decoding uses ``lookupdec.Decoder`` (method ``pld``, whose output is ``ar``'s), or transformers'
``generate(do_sample=False)`` with ``--backend hf``; both give plain greedy
output, which is all the replay needs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests), not run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbench.documents import extract_documents  # noqa: E402
from specbench.tasks import DEFAULT_QUESTIONS, TASKS, task_of  # noqa: E402  (one definition of the tasks)

from lookupdec.prompts import encode_prompt  # noqa: E402


def select_questions(path: Path, per_category: int | None, offset: int = 0,
                     tasks: tuple[str, ...] | None = None) -> list[dict]:
    """Questions ``offset`` to ``offset + per_category`` of each category, in file order.

    Args:
        path: Spec-Bench question JSONL.
        per_category: questions per category (all when None).
        offset: questions of each category skipped first (to extend an earlier recording).
        tasks: keep only these tasks (all when None).

    Example:
        >>> len(select_questions(DEFAULT_QUESTIONS, 2, tasks=("rag", "qa")))
        4
    """
    seen: dict[str, int] = defaultdict(int)
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            if tasks is not None and task_of(q["category"]) not in tasks:
                continue
            i = seen[q["category"]]
            seen[q["category"]] += 1
            if i < offset or (per_category is not None and i >= offset + per_category):
                continue
            out.append(q)
    return out


@dataclass(frozen=True)
class Greedy:
    """A loaded model that decodes greedily: ``run(prompt_ids, max_new) -> new ids``."""

    tokenizer: object
    eos_ids: tuple[int, ...]
    run: object
    name: str
    # logits(ids, rows) -> (len(rows), vocab) logits of those rows of one causal forward over ids
    logits: object = None


def load_greedy(model_name: str | None, backend: str = "lookupdec") -> Greedy:
    """Load the target and a greedy decoding function.

    Args:
        model_name: model name or path; None for the embedded default.
        backend: ``"lookupdec"`` (the decoder's ``pld``: greedy, as ``ar``) or ``"hf"`` (transformers
            ``generate`` on the same loaded model); both give plain greedy output.
    """
    import torch

    from lookupdec.decoder import Decoder

    if backend == "lookupdec":
        dec = Decoder(model_name)
        loaded = dec.loaded

        def run(prompt_ids: list[int], max_new: int) -> list[int]:
            # pld's output is ar's, token for token (tested), in about half the time.
            res = dec.generate(list(prompt_ids), method="pld", max_new_tokens=max_new, chat_template=False)
            return list(res.token_ids)

        def logits(ids: list[int], rows: list[int]):
            # The decoder's own forward (its model's weights may live only in the fast forward).
            v = dec.verifier
            with torch.inference_mode():
                if v.fast is not None:
                    return v.fast.forward(v.fast.new_cache(len(ids)), torch.tensor(ids), torch.arange(len(ids)),
                                          None, rows, causal=True)
                return v.model(torch.tensor([ids], device=v.device)).logits[0, rows]

        return Greedy(loaded.tokenizer, tuple(loaded.eos_ids), run, "lookupdec pld (greedy)", logits)

    from lookupdec.models import load_model

    loaded = load_model(model_name)
    model, eos = loaded.model, tuple(loaded.eos_ids)

    @torch.inference_mode()
    def run(prompt_ids: list[int], max_new: int) -> list[int]:
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=list(eos), pad_token_id=eos[0])
        return out[0, ids.shape[1]:].tolist()

    @torch.inference_mode()
    def logits(ids: list[int], rows: list[int]):
        return model(torch.tensor([ids], device=model.device)).logits[0, rows]

    return Greedy(loaded.tokenizer, eos, run, "transformers generate", logits)


def output_topk(greedy: Greedy, prompt_ids: list[int], output_ids: list[int], k: int) -> tuple[list, list]:
    """The target's top-k ids and probabilities at the position of each output token (see the module docstring)."""
    if not output_ids or k <= 0:
        return [], []
    from lookupdec.verify import topk_rows

    ids = list(prompt_ids) + list(output_ids)
    rows = list(range(len(prompt_ids) - 1, len(ids) - 1))
    top_ids, top_probs = topk_rows(greedy.logits(ids, rows), k)
    return top_ids.tolist(), [[round(float(p), 4) for p in r] for r in top_probs]


def strip_eos(ids: list[int], eos_ids: tuple[int, ...]) -> list[int]:
    """``ids`` cut at the first EOS (the text that goes back into the next turn's context)."""
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[:i]
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--per-category", type=int, default=None, help="first N questions of each category (default all)")
    ap.add_argument("--offset", type=int, default=0, help="skip the first N questions of each category")
    ap.add_argument("--tasks", default=None, help=f"comma-separated subset of {','.join(TASKS)}")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="model name or path (default: the embedded SmolLM2-135M)")
    ap.add_argument("--backend", choices=("lookupdec", "hf"), default="lookupdec",
                    help="greedy decoder: lookupdec (pld, equal to ar) or transformers' generate")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--topk", type=int, default=8,
                    help="record the target's top-k at each output position (Token Recycling's replay; 0: none)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.topk < 0:
        ap.error(f"--topk must be >= 0, got {args.topk}")
    tasks = None
    if args.tasks:
        tasks = tuple(t.strip() for t in args.tasks.split(","))
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            ap.error(f"unknown task(s) {unknown}; choose from {', '.join(TASKS)}")
    questions = select_questions(args.questions, args.per_category, args.offset, tasks)
    greedy = load_greedy(args.model, args.backend)
    print(f"{len(questions)} questions, greedy by {greedy.name}", file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".part")
    t0 = time.perf_counter()
    n_tokens = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for qi, q in enumerate(questions):
            task = task_of(q["category"])
            messages: list[dict] = []
            for turn, text in enumerate(q["turns"]):
                messages.append({"role": "user", "content": text})
                prompt_ids = encode_prompt(greedy.tokenizer, messages)
                output_ids = greedy.run(prompt_ids, args.max_new_tokens)
                n_tokens += len(output_ids)
                refs = [list(greedy.tokenizer(d, add_special_tokens=False)["input_ids"])
                        for d in extract_documents(task, text)]
                rec = {"question_id": q["question_id"], "task": task, "category": q["category"], "turn": turn,
                       "prompt_ids": prompt_ids, "output_ids": output_ids, "references": refs}
                if args.topk > 0:
                    rec["topk_ids"], rec["topk_probs"] = output_topk(greedy, prompt_ids, output_ids, args.topk)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                answer = greedy.tokenizer.decode(strip_eos(output_ids, greedy.eos_ids), skip_special_tokens=True)
                messages.append({"role": "assistant", "content": answer})
            dt = time.perf_counter() - t0
            print(f"[{qi + 1}/{len(questions)}] q{q['question_id']} {task}: {n_tokens} tokens, "
                  f"{n_tokens / dt:.1f} tok/s", file=sys.stderr)
    tmp.replace(args.output)  # a finished file only ever holds complete runs
    return 0


if __name__ == "__main__":
    sys.exit(main())
