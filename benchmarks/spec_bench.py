"""Spec-Bench for lookupdec: speedup, mean accepted tokens, tokens/s and exactness.

Runs transformers' ``generate()`` (plain greedy ``hf``, and ``hf_pld`` with
``prompt_lookup_num_tokens=10``) and every lookupdec method on the same
Spec-Bench prompts in one process; checks that every method's greedy tokens
equal ``ar``'s (exit 1 on the first mismatch); writes ``spec_bench.json``,
``spec_bench.md`` and two PNG plots into ``--out``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/spec_bench.py --per-category 2 --max-new-tokens 128
    .venv/bin/python benchmarks/spec_bench.py --per-category 1 --max-new-tokens 32 --methods hf,ar,pld
    .venv/bin/python benchmarks/spec_bench.py --weights float16 --methods hf,ar,auto --out benchmarks/out/spec_bench_fp16

The parts live in ``benchmarks/specbench/`` (see its ``__init__``).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specbench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
