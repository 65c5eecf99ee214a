"""How long a model takes to load, as users load it: each case in a fresh process, whole-process wall time.

Cases (the embedded GGUF model unless ``--model``):

- ``transformers``: ``AutoTokenizer`` + ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``
  (float32), the peer a user would otherwise call;
- ``load_model cold``: ``lookupdec.models.load_model`` with an empty ``LOOKUPDEC_CACHE`` (it builds
  the config and tokenizer from the file and saves them);
- ``load_model warm``: the same with that cache in place;
- ``Decoder warm``: ``lookupdec.Decoder(model)``, the weight format chosen and packed, warm cache;
- ``generate warm``: the command ``lookupdec generate --prompt ... --max-new-tokens 8 --method ar``
  (its entry point, ``lookupdec.cli.main``, called with those arguments).

Every case starts a Python interpreter and imports what it needs, so each time includes that
(the ``python`` case, an interpreter importing torch and transformers and nothing else, shows how
much). Medians of ``--repeats`` runs, the cases interleaved run by run. Prints a Markdown table and
writes JSON with ``--out``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/load_time.py --repeats 3 --out benchmarks/out/load_time.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from child_env import checkout_env  # noqa: E402

PEER = """
import os, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from lookupdec.models import embedded_model_file
path = {model!r} or embedded_model_file()
d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
AutoTokenizer.from_pretrained(d, gguf_file=f)
AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
"""
CASES = {
    "python": "import torch, transformers",
    "transformers": PEER,
    "load_model cold": "from lookupdec.models import load_model; load_model({model!r})",
    "load_model warm": "from lookupdec.models import load_model; load_model({model!r})",
    "Decoder warm": "from lookupdec import Decoder; Decoder({model!r})",
    # What the `lookupdec` command runs (its entry point is lookupdec.cli.main).
    "generate warm": "from lookupdec.cli import main; main(['generate', '--prompt', 'Say hello.', "
                     "'--max-new-tokens', '8', '--method', 'ar'] + (['--model', {model!r}] if {model!r} else []))",
}


def run_case(name: str, model: str | None, cache: str) -> float:
    env = checkout_env(LOOKUPDEC_CACHE=cache, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-c", CASES[name].format(model=model)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .gguf file (default: the embedded model)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    times: dict[str, list[float]] = {n: [] for n in CASES}
    with tempfile.TemporaryDirectory(prefix="lookupdec-load-") as root:
        warm = os.path.join(root, "warm")
        run_case("Decoder warm", args.model, warm)  # untimed: fills the warm cache (config, tokenizer, weight format)
        for r in range(args.repeats):
            for name in CASES:
                cache = os.path.join(root, f"cold{r}") if name == "load_model cold" else warm  # cold: empty
                times[name].append(run_case(name, args.model, cache))
                print(f"[{r + 1}/{args.repeats}] {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    med = {n: statistics.median(v) for n, v in times.items()}
    from lookupdec.costs import device_description

    info = {"cpu": device_description("cpu"), "python": platform.python_version(),
            "model": args.model or "embedded SmolLM2-135M-Instruct (GGUF Q4_1)", "repeats": args.repeats,
            "command": " ".join(sys.argv)}
    print(f"Load time, whole process, median of {args.repeats}; {info['cpu']}; {info['model']}.\n")
    print("| case | seconds | x transformers |\n|---|---:|---:|")
    for n in CASES:
        print(f"| {n} | {med[n]:.2f} | {med[n] / med['transformers']:.2f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"info": info, "seconds": times, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
