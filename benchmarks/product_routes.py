"""The quantized products' routes against each other: every layer product of a model, by rows.

For each row count in ``--rows``, runs all of the model's layer products (each layer's qkv, o,
gate_up and down, in the quantized format, on random inputs) once through the tall tiles (the
default for 5 rows up to the instruction set's limit) and once through the scratch tile, the
two alternating call by call in one process after one untimed call of each, and prints their
median milliseconds (after three untimed passes over every product). Both routes give the same bits (tests/test_quantized.py); only their speed
differs. ``--isa avx2`` times the AVX2 routes on a CPU that also has AVX-512: that CPU's figures,
not an AVX2-only machine's.

Usage:
    python benchmarks/product_routes.py --threads 2 [--isa avx2] [--rows 4,5,6,7,8] [--repeats 10] [--out FILE]

Prints a JSON object (and writes it to ``--out`` when given) naming the CPU, ISA and threads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternation import alternated_ms  # noqa: E402
from json_report import print_and_write  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None, choices=("avx512", "avx2"),
                    help="the products' instruction set (default: the best this CPU has)")
    ap.add_argument("--rows", default="4,5,6,7,8")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls of each route per row count")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    try:
        rows = [int(x) for x in args.rows.split(",") if x]
    except ValueError:
        ap.error(f"--rows: expected comma-separated integers, got {args.rows!r}")
    if not rows or min(rows) < 1 or args.threads < 1 or args.repeats < 1:
        ap.error("--rows, --threads and --repeats must be at least 1")

    import torch

    from lookupdec import _native
    from lookupdec.costs import device_description
    from lookupdec.fast_forward import FastForward
    from lookupdec.models import load_model

    torch.set_num_threads(args.threads)
    if args.isa and not _native.qmatmul_force_isa(args.isa):
        ap.error(f"--isa {args.isa}: this CPU does not have it")
    if _native.qmatmul_isa() == "c":
        ap.error("the tall tiles need AVX-512 or AVX2")
    ff = FastForward(load_model(args.model).model, weights="quantized")
    products = [getattr(layer, name) for layer in ff.layers for name in ("qkv", "o", "gate_up", "down")]
    tall_rows = _native.qmatmul_tall_rows()
    routes = {"tall": lambda: _native.qmatmul_tall_rows(tall_rows), "scratch": lambda: _native.qmatmul_tall_rows(0)}
    gen = torch.Generator().manual_seed(0)
    out = {"device": device_description(torch.device("cpu")), "products_isa": _native.qmatmul_isa(),
           "threads": args.threads, "tall_rows": tall_rows, "products": len(products), "ms": {}}
    warm = torch.randn(max(rows), max(p.in_features for p in products), generator=gen)
    for _ in range(3):  # the weights into memory and the caches before anything is timed
        for p in products:
            p(warm[:, :p.in_features])
    for n in rows:
        inputs = {p.in_features: torch.randn(n, p.in_features, generator=gen) for p in products}

        def all_products(inputs=inputs):
            for p in products:
                p(inputs[p.in_features])

        out["ms"][n] = alternated_ms(all_products, routes, args.repeats)  # leaves the tall route set
    print_and_write(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
