"""Load benchmark of `lookupdec serve`: throughput and latency at several concurrencies.

For each server configuration (its own `lookupdec serve` process, all of them up for the whole run):

- ``auto``: speculation on (method auto), requests batched (``--max-batch``);
- ``ar``: plain decoding batched (method ar: speculation off);
- ``one``: method auto one request at a time (``--max-batch 1``);
- ``auto_noreuse``, ``ar_noreuse``: ``auto`` and ``ar`` with prefix reuse off (``--prefix-cache-mb 0``):
  every prompt prefilled in full;
- ``llama_cpp`` (peer, only when ``--llama-cpp-python`` names an interpreter with
  ``llama-cpp-python[server]``): llama.cpp's own OpenAI server on the same GGUF, same threads,
  plain decoding (it serves one request at a time; its stream carries no usage, so its tokens
  are counted as content chunks, one token each),

Spec-Bench prompts (the first turn of ``--per-category`` questions per category) are sent as
streamed chat completions with the official ``openai`` client by ``c`` worker threads, for every
concurrency ``c``, greedy. With ``--conversations`` each worker takes a whole question instead,
every turn in order, as Spec-Bench runs its multi-turn (MT-bench) questions: each turn's request
carries the conversation so far, the server's own earlier answers included. Each concurrency runs
the configurations back to back, ``--rounds`` times over (their order alternating by round), so a
machine whose speed drifts weighs on every configuration alike; ``--fresh-prompts`` gives every
(round, concurrency) pass its own questions, so no request repeats one the server has learnt from.
The servers start with ``--fresh-state`` (nothing learnt by earlier runs on the machine) unless
``--saved-state`` is given. Reported per (configuration, concurrency, round): output tokens/s over
the run's wall time, p50/p99 time to first token, p50/p99 time per output token (after the first),
tau (tokens committed per sequence per verify forward, from the server's /metrics), the server's
batched steps (count, mean step and forward time, and the share of the wall time inside steps: the
rest is prefill, admission and HTTP), the share of prompt tokens whose rows an earlier request left
(prefix reuse, not prefilled), and whether every output equals ``ar``'s first output for the
same prompt (``ar_kv16``'s for the float16-cache configurations; reported; a batch's wider forward carries
the same float-rounding caveat as a tree, see README); then each configuration's tokens/s over ``ar``'s in
the same pass.

Writes ``serve_load.json``, ``serve_load.md`` and the plot ``serve_load_throughput.png``
(throughput against concurrency; ``--plot`` puts it elsewhere) into ``--out``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/serve_load.py --per-category 2 --max-new-tokens 128
    .venv/bin/python benchmarks/serve_load.py --per-category 1 --configs ar,auto --rounds 2 --fresh-prompts
    .venv/bin/python benchmarks/serve_load.py --limit 2 --max-new-tokens 8 --concurrency 1,2  # a smoke run
    # with the llama.cpp server beside (llama-cpp-python built in its own environment, never CI's):
    .venv/bin/python benchmarks/serve_load.py --per-category 1 --configs llama_cpp --llama-cpp-python /path/to/venv/bin/python
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from child_env import checkout_env  # noqa: E402

from serve_report import markdown, percentile, plot  # noqa: E402
from specbench.tasks import DEFAULT_QUESTIONS, SPEC_BENCH_TASKS, load_questions  # noqa: E402

# name -> (method, max batch: None = --max-batch)
# name: (method, --max-batch (None: the run's), extra server arguments)
CONFIGS = {"auto": ("auto", None, ()), "ar": ("ar", None, ()), "one": ("auto", 1, ()), "llama_cpp": (None, None, ()),
           # prefix reuse off: what reusing earlier requests' rows (lookupdec.prefix_cache) saves
           "auto_noreuse": ("auto", None, ("--prefix-cache-mb", "0")),
           "ar_noreuse": ("ar", None, ("--prefix-cache-mb", "0")),
           # a float16 KV cache (a slightly different model: its outputs are checked against ar_kv16's)
           "auto_kv16": ("auto", None, ("--kv-dtype", "float16")), "ar_kv16": ("ar", None, ("--kv-dtype", "float16"))}


def reference_config(config: str) -> str:
    """The configuration whose outputs ``config``'s must equal: plain decoding of the same model."""
    return "ar_kv16" if "--kv-dtype" in CONFIGS[config][2] else "ar"


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it (seconds from its send)."""

    prompt: int
    ttft_s: float
    total_s: float
    tokens: int
    text: str
    turn: int = 0
    prompt_tokens: int = 0  # as the server's usage counted them (0 from a server without usage)


@dataclass(frozen=True)
class Row:
    """One (configuration, concurrency, round) run."""

    config: str
    concurrency: int
    round: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    tau: float
    exact: bool | None
    steps: int = 0            # batched steps (verify forwards) the server ran for this pass
    step_ms: float = 0.0      # their mean wall time (plans, forward, acceptance)
    forward_ms: float = 0.0   # their mean forward time
    in_steps: float = 0.0     # share of the pass's wall time inside steps (the rest: prefill, admission, HTTP)
    reused: float = 0.0       # share of the pass's prompt tokens whose rows an earlier request left (not prefilled)


class Server:
    """A `lookupdec serve` process from this checkout on a free local port (or, with ``command``,
    another OpenAI-compatible server started by that command, ``{port}`` filled in)."""

    def __init__(self, args: list[str], command: list[str] | None = None, ready_path: str = "/health") -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile(mode="w+")
        env = checkout_env()  # the caller's PYTHONPATH kept behind the checkout
        cmd = ([c.replace("{port}", str(self.port)) for c in command] if command
               else [sys.executable, "-m", "lookupdec", "serve", *args, "--port", str(self.port)])
        self.has_metrics = command is None
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        import httpx

        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"the server exited: {self.log.read()}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 600:
                raise SystemExit("the server did not start within 10 minutes")
            time.sleep(0.5)

    def counters(self) -> dict[str, float]:
        import httpx

        out = {}
        if not self.has_metrics:
            return out
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()
                out[name] = float(value)
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def one_request(client, k: int, messages: list[dict], max_tokens: int, turn: int = 0) -> Sample:
    t0 = time.perf_counter()
    first = None
    tokens = prompt_tokens = 0
    chunks = 0  # content chunks: the token count of a server whose stream carries no usage (llama.cpp's)
    parts = []
    for chunk in client.chat.completions.create(model="served", messages=messages,
                                                max_tokens=max_tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage is not None:
            tokens, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
            chunks += 1
    total = time.perf_counter() - t0
    return Sample(k, total if first is None else first, total, tokens or chunks, "".join(parts), turn,
                  prompt_tokens)


def one_conversation(client, k: int, turns: list[str], max_tokens: int) -> list[Sample]:
    """Each user turn in order, one request each; every request carries the answers so far."""
    messages: list[dict] = []
    samples = []
    for t, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        samples.append(one_request(client, k, list(messages), max_tokens, t))
        messages.append({"role": "assistant", "content": samples[-1].text})
    return samples


def run_load(server: Server, prompts: list[list[str]], concurrency: int,
             max_tokens: int) -> tuple[list[Sample], float, float, dict[str, float]]:
    """Every conversation (its user turns) once through ``concurrency`` workers: the samples, the
    wall time, tau and the server's step counters over the pass (``steps``, ``step_s``,
    ``forward_s``; empty for a peer)."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=3600)
    before = server.counters()
    t0 = time.perf_counter()
    pool = cf.ThreadPoolExecutor(concurrency)
    try:
        done = pool.map(lambda kp: one_conversation(client, kp[0], kp[1], max_tokens), enumerate(prompts))
        samples = [s for conversation in done for s in conversation]
    except BaseException:  # a stop (SIGTERM): drop the queued requests; those in flight end with their server
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    wall = time.perf_counter() - t0
    after = server.counters()
    if not after:  # a peer server without our metrics: tau unknown
        return samples, wall, 0.0, {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d["lookupdec_sequence_steps_total"]
    toks = d["lookupdec_decode_tokens_total"]
    counters = {"steps": d["lookupdec_step_seconds_count"], "step_s": d["lookupdec_step_seconds_sum"],
                "forward_s": d["lookupdec_forward_seconds_sum"],
                "reused": d.get("lookupdec_prompt_cached_tokens_total", 0.0) / max(d["lookupdec_prompt_tokens_total"], 1)}
    return samples, wall, toks / steps if steps else 0.0, counters


def summarise(config: str, c: int, rnd: int, samples: list[Sample], wall: float, tau: float,
              counters: dict[str, float]) -> Row:
    """One pass's row; ``exact`` is filled in once every pass has run (against ``ar``'s outputs)."""
    tokens = sum(s.tokens for s in samples)
    tpot = [(s.total_s - s.ttft_s) / (s.tokens - 1) for s in samples if s.tokens > 1]
    steps = int(counters.get("steps", 0))
    return Row(config, c, rnd, len(samples), tokens, round(wall, 3), round(tokens / wall, 2),
               round(percentile([s.ttft_s for s in samples], 50) * 1e3, 1),
               round(percentile([s.ttft_s for s in samples], 99) * 1e3, 1),
               round(percentile(tpot, 50) * 1e3, 2), round(percentile(tpot, 99) * 1e3, 2), round(tau, 3), None,
               steps, round(counters["step_s"] / steps * 1e3, 2) if steps else 0.0,
               round(counters["forward_s"] / steps * 1e3, 2) if steps else 0.0,
               round(counters["step_s"] / wall, 3) if steps and wall > 0 else 0.0, round(counters.get("reused", 0.0), 3))


def embedded_gguf() -> Path:
    """The embedded model's GGUF file (what the llama_cpp peer serves by default)."""
    from lookupdec.models import embedded_model_file

    return Path(embedded_model_file())


def served_device() -> str:
    """The device the servers decode on (the library's default choice, as theirs), with its CPU's ISA or GPU's name."""
    from lookupdec.costs import device_description
    from lookupdec.models import check_device

    return device_description(check_device(None))


def start(config: str, args, n_prompts: int) -> Server:
    """The server of one configuration."""
    method, batch, extra = CONFIGS[config]
    serve_args = ["--method", method, "--max-batch", str(batch or args.max_batch),
                  "--max-queue", str(max(n_prompts, 1))]
    if args.prefix_cache_mb is not None and not extra:
        serve_args += ["--prefix-cache-mb", str(args.prefix_cache_mb)]
    serve_args += list(extra)
    if args.model:
        serve_args += ["--model", args.model]
    if args.weights:
        serve_args += ["--weights", args.weights]
    if not args.saved_state:  # what earlier runs on this machine taught the drafters stays out of the figures
        serve_args += ["--fresh-state"]
    command = None
    if config == "llama_cpp":
        gguf = args.gguf or embedded_gguf()
        command = [str(args.llama_cpp_python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                   "--port", "{port}", "--n_ctx", "2048", "--n_threads", str(args.threads or os.cpu_count()),
                   "--n_threads_batch", str(args.threads or os.cpu_count()), "--model_alias", "served",
                   "--interrupt_requests", "False"]  # its default cancels a stream when another request arrives
        serve_args = command
    print(f"[{config}] starting the server: {' '.join(serve_args)}", file=sys.stderr)
    return Server(serve_args, command=command, ready_path="/v1/models" if command else "/health")


class _Stop(Exception):
    """The run was told to stop (SIGTERM): report what it gathered."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model for the server (default: the embedded SmolLM2-135M)")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="Spec-Bench question.jsonl")
    ap.add_argument("--per-category", type=int, default=2, metavar="N", help="questions per category")
    ap.add_argument("--tasks", default=None,
                    help="comma list of Spec-Bench tasks whose questions to send (e.g. summarization,rag: long "
                         "prompts); default: all six")
    ap.add_argument("--limit", type=int, default=None, metavar="N", help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,2,4,8", help="comma-separated concurrencies")
    ap.add_argument("--configs", default="auto,ar,one", help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=1,
                    help="passes over the concurrencies; every configuration's server stays up and each "
                         "concurrency runs the configurations back to back (their order alternating by round), "
                         "so a machine that drifts in speed weighs on all of them alike")
    ap.add_argument("--fresh-prompts", action="store_true",
                    help="give every (round, concurrency) pass its own questions (the next --per-category of "
                         "each category), so no request repeats one the server has already answered")
    ap.add_argument("--conversations", action="store_true",
                    help="send every turn of each question in order, each request carrying the conversation so "
                         "far (the server's own answers included), as Spec-Bench runs multi-turn questions; "
                         "without it, first turns only")
    ap.add_argument("--saved-state", action="store_true",
                    help="let the servers start from the drafting state saved on this machine (as `lookupdec serve` "
                         "does by default) and save theirs; without it they start with --fresh-state, so no "
                         "figure depends on what earlier runs (perhaps on these very questions) taught them")
    ap.add_argument("--weights", default=None, help="the lookupdec servers' --weights (default: theirs, auto)")
    ap.add_argument("--max-batch", type=int, default=8, help="--max-batch of the batched configurations")
    ap.add_argument("--prefix-cache-mb", type=float, default=None,
                    help="the lookupdec servers' --prefix-cache-mb (default: theirs; the *_noreuse configurations: 0)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the server (default: torch's choice)")
    ap.add_argument("--llama-cpp-python", type=Path, default=None, metavar="PYTHON",
                    help="an interpreter with llama-cpp-python[server]: adds the llama_cpp peer configuration")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="the GGUF file the llama_cpp peer serves (default: the embedded model's)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="S",
                    help="start no pass after S seconds (the first always runs); the passes done are reported. "
                         "SIGTERM likewise stops the run and writes what it gathered")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out", help="where the JSON and Markdown go")
    ap.add_argument("--plot", type=Path, default=None,
                    help="where the throughput plot goes (default: serve_load_throughput.png in --out)")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown config(s) {bad}; choose from {', '.join(CONFIGS)}")
    if "llama_cpp" in configs and args.llama_cpp_python is None:
        ap.error("the llama_cpp configuration needs --llama-cpp-python PYTHON (an interpreter with llama-cpp-python[server])")
    if args.llama_cpp_python is not None and "llama_cpp" not in configs:
        configs.append("llama_cpp")
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    passes = [(rnd, c) for rnd in range(args.rounds) for c in levels]
    tasks = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    if tasks is not None and (not tasks or set(tasks) - set(SPEC_BENCH_TASKS)):
        ap.error(f"--tasks {args.tasks!r}: choose from {', '.join(SPEC_BENCH_TASKS)}")

    def prompts_of(j: int) -> list[str]:
        # Every pass the same prompts, or (--fresh-prompts) each its own questions, so that what the
        # server learnt from earlier requests (Token Recycling, the n-gram pool) never meets a repeat.
        offset = j * args.per_category if args.fresh_prompts else 0
        questions = load_questions(args.questions, per_category=args.per_category, offset=offset, tasks=tasks)
        return [list(q.turns) if args.conversations else [q.turns[0]] for q in questions][:args.limit]

    pass_prompts = [prompts_of(j) for j in range(len(passes))]
    if not all(pass_prompts):
        ap.error(f"{args.questions} has too few questions per category for {len(passes)} passes of "
                 f"{args.per_category} each: lower --per-category or --rounds, or drop --fresh-prompts")
    prompts = pass_prompts[0]
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    runs: list[tuple[Row, dict[tuple[str, int], str]]] = []  # each row with its outputs by (first turn, turn)
    requests: list[dict] = []  # every request as the client saw it, with its pass
    servers: dict[str, Server] = {}
    stopped = None  # why the run ended before its last pass, if it did
    began = time.perf_counter()

    def on_term(signum, frame):
        raise _Stop("stopped by SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        order = sorted(configs, key=lambda c: c != "ar")  # ar first in even rounds, last in odd ones
        for config in order:
            servers[config] = start(config, args, len(prompts))
            run_load(servers[config], [prompts[0][:1]], 1, min(16, args.max_new_tokens))  # warm-up
        for j, (rnd, c) in enumerate(passes):
            if j and args.time_limit is not None and time.perf_counter() - began > args.time_limit:
                stopped = f"--time-limit {args.time_limit:g} s reached after {j} of {len(passes)} passes"
                break
            todo = pass_prompts[j]
            for config in (order if rnd % 2 == 0 else order[::-1]):
                samples, wall, tau, counters = run_load(servers[config], todo, c, args.max_new_tokens)
                requests += [{"config": config, "concurrency": c, "round": rnd,
                              **{k: v for k, v in asdict(s).items() if k != "text"}} for s in samples]
                runs.append((summarise(config, c, rnd, samples, wall, tau, counters),
                             {(todo[s.prompt][0], s.turn): s.text for s in samples}))
                r = runs[-1][0]
                print(f"[{config}] round {rnd} c={c}: {r.tokens_per_s:.1f} tok/s, TTFT p50 "
                      f"{r.ttft_p50_ms:.0f} ms, tau {r.tau:.2f}, {r.steps} steps of {r.step_ms:.1f} ms "
                      f"({r.in_steps:.0%} of the wall time), {r.reused:.0%} of prompt tokens reused", file=sys.stderr)
    except _Stop as exc:
        stopped = f"{exc} during pass {len({(r.round, r.concurrency) for r, _ in runs}) + 1} of {len(passes)}"
    finally:
        signal.signal(signal.SIGTERM, previous)
        for server in servers.values():
            server.stop()
    if stopped:
        print(f"serve_load: {stopped}; reporting the passes done", file=sys.stderr)
    # Exactness: every output against plain decoding's (ar, or ar_kv16) first output for the same prompt.
    reference: dict[str, dict[str, str]] = {"ar": {}, "ar_kv16": {}}
    for row, got in runs:
        if row.config in reference:
            for k, v in got.items():
                reference[row.config].setdefault(k, v)
    rows: list[Row] = []
    for row, got in runs:
        ref = reference[reference_config(row.config)]
        known = [k for k in got if k in ref]
        exact = None if row.config == "llama_cpp" or not known else all(got[k] == ref[k] for k in known)
        rows.append(replace(row, exact=exact))
    meta = {"prompts": len(prompts), "requests": sum(len(p) for p in prompts), "conversations": args.conversations,
            "max_new_tokens": args.max_new_tokens, "device": served_device(),
            "threads": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
            "python": platform.python_version(), "max_batch": args.max_batch, "rounds": args.rounds,
            "stopped": stopped}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_load.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                                                "requests": requests}, indent=1))
    md = markdown(rows, meta)
    (args.out / "serve_load.md").write_text(md)
    plot(rows, args.plot or args.out / "serve_load_throughput.png")
    print(md)
    mismatched = [r for r in rows if r.exact is False]
    if mismatched:  # reported, not fatal: a wider batched forward may round a near-tie differently
        print(f"warning: outputs differ from ar's at concurrency 1: {[(r.config, r.concurrency) for r in mismatched]}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
