"""The command line of ``benchmarks/spec_bench.py``: parse, load, run, report."""
from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .documents import DOCUMENT_TASKS
from .exactness import ExactnessCheck, OutputMismatch
from .methods import (LOOKUPDEC_METHODS, PEER_METHODS, REFERENCE_METHOD, STATES, HFGenerate, LookupdecMethod,
                      Method, known_method_names, split_state)
from .metrics import accept_histograms, summarize, turn_shortfalls
from .plots import plot_accept_hist, plot_speedup
from .report import markdown_table, ordered_methods, turn_table, write_json
from .runner import ChatCodec, HFChatCodec, RunConfig, run_benchmark
from .tasks import DEFAULT_QUESTIONS, SPEC_BENCH_TASKS, load_questions

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CODE_QUESTIONS = REPO / "benchmarks" / "data" / "code_questions.jsonl"
DEFAULT_OUT = REPO / "benchmarks" / "out"
# The baseline of the main table; speedups are also given against REFERENCE_METHOD.
BASELINE = "hf"
JSON_NAME, TABLE_NAME = "spec_bench.json", "spec_bench.md"
SPEEDUP_PNG, HIST_PNG = "speedup.png", "accepted_hist.png"


@dataclass(frozen=True)
class Setup:
    """Everything a run needs besides the questions.

    Attributes:
        methods: name -> method, in the order asked for.
        codec: the chat template and decoder of the model's tokenizer.
        eos_ids: ids that end a generation.
        info: facts for the JSON config (model name, versions, threads).
    """

    methods: Mapping[str, Method]
    codec: ChatCodec
    eos_ids: tuple[int, ...]
    info: Mapping[str, object]
    history: object = None  # the decoder's history store, if any (fed each reference answer)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)
    from lookupdec.weights import WEIGHTS_CHOICES

    ap = argparse.ArgumentParser(
        prog="spec_bench.py",
        description="Spec-Bench: speed, accepted tokens and exactness of every method on the same prompts.",
    )
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="Spec-Bench question.jsonl")
    ap.add_argument("--per-category", type=int, default=None, metavar="N",
                    help="first N questions of each of the 13 categories (default: all 480)")
    ap.add_argument("--offset", type=int, default=0, metavar="N",
                    help="skip the first N questions of each category (held-out questions: --offset 1)")
    ap.add_argument("--cost-scale", default=None, metavar="F|all:F",
                    help="start auto from a deliberately wrong cost curve: F makes the cached curve F times as "
                         "steep (c(1) kept), all:F multiplies every time by F; the measured steps correct it")
    ap.add_argument("--cost-refresh", choices=("fit", "measure", "off"), default="fit",
                    help="what the decoder does between requests when measured steps contradict the curve "
                         "(Decoder(cost_refresh=...))")
    ap.add_argument("--tasks", default=None,
                    help="comma list of tasks to run (mt_bench,translation,summarization,qa,math_reasoning,rag, "
                         "and code: the code workload); default: Spec-Bench's six")
    ap.add_argument("--code-questions", type=Path, default=DEFAULT_CODE_QUESTIONS,
                    help="question file of the code task")
    ap.add_argument("--index", action="append", default=[], metavar="DIR",
                    help="a datastore (lookupdec build-index) for rest and auto (repeatable)")
    ap.add_argument("--history", action="store_true",
                    help="a history store for history and auto, filled with each question's reference answer "
                         "once every method has run it (starts empty; a server's store would)")
    ap.add_argument("--draft-model", default=None, metavar="ID|DIR|GGUF",
                    help="a small draft model with the target's tokenizer, for draft and auto")
    ap.add_argument("--draft-layers", type=int, default=None, metavar="K",
                    help="cut the draft model (the target itself without --draft-model) to its first K layers")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prefix-cache-mb", type=float, default=0.0,
                    help="the decoder's prefix reuse (Decoder(prefix_cache_mb=...)); default 0 (off): every method "
                         "runs the same prompts, so with reuse on each method after the first would find its whole "
                         "prompt already prefilled")
    ap.add_argument("--weights", choices=WEIGHTS_CHOICES, default="auto",
                    help="the fast forward's weight format for every lookupdec method (Decoder(weights=...)); "
                         "transformers' peers always run the float32 model")
    ap.add_argument("--kv-dtype", choices=KV_DTYPES, default="float32",
                    help="the KV cache's element type for every lookupdec method (Decoder(kv_dtype=...))")
    ap.add_argument("--methods", default="all",
                    help=f"comma list from {','.join(list(PEER_METHODS) + list(LOOKUPDEC_METHODS))}; "
                         f"'all' = the peers and every method the decoder registers; "
                         f"{REFERENCE_METHOD!r} is always run (the exactness reference)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed generations per turn; times are medians; each repeat starts from the "
                         "drafting state the turn's first started from")
    ap.add_argument("--warmup-tokens", type=int, default=16, help="tokens of each method's warm-up (0: none)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--model", default=None, help="model name or path (default: the embedded SmolLM2-135M)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (0: greedy); lookupdec's outputs are checked against ar's "
                         "either way (sampled: the same seed gives every method but 'draft' ar's tokens); "
                         "transformers' peers are compared only greedy")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every method and turn")
    ap.add_argument("--state", choices=STATES, default="kept",
                    help="what each lookupdec call starts from: kept (what the run's earlier calls taught the one "
                         "decoder, as a server), fresh (nothing learned, as a first CLI call), saved (--state-file, "
                         "read inside each timed call, as a CLI call after earlier ones)")
    ap.add_argument("--state-file", type=Path, default=None, help="the drafting state of --state saved")
    ap.add_argument("--save-state", type=Path, default=None, metavar="FILE",
                    help="save the decoder's drafting state here after the run (with --state kept)")
    ap.add_argument("--keep-going", action="store_true",
                    help="finish the run when an output differs from ar's: every difference is listed at the end "
                         "and the exit status is 1 (for a device whose logits depend on a forward's width, such "
                         "as a GPU, where a sampled draw at a cumulative boundary can flip; see README)")
    return ap.parse_args(argv)


