"""What the small-LM fallback costs and gets accepted, for a target and its draft cut to K layers.

There is no smaller model with the embedded model's tokenizer offline, so the
pair measured is the embedded model as target and its own first K layers as
draft (``Decoder(draft_layers=K)``). Per K, on the first turn of the chosen
Spec-Bench questions, greedy: ``ar`` and ``draft`` (the small LM alone);
reported: the draft's ms per drafted token next to the target's one-row
forward ``c(1)`` (the cost curve), tau (tokens per target forward), the mean
accepted draft tokens per drafted step, and draft's time against ar's;
then the same with the depth forced (``--force-depth D``: a chain of D plus
the top-2 sibling every step, no gate), which measures the draft's acceptance
on every step rather than only where the gate lets it draft.
Outputs are checked equal to ``ar``'s.

    python benchmarks/small_lm_pair.py --layers 4,8,15 --per-category 1 --tasks mt_bench,qa --max-new-tokens 64
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.specbench.cli import DEFAULT_QUESTIONS  # noqa: E402
from benchmarks.specbench.runner import HFChatCodec  # noqa: E402
from benchmarks.specbench.tasks import load_questions  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="4,8,15", help="comma list of K")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--tasks", default="mt_bench,qa")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--force-depth", type=int, default=4)
    args = ap.parse_args(argv)
    import torch

    from lookupdec.decoder import Decoder
    from lookupdec.drafters.small_lm import SmallLMConfig, SmallLMDrafter
    from lookupdec.models import load_model

    questions = load_questions(args.questions, args.per_category, args.tasks.split(","))
    target = load_model(None)
    print(f"{len(questions)} questions, {args.max_new_tokens} tokens, threads {torch.get_num_threads()}")
    print(f"{'K':>3} {'draft ms/tok':>12} {'c(1) ms':>8} {'ratio':>6} {'tau':>5} {'acc/drafted step':>16} "
          f"{'draft s':>8} {'ar s':>6} | forced depth {args.force_depth}: {'tau':>5} {'acc/step':>8} {'s':>6}")
    for k in [int(x) for x in args.layers.split(",")]:
        # Every configuration runs the same prompts: none may find another's rows (prefix reuse off).
        dec = Decoder(target, draft_layers=k, prefix_cache_mb=0)
        codec = HFChatCodec(dec.tokenizer)
        c1 = dec.cost_curve().ms_at(1)
        steps = new = drafted_steps = drafted_acc = 0
        t_draft = t_ar = t_forced = 0.0
        f_steps = f_new = f_acc = f_drafted = 0
        ms = []
        for q in questions:
            ids = codec.encode([{"role": "user", "content": q.turns[0]}])
            dec.generate(ids, method="ar", max_new_tokens=8, chat_template=False)  # warm-up
            t = time.perf_counter()
            ar = dec.generate(ids, method="ar", max_new_tokens=args.max_new_tokens, chat_template=False)
            t_ar += time.perf_counter() - t
            t = time.perf_counter()
            out = dec.generate(ids, method="draft", max_new_tokens=args.max_new_tokens, chat_template=False)
            t_draft += time.perf_counter() - t
            if out.token_ids != ar.token_ids:
                print(f"MISMATCH on question {q.question_id}", file=sys.stderr)
                return 1
            forced = SmallLMDrafter(dec.draft, calibration=dec.calibration,
                                    config=SmallLMConfig(default_depth=args.force_depth))
            t = time.perf_counter()
            fo = dec.generate(ids, drafter=forced, max_new_tokens=args.max_new_tokens, chat_template=False)
            t_forced += time.perf_counter() - t
            if fo.token_ids != ar.token_ids:
                print(f"MISMATCH (forced) on question {q.question_id}", file=sys.stderr)
                return 1
            f_steps += fo.steps
            f_new += fo.new_tokens
            f_acc += sum(s.accepted for s in fo.step_stats)
            f_drafted += sum(1 for s in fo.step_stats if s.draft_size)
            steps += out.steps
            new += out.new_tokens
            for s in out.step_stats:
                if s.draft_size:
                    drafted_steps += 1
                    drafted_acc += s.accepted
            ms.append(dec.draft.ms_per_token)
        d_ms = statistics.median(ms)
        print(f"{k:>3} {d_ms:>12.2f} {c1:>8.2f} {d_ms / c1:>6.2f} {new / steps:>5.2f} "
              f"{drafted_acc / max(drafted_steps, 1):>16.2f} {t_draft:>8.2f} {t_ar:>6.2f} | {'':>14} "
              f"{f_new / f_steps:>5.2f} {f_acc / max(f_drafted, 1):>8.2f} {t_forced:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
