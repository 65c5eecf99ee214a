"""Reliability figures: damaged indexes, bad inputs, killed builds, concurrent lookups.

Everything runs as a user would run it, in subprocesses, so that a crash
(a signal, an abort, a raw traceback) is seen rather than hidden:

- ``corrupted``: copies of a small index damaged at random in one of twelve
  ways (benchmarks/damage.py's ``corrupt``, which tests/test_index_corruption.py uses too), each opened and looked
  up 30 times in a probe process. Counted: clear errors, copies that still
  serve (with the drafts checked to be valid trees of in-range ids), crashes.
- ``inputs``: bad inputs through the ``lookupdec`` command line (every kind
  the README promises a message for) with the embedded model. Counted: a
  non-zero exit, no traceback, a message, and no output file left behind.
- ``killed``: a build of 30M tokens killed with SIGKILL at a random moment of
  its run (timed once whole),
  then the output opened: the old index or the finished new one, never a
  half-index.
- ``concurrent``: four processes looking up the same contexts in one index at
  once, their results compared with one another and with this process.

Usage:
    python benchmarks/reliability.py --json benchmarks/out/reliability.json
    python benchmarks/reliability.py --corrupted 1000 --killed 20 --skip-inputs
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from damage import PROBE, VOCAB, corrupt, word_tokenizer  # noqa: E402
from child_env import checkout_env  # noqa: E402

ENV = checkout_env()
CLI = [sys.executable, "-c", "from lookupdec.cli import main; main()"]


def _run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600, **kw)


def corrupted(n: int, work: Path, seed: int = 0) -> dict:
    """Damage ``n`` copies of one index and look each up in a probe process."""
    from lookupdec.index import build_index_from_tokens

    rng = np.random.default_rng(seed)
    docs = [rng.integers(3, 60, int(rng.integers(5, 80))).tolist() for _ in range(60)]
    good = work / "good"
    build_index_from_tokens(docs, good, tokenizer=word_tokenizer())
    kinds, rows, crashes = [], [], 0
    for start in range(0, n, 100):  # a fresh probe per hundred copies: a crash loses one batch only
        paths = []
        for i in range(start, min(n, start + 100)):
            d = work / f"c{i:04d}"
            shutil.copytree(good, d)
            kinds.append(corrupt(d, rng))
            paths.append(str(d))
        proc = _run([sys.executable, "-c", PROBE], input="\n".join(paths) + "\n")
        got = [json.loads(line) for line in proc.stdout.splitlines()]
        crashes += proc.returncode != 0 or len(got) != len(paths)
        rows += got
        for p in paths:
            shutil.rmtree(p)
    errors = [r for r in rows if "error" in r]
    served = [r for r in rows if "lookups" in r]
    unclear = [r for r in errors if r["error"] != "IndexFormatError" or "rebuild" not in r["message"]]
    harmful = [r for r in served if not r["valid"] or r["max_token"] >= VOCAB]
    return {"copies": n, "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
            "clear_errors": len(errors) - len(unclear), "served_valid_drafts": len(served) - len(harmful),
            "unclear_errors": len(unclear), "harmful_drafts": len(harmful), "crashed_probes": crashes}


def _input_cases(work: Path) -> list[tuple[str, list[str], Path | None]]:
    """(what, CLI arguments, an output path that must not exist afterwards)."""
    from lookupdec.index import build_index_from_tokens

    (work / "malformed.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (work / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (work / "empty.jsonl").write_text("")
    (work / "ids.jsonl").write_text('{"prompt": [1, 2, 999999]}\n')
    (work / "badref.jsonl").write_text('{"prompt": "hi", "references": [3]}\n')
    (work / "empty_ref.txt").write_text("")
    (work / "long.txt").write_text("word " * 10_000)
    (work / "notindex").mkdir()
    (work / "notindex" / "keep.txt").write_text("user data")
    build_index_from_tokens([[5, 6, 7, 8]] * 3, work / "charidx", tokenizer=word_tokenizer())
    damaged = work / "damaged"
    build_index_from_tokens([[5, 6, 7, 8]] * 3, damaged)
    (damaged / "manifest.json").write_text("{garbage")
    blocker = work / "a_file"  # a path under a regular file: unwritable for every user, root included
    blocker.write_text("")
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(50)))
    gen = CLI + ["generate", "--max-new-tokens", "8"]
    w = str(work)
    return [
        ("generate: unknown model", gen + ["--model", "no-such-org/no-such-model", "--prompt", "x"], None),
        ("generate: model path missing", gen + ["--model", f"{w}/missing.gguf", "--prompt", "x"], None),
        ("generate: --input missing", gen + ["--input", f"{w}/missing.jsonl"], None),
        ("generate: --input malformed line", gen + ["--input", f"{w}/malformed.jsonl"], None),
        ("generate: --input binary file", gen + ["--input", f"{w}/binary.jsonl"], None),
        ("generate: token id out of range", gen + ["--input", f"{w}/ids.jsonl"], None),
        ("generate: references not strings", gen + ["--input", f"{w}/badref.jsonl"], None),
        ("generate: prompt longer than the context", gen + ["--prompt-file", f"{w}/long.txt"], None),
        ("generate: negative temperature", gen + ["--prompt", "x", "--temperature", "-1"], None),
        ("generate: top-p 2", gen + ["--prompt", "x", "--top-p", "2"], None),
        ("generate: negative max-new-tokens", CLI + ["generate", "--prompt", "x", "--max-new-tokens", "-5"], None),
        ("generate: unknown method", gen + ["--prompt", "x", "--method", "magic"], None),
        ("generate: --index missing", gen + ["--prompt", "x", "--index", f"{w}/nothing"], None),
        ("generate: --index damaged", gen + ["--prompt", "x", "--index", str(damaged)], None),
        ("generate: --index of another tokenizer", gen + ["--prompt", "x", "--index", f"{w}/charidx"], None),
        ("generate: --index not an index", gen + ["--prompt", "x", "--index", f"{w}/notindex"], None),
        ("generate: --reference missing", gen + ["--prompt", "x", "--reference", f"{w}/nope.txt"], None),
        ("generate: --reference empty", gen + ["--prompt", "x", "--reference", f"{w}/empty_ref.txt"], None),
        ("generate: --reference with ar", gen + ["--prompt", "x", "--method", "ar", "--reference",
                                                  f"{w}/long.txt"], None),
        ("generate: --history unwritable", gen + ["--prompt", "x", "--history", f"{w}/a_file/h"], None),
        ("generate: --draft-budget -1", gen + ["--prompt", "x", "--draft-budget", "-1"], None),
        ("generate: --device that is no device", gen + ["--prompt", "x", "--device", "gpu"], None),
        ("generate: --device cuda without one", gen + ["--prompt", "x", "--device", "cuda:0"], None),
        ("build-index: corpus missing", CLI + ["build-index", f"{w}/none.jsonl", "-o", f"{w}/o1"], work / "o1"),
        ("build-index: malformed line", CLI + ["build-index", f"{w}/malformed.jsonl", "-o", f"{w}/o2"],
         work / "o2"),
        ("build-index: binary file", CLI + ["build-index", f"{w}/binary.jsonl", "-o", f"{w}/o3"], work / "o3"),
        ("build-index: empty corpus", CLI + ["build-index", f"{w}/empty.jsonl", "-o", f"{w}/o4"], work / "o4"),
        ("build-index: --text-field ''", CLI + ["build-index", str(corpus), "--text-field", "", "-o", f"{w}/o5"],
         work / "o5"),
        ("build-index: unwritable -o", CLI + ["build-index", str(corpus), "-o", f"{w}/a_file/o"],
         blocker / "o"),
        ("build-index: -o holds other files", CLI + ["build-index", str(corpus), "-o", f"{w}/notindex",
                                                     "--overwrite"], None),
        ("build-index: --shard-tokens 0", CLI + ["build-index", str(corpus), "--shard-tokens", "0",
                                                 "-o", f"{w}/o6"], work / "o6"),
        ("index-info: damaged index", CLI + ["index-info", str(damaged)], None),
        ("index-info: not an index", CLI + ["index-info", f"{w}/notindex"], None),
    ]


def inputs(work: Path) -> dict:
    """Run every bad input through the CLI; each must exit non-zero with a message and no traceback."""
    rows = []
    for what, args, out in _input_cases(work):
        t0 = time.perf_counter()
        p = _run(args)
        text = (p.stdout + p.stderr).strip()
        lines = [ln for ln in text.splitlines() if ln.strip() and "%|" not in ln]
        rows.append({"input": what, "exit": p.returncode, "traceback": "Traceback" in text,
                     "message": lines[-1][:160] if lines else "", "left_output": bool(out and out.exists()),
                     "seconds": round(time.perf_counter() - t0, 1)})
    if (work / "notindex" / "keep.txt").read_text() != "user data":
        rows.append({"input": "build-index --overwrite kept other files", "exit": 0, "traceback": False,
                     "message": "user files changed", "left_output": True})
    ok = [r for r in rows if r["exit"] > 0 and not r["traceback"] and r["message"]
          and not r["left_output"]]
    return {"tried": len(rows), "clean": len(ok), "rows": rows}


KILLED_BUILD = r"""
import sys
import numpy as np
from lookupdec.index import build_index_from_tokens
rng = np.random.default_rng(int(sys.argv[2]))
docs = (rng.integers(0, 1000, 500) for _ in range(60000))
build_index_from_tokens(docs, sys.argv[1], shard_tokens=400_000, overwrite=True)
"""


def killed(n: int, work: Path, seed: int = 0) -> dict:
    """Kill ``n`` builds at random moments; count the outputs that still open (old or new index)."""
    from lookupdec.errors import LookupdecError
    from lookupdec.index import build_index_from_tokens, open_index

    out = work / "killed"
    build_index_from_tokens([[7, 8, 9]], out)
    t0 = time.perf_counter()  # one whole build into a scratch place gives the span to kill in
    _run([sys.executable, "-c", KILLED_BUILD, str(work / "timed"), "0"]).check_returncode()
    span = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    opened = old = new = 0
    for trial in range(n):
        p = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(out), str(trial)], cwd=ROOT, env=ENV)
        time.sleep(float(rng.uniform(0.3, 1.1)) * span)
        p.send_signal(signal.SIGKILL)
        p.wait()
        try:
            idx = open_index(out, verify=True)
        except LookupdecError:
            continue
        opened += 1
        old += idx.n_tokens == 3
        new += idx.n_tokens == 60000 * 500
    build_index_from_tokens([[1, 2]], out, overwrite=True)  # the next build cleans the debris
    debris = [p.name for p in work.iterdir() if p.name.startswith(".killed.")]
    return {"killed": n, "build_s": round(span, 1), "opened_verified": opened, "old_index": old, "new_index": new,
            "debris_after_next_build": len(debris)}


CONCURRENT = r"""
import json, sys
import numpy as np
from lookupdec.index import open_index
idx = open_index(sys.argv[1])
ctxs = json.loads(sys.stdin.read())
out = []
for c in ctxs:
    r = idx.lookup(c)
    out.append([r.match_len, r.occurrences, r.tree.tokens.tolist(), r.tree.parents.tolist()])