def decoder_method_names() -> list[str] | None:
    """The method names the installed decoder registers (``lookupdec.decoder.METHODS``);
    None when the decoder cannot be imported."""
    try:
        from lookupdec.decoder import METHODS
    except ImportError:
        return None
    return [str(n) for n in METHODS]


def choose_methods(spec: str, available: Sequence[str]) -> list[str]:
    """The methods to run, from ``--methods``, the reference first.

    Args:
        spec: "all" or a comma list of method names; a lookupdec method may carry the state its
            calls start from (``auto@fresh``: ``methods.split_state``), so one run compares them.
        available: the names that can run (``known_method_names``).

    Raises:
        ValueError: naming a method that is unknown or not available, and the available ones.

    Example:
        >>> choose_methods("hf,pld,pld@fresh", ["hf", "hf_pld", "ar", "pld"])
        ['ar', 'hf', 'pld', 'pld@fresh']
    """
    names = list(available) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if split_state(n)[0] not in available or ("@" in n and n.split("@")[0] in PEER_METHODS)]
    if bad:
        unknown = [n for n in bad if n not in PEER_METHODS and n not in LOOKUPDEC_METHODS]
        why = "unknown" if unknown else "not registered by the installed lookupdec decoder"
        raise ValueError(f"method(s) {bad} {why}; choose from {list(available)} or 'all'")
    return [REFERENCE_METHOD] + [n for n in dict.fromkeys(names) if n != REFERENCE_METHOD]


