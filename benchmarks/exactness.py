"""Exactness audit: many generations of every method (greedy, or seeded sampled), each compared with ``ar``.

Prompts (``prompt_set``), in a fixed order from a seed:

- Spec-Bench's questions (first turns, chat template; the documents inside
  summarization and RAG prompts passed as references);
- the code workload (benchmarks/data/code_questions.jsonl);
- repetitive text (lists and refrains the model continues, where drafts are
  long and accepted often);
- plain completions without the chat template (Spec-Bench text cut mid-sentence).

Lengths cycle through ``LENGTHS`` (up to 512 new tokens). With ``--second-turns`` each chat
prompt also gets its next turn (the first turn, ``ar``'s answer, a follow-up). Every method the
decoder registers runs on every prompt, with the inputs it needs: the
prompt's references, a datastore (``--index``), a history store that fills as
the audit runs. A method's output that differs from ``ar``'s is a mismatch;
for each, the audit reports where, both tokens, and ``ar``'s top-1/top-2
logit gap at the flip (computed by the decoder's own verifier: a tiny gap
says rounding decided it). ``ar``, the reference, runs with the decoder's prefix store set aside
(every prompt row prefilled afresh) and every method with it, so rows reused from earlier
generations (a second turn's first turn, above all) are audited as well.

It also measures how often the same tree node's logits row differs bitwise
between verify forwards of different widths (1 to 32): the rounding that a
width-dependent kernel introduces, and how often it changes an argmax.

Usage:
    python benchmarks/exactness.py --n 500 --json benchmarks/out/exactness.json [--index DIR]
    python benchmarks/exactness.py --n 120 --threads 1 --part 0/2 --json a.json &   # two cores, two halves
    python benchmarks/exactness.py --n 120 --threads 1 --part 1/2 --json b.json
    python benchmarks/exactness.py --n 40 --dtype bfloat16 --json benchmarks/out/exactness_bf16.json
    python benchmarks/exactness.py --n 300 --weights float16 --draft-layers 8 --json benchmarks/out/exactness_fp16.json
    python benchmarks/exactness.py --model path/to/tiny --n 20 --max-len 32      # a quick check
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from specbench.documents import extract_documents  # noqa: E402
from specbench.tasks import DEFAULT_QUESTIONS as QUESTIONS, task_of  # noqa: E402

CODE_QUESTIONS = HERE / "data" / "code_questions.jsonl"
# New tokens per prompt, cycled: most generations short, some long.
LENGTHS = (64, 128, 32, 256, 64, 128, 512, 64, 128, 32)
# The question file is grouped by task (80 questions each); stepping through it by this stride
# (coprime with 480) puts every task among the first dozen Spec-Bench prompts.
QUESTION_STRIDE = 83
# The user's next message of a second turn (--second-turns).
FOLLOW_UP = "Thank you. Now say it again more briefly."
REFRAINS = ["one two three four", "red, green, blue;", "the quick brown fox jumps over the lazy dog.",
            "1 1 2 3 5 8 13 21", "Monday Tuesday Wednesday Thursday Friday", "la la la, lo lo lo"]


@dataclass(frozen=True)
class Prompt:
    kind: str                    # specbench:<task>, code, repetitive, completion
    text: str
    chat: bool                   # apply the chat template
    references: tuple[str, ...]  # documents inside the prompt (LLMA)
    max_new: int


@dataclass
class Mismatch:
    method: str
    prompt: int
    kind: str
    position: int   # index of the first differing new token
    ar_token: int
    token: int
    gap: float      # ar's top-1 minus top-2 logit at that position


@dataclass
class MethodTally:
    generations: int = 0
    tokens: int = 0
    mismatches: list = field(default_factory=list)


def prompt_set(n: int, seed: int = 0, max_len: int = 512, questions: Path = QUESTIONS) -> list[Prompt]:
    """``n`` prompts of the four kinds, interleaved, lengths from ``LENGTHS`` (capped at ``max_len``);
    the Spec-Bench ones from ``questions``."""
    rng = np.random.default_rng(seed)
    qs = [json.loads(line) for line in Path(questions).read_text(encoding="utf-8").splitlines() if line.strip()]
    code = [json.loads(line) for line in CODE_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    out: list[Prompt] = []
    i = 0
    while len(out) < n:
        length = min(LENGTHS[len(out) % len(LENGTHS)], max_len)
        kind = len(out) % 8
        if kind < 5:  # Spec-Bench, most of the set; a stride coprime with 480 visits every task early
            q = qs[(i * QUESTION_STRIDE) % len(qs)]
            task = task_of(q["category"])
            text = q["turns"][0]
            out.append(Prompt(f"specbench:{task}", text, True, extract_documents(task, text), length))
        elif kind == 5:
            out.append(Prompt("code", code[i % len(code)]["turns"][0], True, (), length))
        elif kind == 6:
            r = REFRAINS[i % len(REFRAINS)]
            text = f"Continue this pattern for a while: {r} {r} {r}"
            out.append(Prompt("repetitive", text, bool(rng.integers(0, 2)), (), length))
        else:
            q = qs[(i * 7) % len(qs)]["turns"][0]
            cut = max(20, int(len(q) * rng.uniform(0.3, 0.8)))
            out.append(Prompt("completion", q[:cut], False, (), length))
        i += 1
    return out


def _fitting(decoder, p: Prompt, max_new: int | None = None) -> list[int]:
    """The prompt's ids, cut (from the end) to leave room for the new tokens in the model's context."""
    ids = decoder.encode(p.text, chat_template=p.chat)
    room = decoder.loaded.max_context - (p.max_new if max_new is None else max_new)
    return ids[:max(room, 1)]


def flip_gap(decoder, prompt_ids: list[int], ar_tokens: list[int], position: int) -> float:
    """ar's top-1 minus top-2 logit before new token ``position`` (the verifier's own kernels)."""
    import torch

    ids = list(prompt_ids) + list(ar_tokens[:position])
    cache = decoder.verifier.new_cache(len(ids) + 4)
    with torch.inference_mode():
        logits = decoder.verifier.prefill(cache, ids)
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def _without_reuse(decoder, ids: list[int], **kw):
    """``ar`` with the decoder's prefix store set aside: every prompt row prefilled afresh (the
    reference a reused row must reproduce); the store is left as it was."""
    store = decoder.prefixes
    decoder.prefixes = None
    try:
        return decoder.generate(ids, method="ar", **kw)
    finally:
        decoder.prefixes = store


def second_turn(decoder, p: Prompt, answer: str) -> list[int]:
    """A chat prompt's next turn: the first turn, ``answer`` as the assistant's, and a follow-up
    (cut from the start to leave room for the new tokens)."""
    ids = decoder.encode([{"role": "user", "content": p.text}, {"role": "assistant", "content": answer},
                          {"role": "user", "content": FOLLOW_UP}])
    room = decoder.loaded.max_context - p.max_new
    return ids[-max(room, 1):]


def audit(decoder, prompts: list[Prompt], methods: list[str], log=print, temperature: float = 0.0,
          top_p: float = 1.0, second_turns: bool = False) -> dict[str, MethodTally]:
    """Every method on every prompt it can take, compared with ``ar``.

    With ``temperature`` > 0 every generation samples, prompt ``i`` with seed ``i``: each method
    with deterministic drafts must emit sampled ``ar``'s tokens (README "What is guaranteed").
    ``ar`` runs with the decoder's prefix store (``decoder.prefixes``) set aside and every method
    with it, so rows reused from earlier generations are audited too. With ``second_turns``, each
    chat prompt also gets a next turn (its first turn, ``ar``'s answer, a follow-up), whose rows
    the methods' first-turn generations left in the store.
    """
    from lookupdec.methods import method_inputs

    tally = {m: MethodTally() for m in methods}
    for pi, p in enumerate(prompts):
        sampling = {"temperature": temperature, "top_p": top_p, "seed": pi} if temperature > 0 else {}
        ids = _fitting(decoder, p)
        for turn in range(2 if second_turns and p.chat else 1):
            if turn:
                ids = second_turn(decoder, p, ref.text)
            ref = _without_reuse(decoder, ids, max_new_tokens=p.max_new, **sampling)
            ar = list(ref.token_ids)
            for m in methods:
                inputs = method_inputs(m)
                if "references" in inputs and m != "auto" and not p.references:
                    continue  # llma drafts from documents only; this prompt has none
                if m in ("rest",) and not decoder.indexes:
                    continue
                if m == "history" and decoder.history is None:
                    continue
                refs = list(p.references) if p.references and "references" in inputs else None
                out = list(decoder.generate(ids, method=m, max_new_tokens=p.max_new, references=refs,
                                            **sampling).token_ids)
                t = tally[m]
                t.generations += 1
                t.tokens += len(out)
                if out != ar:
                    pos = next((k for k, (a, b) in enumerate(zip(ar, out)) if a != b), min(len(ar), len(out)))
                    a_tok = ar[pos] if pos < len(ar) else -1
                    b_tok = out[pos] if pos < len(out) else -1
                    gap = flip_gap(decoder, ids, ar, pos) if pos < len(ar) and not sampling else float("nan")
                    t.mismatches.append(Mismatch(m, pi, p.kind, pos, a_tok, b_tok, gap))
                    log(f"MISMATCH {m} prompt {pi} ({p.kind}) at token {pos}: ar {a_tok}, {m} {b_tok}, gap {gap:.3g}")
        if (pi + 1) % 10 == 0 or pi + 1 == len(prompts):
            done = sum(t.generations for t in tally.values())
            bad = sum(len(t.mismatches) for t in tally.values())
            log(f"[{pi + 1}/{len(prompts)}] {done} generations compared, {bad} mismatches")
    return tally


def width_rows(decoder, prompts: list[Prompt], widths=range(1, 33), positions: int = 24) -> dict:
    """How often a logits row differs bitwise across verify widths.

    For each prompt and each of ``ar``'s first ``positions`` tokens, the step is
    verified at every width w, the tree being a chain of the w - 1 true next
    tokens. Two rows are compared with the same row at the smallest width: the
    root's (row 0; width 1 is the plain decoding step) and the first node's
    (row 1; from width 2). Counts rows that differ in any bit, and argmax changes.
    """
    import torch

    from lookupdec.kvcache import keep_rows
    from lookupdec.tree import DraftTree

    stats = {k: {"compared": 0, "differ": 0, "argmax_changes": 0, "max_abs": 0.0} for k in ("root", "node")}
    top = max(widths)
    for p in prompts:
        ids = _fitting(decoder, p, positions + top)
        ar = list(decoder.generate(ids, method="ar", max_new_tokens=positions + top).token_ids)
        cache = decoder.verifier.new_cache(len(ids) + len(ar) + top + 2)
        with torch.inference_mode():
            decoder.verifier.prefill(cache, ids)
            past = len(ids)
            for pos in range(min(positions, len(ar) - top)):
                base: dict[str, torch.Tensor] = {}
                for w in widths:
                    res = decoder.verifier.forward(cache, past, ar[pos], DraftTree.chain(ar[pos + 1:pos + w]))
                    for name, r in (("root", 0), ("node", 1)):
                        if r >= 1 + len(res.tree):
                            continue
                        row = res.row(r).float().clone()
                        if name not in base:
                            base[name] = row
                            continue
                        st = stats[name]
                        st["compared"] += 1
                        if not torch.equal(row, base[name]):
                            st["differ"] += 1
                            st["max_abs"] = max(st["max_abs"], float((row - base[name]).abs().max()))
                            st["argmax_changes"] += int(row.argmax()) != int(base[name].argmax())
                    keep_rows(cache, past, [])
                decoder.verifier.forward(cache, past, ar[pos], DraftTree.empty())  # advance one true token
                decoder.verifier.commit(cache, past, ())
                past += 1
    return {"widths": [min(widths), top], "positions": positions, **stats}


def main(argv=None) -> int:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)
    from lookupdec.weights import WEIGHTS_CHOICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500, help="prompts (each run by every method)")
    ap.add_argument("--questions", type=Path, default=QUESTIONS, help="Spec-Bench question.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-len", type=int, default=512, help="cap on new tokens per prompt")
    ap.add_argument("--methods", default="all", help="comma list, or 'all' registered methods but ar")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--hf-kernels", action="store_true", help="transformers' forward instead of the fast one")
    ap.add_argument("--weights", default="float32", choices=WEIGHTS_CHOICES,
                    help="the fast forward's weight format (ar and every method run in it)")
    ap.add_argument("--kv-dtype", default="float32", choices=KV_DTYPES,
                    help="the KV cache's element type (ar and every method run with it)")
    ap.add_argument("--index", action="append", default=[], help="a datastore for rest and auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--draft-layers", type=int, default=None, metavar="K",
                    help="audit method draft (and auto with it) with the model cut to its first K layers as the "
                         "draft; without it, 'all' leaves draft out (it needs a draft model)")
    ap.add_argument("--width-prompts", type=int, default=8, help="prompts for the bitwise width check (0: skip)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (prompt i with seed i); 'draft' is left out (its sampled "
                         "drafts are not tied to the seed)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--second-turns", action="store_true",
                    help="give each chat prompt a next turn too (its first turn, ar's answer, a follow-up): its "
                         "first turn's rows come from the prefix store (Decoder(prefix_cache_mb=...))")
    ap.add_argument("--prefix-cache-mb", type=float, default=None,
                    help="the decoder's prefix store (default: the decoder's, on in the quantized formats); "
                         "ar, the reference, always runs without it")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--part", default="0/1", metavar="I/K",
                    help="run only prompts I, I+K, I+2K, ... (K processes, one core each, split one audit)")
    args = ap.parse_args(argv)

    import torch

    from lookupdec.costs import device_description
    from lookupdec.decoder import Decoder
    from lookupdec.methods import METHODS

    if args.threads:
        torch.set_num_threads(args.threads)
    # Method draft needs a draft model: in 'all' only when one is given.
    methods = [m for m in METHODS if m != "ar" and (m != "draft" or args.draft_layers is not None)] \
        if args.methods == "all" else \
        [m.strip() for m in args.methods.split(",") if m.strip() and m.strip() != "ar"]
    if not args.questions.is_file():
        ap.error(f"Spec-Bench questions not found at {args.questions}; pass --questions FILE")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown methods {unknown}; registered: {sorted(METHODS)}")
    if args.temperature > 0:
        methods = [m for m in methods if m != "draft"]
    if "draft" in methods and args.draft_layers is None:
        ap.error("method draft needs a draft model: add --draft-layers K")
    try:
        part, parts = (int(x) for x in args.part.split("/"))
        if not 0 <= part < parts:
            raise ValueError
    except ValueError:
        ap.error(f"--part must be I/K with 0 <= I < K, got {args.part!r}")
    prompts = prompt_set(args.n, args.seed, args.max_len, args.questions)[part::parts]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as history:
        dec = Decoder(args.model, dtype=args.dtype, hf_kernels=args.hf_kernels, weights=args.weights,
                      indexes=list(args.index) or None, history=history, draft_layers=args.draft_layers,
                      prefix_cache_mb=args.prefix_cache_mb, kv_dtype=args.kv_dtype)
        print(f"{len(prompts)} prompts, methods {methods}, {args.dtype}, weights {dec.weights or '-'}, "
              f"KV cache {args.kv_dtype}, "
              f"backend {dec.verifier.backend}, prefix reuse {'on' if dec.prefixes else 'off'}, "
              f"{torch.get_num_threads()} threads", file=sys.stderr)
        tally = audit(dec, prompts, methods, log=lambda s: print(s, file=sys.stderr, flush=True),
                      temperature=args.temperature, top_p=args.top_p, second_turns=args.second_turns)
        widths = width_rows(dec, prompts[:args.width_prompts]) if args.width_prompts else {}
    seconds = time.perf_counter() - t0
    print(f"\n{'method':10} {'generations':>11} {'tokens':>8} {'mismatches':>10}  gaps at the flips")
    for m, t in tally.items():
        gaps = ", ".join(f"{x.gap:.3g}" for x in t.mismatches) or "-"
        print(f"{m:10} {t.generations:>11} {t.tokens:>8} {len(t.mismatches):>10}  {gaps}")
    for name in ("root", "node"):
        if widths and widths[name]["compared"]:
            st = widths[name]
            print(f"{name} rows across widths {widths['widths'][0]}-{widths['widths'][1]}: {st['differ']} of "
                  f"{st['compared']} differ bitwise from the smallest width (max |diff| {st['max_abs']:.3g}), "
                  f"{st['argmax_changes']} argmax changes")
    print(f"{seconds:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                       "backend": dec.verifier.backend, "prefix_reuse": dec.prefixes is not None, "weights_used": dec.weights, "machine": device_description(dec.verifier.device),
                       "torch": torch.__version__, "seconds": seconds},
            "methods": {m: {"generations": t.generations, "tokens": t.tokens,
                            "mismatches": [asdict(x) for x in t.mismatches]} for m, t in tally.items()},
            "widths": widths,
        }, indent=1))
    return 1 if any(t.mismatches for t in tally.values()) and args.dtype == "float32" else 0


if __name__ == "__main__":
    sys.exit(main())