print(json.dumps(out))
"""


def concurrent(work: Path, processes: int = 4, lookups: int = 2000, seed: int = 0) -> dict:
    """Four processes look the same contexts up at once; all must agree with one process."""
    from lookupdec.index import build_index_from_tokens, open_index

    rng = np.random.default_rng(seed)
    docs = [rng.zipf(1.3, int(rng.integers(50, 400))) % 5000 for _ in range(20000)]
    path = work / "shared"
    build_index_from_tokens(docs, path, shard_tokens=1_000_000)
    flat = np.concatenate(docs)
    starts = rng.integers(0, flat.size - 16, lookups)
    ctxs = [flat[s:s + int(rng.integers(1, 17))].tolist() for s in starts]
    idx = open_index(path)
    mine = []
    for c in ctxs:
        r = idx.lookup(c)
        mine.append([r.match_len, r.occurrences, r.tree.tokens.tolist(), r.tree.parents.tolist()])
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=ENV) for _ in range(processes)]
    outs = [p.communicate(json.dumps(ctxs))[0] for p in procs]
    seconds = time.perf_counter() - t0
    results = [json.loads(o) if o else None for o in outs]
    agree = sum(r == mine for r in results)
    return {"processes": processes, "shards": idx.n_shards,
            "tokens": int(flat.size), "lookups_each": lookups, "agreeing_with_one_process": agree,
            "exit_codes": [p.returncode for p in procs], "wall_s": round(seconds, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corrupted", type=int, default=200, help="damaged index copies")
    ap.add_argument("--killed", type=int, default=10, help="builds killed at random moments")
    ap.add_argument("--skip-inputs", action="store_true", help="skip the CLI bad-input runs (they load the model)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, run in [("corrupted", lambda d: corrupted(args.corrupted, d)),
                          ("killed", lambda d: killed(args.killed, d)),
                          ("concurrent", concurrent),
                          ("inputs", None if args.skip_inputs else inputs)]:
            if run is None:
                continue
            (work / name).mkdir()
            t0 = time.perf_counter()
            report[name] = run(work / name)
            summary = {k: v for k, v in report[name].items() if k != "rows"}
            print(f"{name} ({time.perf_counter() - t0:.0f} s): {json.dumps(summary)}", flush=True)
    for r in report.get("inputs", {}).get("rows", []):
        print(f"  exit {r['exit']:>3} {'TRACEBACK ' if r['traceback'] else ''}"
              f"{'LEFT OUTPUT ' if r['left_output'] else ''}{r['input']}: {r['message']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
