"""The fast forward timed as the decoder calls it: decode/verify forwards by width and cache length,
several sequences in one forward, and prompts (prefill).

What it times (``FastForward`` directly, the embedded model unless ``--model``):

- ``verify``: one forward of W rows (a causal chain's bias for W > 1, none for one row) on top of a
  cache of P rows, ``lm_head`` for one row, for each W in ``--widths`` and P in ``--pasts``;
- ``batch``: ``forward_batch`` of N sequences, one row each, on caches of ``--batch-past`` rows,
  for N in ``--batch-sizes`` (no ``lm_head``: what the batched step adds on top is the verifier's);
- ``prefill``: a causal forward of a prompt of L tokens on an empty cache, ``lm_head`` for its last
  row, for L in ``--prompts``.

Medians of ``--repeats`` timed calls after one untimed call. Prints a JSON object (and writes it to
``--out`` when given) naming the CPU, ISA, threads and weight format. ``--compare-layers`` times each
decode/verify and batch forward twice, alternating call by call: a quantized step's layers in one
native call (``native_layers``), and through the Python loop it replaced (``"python"`` entries).
``--compare-routes`` does the same for the quantized products of 5-24 rows: the tall tiles
(``"tall"``, the default) against the scratch tile they replaced (``"scratch"``); both give the same bits.
``--compare-attention`` does the same for the native attention's scoring of a task of many queries:
keys in the vector lanes (``"lanes"``, the default for tasks of 5 tiles of queries with AVX-512)
against the 4 x 4 tiles
(``"tiles"``); both give the same bits. ``--isa avx2`` runs the quantized products on AVX2 on a CPU
that also has AVX-512 (its AVX2 routes, timed on that CPU: not an AVX2-only machine's figures).

Usage:
    python benchmarks/forward_widths.py --threads 2 --weights quantized [--out FILE]
    python benchmarks/forward_widths.py --threads 2 --weights quantized --compare-layers --prompts ""
    python benchmarks/forward_widths.py --threads 2 --widths 1,2,4,5,6,8,12,16,24,32 --pasts 300 \
        --batch-sizes 1,8 --prompts "" --compare-routes
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternation import alternated_ms  # noqa: E402
from json_report import print_and_write  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 2)


def main(argv: list[str] | None = None) -> int:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    ap.add_argument("--weights", default="quantized", help="weight format of the fast forward")
    ap.add_argument("--kv-dtype", default="float32", choices=KV_DTYPES,
                    help="the KV cache's element type (default: float32)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--widths", default="1,4,8,16,32,64")
    ap.add_argument("--pasts", default="300,1500")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--batch-past", type=int, default=300)
    ap.add_argument("--prompts", default="64,256,1024")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--compare-layers", action="store_true",
                    help="also time each step's layers through the Python loop, alternating with the native call")
    ap.add_argument("--compare-routes", action="store_true",
                    help="also time each forward with the quantized products' scratch tile where the tall tiles "
                         "run (5-24 rows with AVX-512, 5-8 with AVX2), alternating")
    ap.add_argument("--compare-attention", action="store_true",
                    help="also time each forward with the attention's keys-in-lanes scoring off, alternating")
    ap.add_argument("--isa", default=None, choices=("avx512", "avx2", "c"),
                    help="the quantized products' instruction set (default: the best this CPU has)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    for name in ("widths", "pasts", "batch_sizes", "prompts"):
        if any(n < (0 if name == "pasts" else 1) for n in _ints(getattr(args, name))):
            ap.error(f"--{name.replace('_', '-')}: every value must be at least {0 if name == 'pasts' else 1}")

    import torch

    from lookupdec import _native
    from lookupdec.costs import device_description
    from lookupdec.fast_forward import FastForward
    from lookupdec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    ff = FastForward(lm.model, weights=args.weights, kv_dtype=args.kv_dtype)
    native = ff.layer_table
    if args.compare_layers and native is None:
        ap.error("--compare-layers needs a format whose steps run natively (--weights quantized)")

    if args.isa and not _native.qmatmul_force_isa(args.isa):
        ap.error(f"--isa {args.isa}: this CPU does not have it")
    if args.compare_routes and (args.weights != "quantized" or _native.qmatmul_isa() == "c"):
        ap.error("--compare-routes needs --weights quantized and AVX-512 or AVX2 (the tall tiles are theirs)")
    tall_rows = _native.qmatmul_tall_rows()
    block_tiles = _native.attend_block_tiles()
    if sum((args.compare_layers, args.compare_routes, args.compare_attention)) > 1:
        ap.error("--compare-layers, --compare-routes and --compare-attention: one at a time")
    if args.compare_layers:  # name -> what sets it up; the first is the default
        variants = {"native": lambda: setattr(ff, "layer_table", native),
                    "python": lambda: setattr(ff, "layer_table", None)}
    elif args.compare_routes:
        variants = {"tall": lambda: _native.qmatmul_tall_rows(tall_rows),
                    "scratch": lambda: _native.qmatmul_tall_rows(0)}
    elif args.compare_attention:
        variants = {"lanes": lambda: _native.attend_block_tiles(block_tiles),
                    "tiles": lambda: _native.attend_block_tiles(0)}
    else:
        variants = {}

    def timed(fn):
        """Median ms of ``fn``; with a comparison {variant: ms}, the two taking turns call by call."""
        return alternated_ms(fn, variants, args.repeats) if variants else _median_ms(fn, args.repeats)
    vocab = ff.vocab
    gen = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(3, vocab, (n,), generator=gen)

    def filled(past, room):
        cache = ff.new_cache(past + room)
        ff.forward(cache, ids(past), torch.arange(past), None, None, causal=True)
        return cache

    out = {"device": device_description(torch.device("cpu")), "products_isa": _native.qmatmul_isa(),
           "threads": torch.get_num_threads(),
           "weights": args.weights, "kv_dtype": args.kv_dtype, "native_layers": native is not None, "verify_ms": {}, "batch_ms": {}, "prefill_ms": {}}
    low = torch.finfo(torch.float32).min
    for past in _ints(args.pasts):
        row = {}
        for w in _ints(args.widths):
            cache = filled(past, w)
            bias = torch.zeros(1, 1, w, past + w)
            bias[..., past:] = torch.triu(torch.full((w, w), low), 1)
            x, pos = ids(w), past + torch.arange(w)

            def step(cache=cache, x=x, pos=pos, bias=None if w == 1 else bias):
                cache.length = past
                ff.forward(cache, x, pos, bias, [0])

            row[w] = timed(step)
        out["verify_ms"][past] = row
    for n in _ints(args.batch_sizes):
        caches = [filled(args.batch_past, 1) for _ in range(n)]

        def batch(caches=caches, n=n):
            for c in caches:
                c.length = args.batch_past
            ff.forward_batch(caches, [ids(1) for _ in range(n)],
                             [torch.tensor([args.batch_past]) for _ in range(n)], [None] * n)

        out["batch_ms"][n] = timed(batch)
    for n in _ints(args.prompts):
        x = ids(n)

        def prefill(x=x, n=n):
            ff.forward(ff.new_cache(n), x, torch.arange(n), None, [n - 1], causal=True)

        out["prefill_ms"][n] = _median_ms(prefill, max(3, args.repeats // 3))
    print_and_write(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