def build_setup(decoder, peer_loaded, names: Sequence[str], temperature: float = 0.0, seed: int = 0,
                state: str = "kept", state_file: Path | None = None) -> Setup:
    """The methods ``names`` over a lookupdec ``Decoder`` and, for the
    transformers peers, a separately loaded model with default kernels (the
    Decoder prepacks its own model's weights).

    Args:
        decoder: a ``lookupdec.Decoder``.
        peer_loaded: a ``lookupdec.models.LoadedModel`` of the same weights, or
            None when no peer is asked for.
        names: the methods to build, in run order.
        state, state_file: what each lookupdec call starts from (``methods.STATES``).

    Raises:
        ValueError: a peer is asked for without ``peer_loaded``.
    """
    import torch
    import transformers

    peers = [n for n in names if n in PEER_METHODS]
    if peers and peer_loaded is None:
        raise ValueError(f"methods {peers} need a separately loaded model (peer_loaded)")
    eos_ids = tuple(int(e) for e in decoder.loaded.eos_ids)
    methods: dict[str, Method] = {}
    for n in names:
        if n in PEER_METHODS:
            methods[n] = HFGenerate(n, peer_loaded.model.eval(), eos_ids, PEER_METHODS[n], temperature, seed)
        else:
            base, own = split_state(n)
            own = own or state
            methods[n] = LookupdecMethod(decoder, base, LOOKUPDEC_METHODS[base], temperature, seed, own,
                                         state_file if own == "saved" else None)
    info = {
        "model": decoder.loaded.name,
        "fast_kernels": bool(getattr(decoder, "fast_kernels", False)),
        "weights": getattr(decoder, "weights", "float32"),
        "kv_dtype": getattr(getattr(getattr(decoder, "verifier", None), "fast", None), "kv_dtype", "float32"),
        "draft_budget": getattr(decoder, "draft_budget", None),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
    return Setup(methods, HFChatCodec(decoder.tokenizer), eos_ids, info, getattr(decoder, "history", None))


def load_setup(args: argparse.Namespace, names: Sequence[str]) -> Setup:
    """Load ``--model`` twice (our Decoder; default kernels for the peers) and build the methods."""
    import torch

    from lookupdec.decoder import Decoder
    from lookupdec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    history = None
    if getattr(args, "history", False):
        import tempfile

        history = tempfile.mkdtemp(prefix="spec-bench-history-")
    decoder = Decoder(args.model, dtype="float32", indexes=list(args.index) or None, history=history,
                      draft_model=getattr(args, "draft_model", None), draft_layers=getattr(args, "draft_layers", None),
                      cost_refresh=getattr(args, "cost_refresh", "fit"), weights=getattr(args, "weights", "auto"),
                      prefix_cache_mb=getattr(args, "prefix_cache_mb", 0.0), kv_dtype=getattr(args, "kv_dtype", "float32"))
    scale = getattr(args, "cost_scale", None)
    if scale:
        from lookupdec.pricing import scaled_curve

        how, _, factor = scale.rpartition(":")
        decoder.use_cost_curve(scaled_curve(decoder.cost_curve(), float(factor), how or "slope"))
    peer = load_model(args.model, dtype="float32") if any(n in PEER_METHODS for n in names) else None
    return build_setup(decoder, peer, names, args.temperature, args.seed, getattr(args, "state", "kept"),
                       getattr(args, "state_file", None))


def main(argv: Sequence[str] | None = None,
         setup: Callable[[argparse.Namespace, Sequence[str]], Setup] = load_setup,
         available: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 on an output mismatch, 2 on bad arguments.

    Args:
        argv: command-line arguments (``sys.argv[1:]`` when None).
        setup: builds the methods; tests pass fakes here.
        available: the method names that can run; None = the peers and
            every method the installed decoder registers.
    """
    args = parse_args(argv)
    try:
        tasks = list(SPEC_BENCH_TASKS) if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
        if available is None:
            available = known_method_names(decoder_method_names())
            asked = [s.strip() for s in args.methods.split(",")]
            drafts = args.draft_model is not None or args.draft_layers is not None
            for name, flag, given in (("rest", "--index DIR", args.index), ("history", "--history", args.history),
                                      ("draft", "--draft-model or --draft-layers", drafts)):
                if not given:  # these methods draft only from what the flag gives them
                    if name in asked:
                        raise ValueError(f"method {name!r} needs {flag}")
                    available = [n for n in available if n != name]
            no_documents = [t for t in tasks if t not in DOCUMENT_TASKS]
            if no_documents:  # llma drafts only from a prompt's documents, and the library refuses it without any
                if "llma" in asked:
                    raise ValueError(f"method 'llma' needs documents, which only {', '.join(DOCUMENT_TASKS)} prompts "
                                     f"carry; tasks {no_documents} have none: run llma with --tasks "
                                     f"{','.join(DOCUMENT_TASKS)} (auto drafts from the documents on every task)")
                available = [n for n in available if n != "llma"]
        names = choose_methods(args.methods, available)
        questions = load_questions(args.questions, args.per_category, [t for t in tasks if t != "code"] or None,
                                   args.offset) if any(t != "code" for t in tasks) else []
        if "code" in tasks:
            questions += load_questions(args.code_questions, args.per_category, ["code"], args.offset)
        if args.cost_scale:
            how, _, factor = args.cost_scale.rpartition(":")
            if how not in ("", "all") or not factor.replace(".", "", 1).isdigit() or float(factor) <= 0:
                raise ValueError(f"--cost-scale takes F or all:F with F > 0, got {args.cost_scale!r}")
        if not questions:
            raise ValueError("no questions selected")
        if args.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
        saved = args.state == "saved" or any(split_state(n)[1] == "saved" for n in names)
        if saved != (args.state_file is not None):
            raise ValueError("--state saved (or a method@saved) needs --state-file FILE, and --state-file needs one")
        if args.state_file is not None and not args.state_file.is_file():
            raise ValueError(f"--state-file {args.state_file}: no such file")
        if args.save_state is not None and args.state != "kept":
            raise ValueError("--save-state saves what one decoder learned over the run: it needs --state kept")
        config = RunConfig(args.max_new_tokens, args.repeats, args.warmup_tokens, sampled=args.temperature > 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"spec_bench: error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    env = setup(args, names)
    load_s = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    run_config = {
        "argv": list(sys.argv[1:] if argv is None else argv),
        "questions": str(args.questions), "per_category": args.per_category, "tasks": args.tasks,
        "offset": args.offset, "cost_scale": args.cost_scale, "cost_refresh": args.cost_refresh,
        "indexes": [str(p) for p in args.index], "history": bool(args.history),
        "draft_model": args.draft_model, "draft_layers": args.draft_layers,
        "n_questions": len(questions), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "warmup_tokens": args.warmup_tokens, "methods": list(env.methods), "reference": REFERENCE_METHOD,
        "temperature": args.temperature, "seed": args.seed, "state": args.state,
        "state_file": None if args.state_file is None else str(args.state_file),
        "eos_ids": list(env.eos_ids), **env.info,
    }
    print(f"spec_bench: {len(questions)} questions, methods {', '.join(env.methods)}, "
          f"max_new_tokens {args.max_new_tokens}, repeats {args.repeats} (loaded in {load_s:.1f} s)",
          file=sys.stderr)

    records: list = []
    mismatches: list[OutputMismatch] | None = [] if args.keep_going else None
    check = ExactnessCheck(REFERENCE_METHOD, env.eos_ids)
    t1 = time.perf_counter()
    try:
        store = getattr(env, "history", None)
        run_benchmark(questions, env.methods, env.codec, check, config, records=records,
                      log=lambda line: print(line, file=sys.stderr, flush=True),
                      on_answer=None if store is None else store.append,
                      mismatches=mismatches)
    except OutputMismatch as exc:
        run_config["run_s"] = time.perf_counter() - t1
        path = write_json(args.out / JSON_NAME, run_config, records, error=str(exc))
        print(f"spec_bench: FAILED: {exc}\nspec_bench: partial figures in {path}", file=sys.stderr)
        return 1
    run_config["run_s"] = time.perf_counter() - t1
    decoder = next((m.decoder for m in env.methods.values() if hasattr(m, "decoder")), None)
    if args.save_state is not None and decoder is not None:
        t2 = time.perf_counter()
        saved = decoder.save_state(args.save_state)
        run_config["save_state_ms"] = (time.perf_counter() - t2) * 1e3
        print(f"spec_bench: drafting state {'saved to' if saved else 'NOT saved to'} {args.save_state} "
              f"({run_config['save_state_ms']:.0f} ms)", file=sys.stderr)

    baseline = BASELINE if BASELINE in env.methods else REFERENCE_METHOD
    summaries = {baseline: summarize(records, baseline)}
    if baseline != REFERENCE_METHOD:
        summaries[REFERENCE_METHOD] = summarize(records, REFERENCE_METHOD)
    order = ordered_methods(records, [baseline] + list(env.methods))
    table = markdown_table(summaries[baseline], order, summaries.get(REFERENCE_METHOD)
                           if baseline != REFERENCE_METHOD else None)
    turns = turn_shortfalls(records, REFERENCE_METHOD)
    table += "\n" + turn_table(turns, order)
    write_json(args.out / JSON_NAME, run_config, records, summaries,
               error="\n".join(str(e) for e in mismatches) if mismatches else None, turns=turns)
    (args.out / TABLE_NAME).write_text(table, encoding="utf-8")
    plot_speedup(summaries[baseline], order, args.out / SPEEDUP_PNG)
    plot_accept_hist(accept_histograms(records), order, args.out / HIST_PNG)
    print(table)
    same = f"all outputs equal {REFERENCE_METHOD!r}'s" if not config.sampled else \
        f"sampled at temperature {args.temperature}; lookupdec outputs equal {REFERENCE_METHOD!r}'s (except " \
        f"'draft''s, and transformers' peers, not compared)"
    if mismatches:
        for exc in mismatches:
            print(f"spec_bench: {exc}", file=sys.stderr)
        print(f"spec_bench: FAILED: {len(mismatches)} output(s) differ from {REFERENCE_METHOD!r}'s (listed above); "
              f"wrote {args.out / JSON_NAME}, {TABLE_NAME}", file=sys.stderr)
        return 1
    print(f"spec_bench: {same}; {len(questions)} questions in "
          f"{run_config['run_s']:.0f} s; wrote {args.out / JSON_NAME}, {TABLE_NAME}, {SPEEDUP_PNG}, {HIST_PNG}",
          file=sys.stderr)
    return 0
