"""A deferred load against an eager one: the same tokens, on Spec-Bench questions.

``Decoder(weights="quantized")`` loads the embedded model with its matrices left unread
(``lookupdec.deferred``): the products read the GGUF's blocks from the file and the embedding rows
are dequantized from its blocks. ``Decoder(load_model(), weights="quantized")`` is handed the eager
float32 model, whose blocks are recovered from those float32 values (``blocks.find_blocks``). This
runs both on every ``--every``-th Spec-Bench question's first turn with each method and counts the
generations whose tokens differ (greedy).

Usage:
    python benchmarks/deferred_exactness.py [--questions 40] [--every 12] [--max-new-tokens 64]
                                            [--methods ar,auto] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from specbench.tasks import DEFAULT_QUESTIONS, load_questions  # noqa: E402  (torch-free)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions-file", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--questions", type=int, default=40, help="how many questions")
    ap.add_argument("--every", type=int, default=12, help="take every N-th question of the file")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", default="ar,auto")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from lookupdec import Decoder
    from lookupdec.costs import device_description
    from lookupdec.models import load_model

    torch.set_num_threads(args.threads)
    questions = load_questions(args.questions_file)[::args.every][:args.questions]
    deferred = Decoder(weights="quantized")
    eager = Decoder(load_model(), weights="quantized")
    if deferred.loaded.deferred is None or not deferred.loaded.deferred.pending:
        print("the deferred decoder read its matrices: nothing to compare", file=sys.stderr)
        return 1
    methods = args.methods.split(",")
    differ = []
    for q in questions:
        messages = [{"role": "user", "content": q.turns[0]}]
        for method in methods:
            a = deferred.generate(messages, method=method, max_new_tokens=args.max_new_tokens).token_ids
            b = eager.generate(messages, method=method, max_new_tokens=args.max_new_tokens).token_ids
            if a != b:
                differ.append((q.question_id, method))
    print(json.dumps({"device": device_description(deferred.verifier.device), "threads": args.threads,
                      "generations": len(questions) * len(methods), "differ": len(differ),
                      "which": differ}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
