"""Peak memory: lookupdec's ``Decoder().generate()`` in each weight format against transformers' own loader.

Each measurement runs in a fresh Python process and reports its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``):

- ``transformers``: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...,
  torch_dtype=torch.float32)`` (transformers' own GGUF loader: it needs the
  ``accelerate`` package, in the ``bench`` extra), its tokenizer, and greedy
  ``generate(max_new_tokens=N)`` on one chat prompt;
- ``lookupdec:<weights>``: ``Decoder(model, weights=<weights>).generate(prompt,
  max_new_tokens=N)`` (default method ``auto``; the cost curve and the weight-format
  choice come from the cache when present, else they are measured in the process:
  ``--fresh-cache`` measures them, as a first run on a machine does).

It also reports the KV cache bytes per token of the fast forward (``FlatKVCache``:
layers x 2 x KV heads x head dim x 4 bytes, or 2 with ``--kv-dtype float16``, which every
lookupdec run then uses), measured from an allocated cache.

Usage:
    python benchmarks/memory.py [--weights float32,float16,quantized,auto] [--kv-dtype float16] [--max-new-tokens 32]
                                [--threads 2] [--model PATH.gguf] [--fresh-cache] [--json benchmarks/out/memory.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from child_env import checkout_env  # noqa: E402
PROMPT = "Write a haiku about rain."

_PROBE = r"""
import json, os, resource, sys
import torch
which, model, max_new, threads = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
kv_dtype = sys.argv[5]
torch.set_num_threads(threads)
prompt = %r
out = {}
if which == "transformers":
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from lookupdec.models import embedded_model_file
    path = model or embedded_model_file()
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.inference_mode():
        g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    out["new_tokens"] = int(g.shape[1] - ids.shape[1])
else:
    from lookupdec import Decoder
    dec = Decoder(model, weights=which.split(":", 1)[1], kv_dtype=kv_dtype)
    res = dec.generate(prompt, max_new_tokens=max_new)
    out["new_tokens"] = res.new_tokens
    out["weights"] = dec.weights
    out["weights_reason"] = dec.weights_choice.reason
    fast = dec.verifier.fast
    if fast is not None:
        cache = fast.new_cache(1024)
        out["kv_bytes_per_token"] = cache.kv.element_size() * cache.kv.numel() / cache.capacity
out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(out))
""" % PROMPT


def probe(which: str, model: str | None, max_new: int, threads: int, cache_dir: str | None,
          kv_dtype: str = "float32") -> dict:
    """Run one measurement in a fresh process; return its result dict.

    Raises:
        RuntimeError: the process failed (its stderr's last lines are in the message).
    """
    env = checkout_env(**({"LOOKUPDEC_CACHE": cache_dir} if cache_dir else {}))
    proc = subprocess.run([sys.executable, "-c", _PROBE, which, model or "", str(max_new), str(threads), kv_dtype],
                          capture_output=True, text=True, cwd=REPO, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{which} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-5:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="float32,float16,quantized,auto", help="comma list of Decoder(weights=...) values")
    ap.add_argument("--kv-dtype", default="float32", choices=KV_DTYPES,
                    help="the KV cache's element type of every lookupdec run (Decoder(kv_dtype=...))")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a .gguf file (default: the embedded model)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="an empty lookupdec cache per run: the curve and the format choice are measured in it")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.model is not None and not args.model.endswith(".gguf"):
        ap.error("--model must be a .gguf file (the baseline is transformers' GGUF loader)")
    from lookupdec.weights import WEIGHTS_CHOICES

    formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    bad = [w for w in formats if w not in WEIGHTS_CHOICES]
    if bad:
        ap.error(f"unknown weight formats {bad}; use {', '.join(WEIGHTS_CHOICES)}")

    from lookupdec.costs import device_description

    rows = {}
    base = probe("transformers", args.model, args.max_new_tokens, args.threads, None)
    rows["transformers"] = base
    print(f"{device_description('cpu')}; {args.threads} threads; {args.max_new_tokens} new tokens")
    print(f"{'run':22} {'peak MiB':>9} {'x transformers':>15}  notes")
    print(f"{'transformers':22} {base['peak_mib']:>9.0f} {1.0:>15.2f}  from_pretrained(gguf_file=...) + generate()")
    for w in formats:
        with tempfile.TemporaryDirectory() as tmp:
            r = probe(f"lookupdec:{w}", args.model, args.max_new_tokens, args.threads,
                      tmp if args.fresh_cache else None, args.kv_dtype)
        r["ratio"] = r["peak_mib"] / base["peak_mib"]
        rows[f"lookupdec:{w}"] = r
        print(f"{'lookupdec ' + w:22} {r['peak_mib']:>9.0f} {r['ratio']:>15.2f}  used {r.get('weights') or '-'}; "
              f"KV cache {r.get('kv_bytes_per_token', 0) / 1024:.1f} KiB/token")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": device_description("cpu"), "threads": args.threads,
                                         "kv_dtype": args.kv_dtype,
                                         "max_new_tokens": args.max_new_tokens, "fresh_cache": args.fresh_cache,
                                         "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
