"""The native attention alone (``ext/csrc/attention.c``), timed over the shapes a decoder gives it.

A shape is ``SEQUENCESxROWS@PAST``: that many sequences, each adding ROWS rows (under a causal bias
when ROWS > 1) on top of PAST cached rows, in one call per layer, over every layer of the model's
attention shape (the embedded model: 30 layers, 9 heads over 3 kv heads of 64). Each sequence has its
own cache, as in a batch; every layer's rows are cold, as in a step. Reports the median ms of all the
layers' calls and the useful multiply-adds per second (scores and outputs over the unmasked keys).

``--compare-attention`` times each shape twice, alternating call by call: tasks of many queries
scoring their keys with the keys in the vector lanes (``"lanes"``, the default for tasks of 5 tiles of
queries with AVX-512; AVX2 and plain C have the tiles only) and the 4 x 4 tiles
(``"tiles"``); both give the same bits, and the run checks that they did.

``--kv-dtype float16`` times caches of float16 elements (``FastForward(kv_dtype="float16")``);
``--compare-kv`` times each shape over a float32 cache (``"float32"``) and a float16 cache holding the
same values rounded (``"float16"``), alternating call by call, after checking that the float16 cache
gave the bits of a float32 cache holding the rounded values.

Usage:
    .venv/bin/python benchmarks/attention_shapes.py --threads 2
    .venv/bin/python benchmarks/attention_shapes.py --threads 2 --compare-attention --shapes 1x16@300,1x128@512
    .venv/bin/python benchmarks/attention_shapes.py --threads 2 --compare-attention --isa avx2
    .venv/bin/python benchmarks/attention_shapes.py --threads 2 --compare-kv --shapes 1x1@500,8x1@500
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternation import alternated_ms  # noqa: E402
from json_report import print_and_write  # noqa: E402

DEFAULT_SHAPES = "1x1@300,1x1@1500,4x1@500,8x1@500,1x4@300,1x8@300,1x16@300,1x16@1500,1x32@600,1x128@0,1x128@512"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"1x16@300,4x1@500"`` -> ``[(1, 16, 300), (4, 1, 500)]``; ValueError naming a bad entry."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)x(\d+)@(\d+)", part)
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise ValueError(f"shape {part!r}: write SEQUENCESxROWS@PAST, e.g. 1x16@300 "
                             "(at least one sequence and row)")
        shapes.append((int(m[1]), int(m[2]), int(m[3])))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


class Call:
    """Every layer's attention for ``n`` sequences of ``w`` new rows over ``past`` cached rows."""

    def __init__(self, torch, native, n, w, past, layers, H, Hk, D, gen, kv_dtype=None, like=None):
        """``like``: another Call whose caches, inputs and bias this one takes (its caches in ``kv_dtype``)."""
        from lookupdec.kvcache import kv_format

        self.native, self.n, self.layers, self.H, self.Hk, self.D = native, n, layers, H, Hk, D
        self.w, self.past = w, past
        cap = past + w
        if like is None:
            self.caches = [torch.randn(layers, 2, Hk, cap, D, generator=gen).to(kv_dtype) for _ in range(n)]
            self.qk = torch.randn(n * w, (H + Hk) * D, generator=gen)
            self.v = torch.randn(n * w, Hk * D, generator=gen)
        else:
            self.caches = [c.to(kv_dtype) for c in like.caches]
            self.qk, self.v = like.qk, like.v
        self.bias = None
        if w > 1:
            self.bias = torch.zeros(w, cap)
            self.bias[:, past:] = torch.triu(torch.full((w, w), float("-inf")), 1)
        self.meta = torch.tensor([[s * w, w, past, 0 if self.bias is None else self.bias.data_ptr()] for s in range(n)],
                                 dtype=torch.int64)
        self.kv = torch.tensor([[c.data_ptr(), cap, kv_format(c)] for c in self.caches], dtype=torch.int64)
        self.out = torch.empty(n * w, H * D)
        self.macs = 2 * n * layers * H * D * sum(past + i + 1 for i in range(w))

    def __call__(self, threads: int) -> None:
        for layer in range(self.layers):
            self.native.attend_ptr(self.n, self.meta.data_ptr(), self.kv.data_ptr(), layer, self.qk.data_ptr(),
                                   self.v.data_ptr(), self.Hk * self.D, self.H, self.Hk, self.D, self.D ** -0.5,
                                   self.out.data_ptr(), threads)


def half_matches_rounded_float32(torch, native, half: Call, threads: int) -> bool:
    """Whether ``half`` (float16 caches) gives the bits of the same call over float32 caches holding its
    values, the new keys and values rounded to float16 as the float16 cache rounds them when it writes."""
    ref = Call(torch, native, half.n, half.w, half.past, half.layers, half.H, half.Hk, half.D, None, torch.float32,
               like=half)
    ref.qk = half.qk.clone()
    ref.qk[:, half.H * half.D:] = half.qk[:, half.H * half.D:].half().float()
    ref.v = half.v.half().float()
    half(threads)
    ref(threads)
    return torch.equal(half.out, ref.out)


def main(argv: list[str] | None = None) -> int:
    from lookupdec.cli.generate import KV_DTYPES  # --kv-dtype's names, as the CLI spells them (no torch)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help=f"SEQUENCESxROWS@PAST, comma-separated (default: {DEFAULT_SHAPES})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", default="9,3,64", help="query heads, kv heads, head size (default: the embedded model's)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--compare-attention", action="store_true",
                    help="also time each shape with the keys-in-lanes scoring off, alternating call by call")
    ap.add_argument("--kv-dtype", default="float32", choices=KV_DTYPES,
                    help="the caches' element type (default: float32)")
    ap.add_argument("--compare-kv", action="store_true",
                    help="time each shape over float32 and float16 caches, alternating call by call")
    ap.add_argument("--isa", default=None, choices=("avx512", "avx2", "c"),
                    help="the native kernels' instruction set (default: the best this CPU has)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        ap.error(str(exc))
    heads = args.heads.split(",")
    if len(heads) != 3 or not all(h.strip().isdigit() for h in heads):
        ap.error(f"--heads {args.heads!r}: write three integers, query heads,kv heads,head size (e.g. 9,3,64)")
    H, Hk, D = (int(h) for h in heads)
    if min(args.threads, args.layers, args.repeats, H, Hk, D) < 1 or H % Hk:
        ap.error("--threads, --layers, --repeats and the head counts must be at least 1, and kv heads must divide heads")

    import torch

    from lookupdec import _native
    from lookupdec.costs import device_description
    from lookupdec.kvcache import KV_DTYPES as KV_TORCH_DTYPES

    if args.isa and not _native.qmatmul_force_isa(args.isa):
        ap.error(f"--isa {args.isa}: this CPU does not have it")
    torch.set_num_threads(args.threads)
    lanes = _native.attend_block_tiles()
    variants = {"lanes": lambda: _native.attend_block_tiles(lanes), "tiles": lambda: _native.attend_block_tiles(0)}
    gen = torch.Generator().manual_seed(0)
    report = {"device": device_description(torch.device("cpu")), "isa": _native.qmatmul_isa(), "threads": args.threads,
              "heads": [H, Hk, D], "layers": args.layers, "lanes_from_tiles": lanes, "shapes": {}}
    if args.compare_attention and args.compare_kv:
        ap.error("--compare-attention and --compare-kv: one comparison a run")
    for n, w, past in shapes:
        call = Call(torch, _native, n, w, past, args.layers, H, Hk, D, gen, KV_TORCH_DTYPES[args.kv_dtype])
        if args.compare_kv:
            half = Call(torch, _native, n, w, past, args.layers, H, Hk, D, gen, torch.float16, like=call)
            if not half_matches_rounded_float32(torch, _native, half, args.threads):
                print(f"error: {n}x{w}@{past}: the float16 cache did not give the bits of a float32 cache of its "
                      "values", file=sys.stderr)
                return 1
            calls = {"float32": call, "float16": half}
            current = [call]
            variants = {k: (lambda c=c: current.__setitem__(0, c)) for k, c in calls.items()}
            ms = alternated_ms(lambda: current[0](args.threads), variants, args.repeats)
            report["shapes"][f"{n}x{w}@{past}"] = {f"{k}_ms": v for k, v in ms.items()}
            continue
        if args.compare_attention:
            outs = {}
            for kind, use in variants.items():
                use()
                call(args.threads)
                outs[kind] = call.out.clone()
            variants["lanes"]()
            if not torch.equal(outs["lanes"], outs["tiles"]):
                print(f"error: {n}x{w}@{past}: the two scorings gave different bits", file=sys.stderr)
                return 1
            ms = alternated_ms(lambda: call(args.threads), variants, args.repeats)
        else:
            call(args.threads)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                call(args.threads)
                times.append(time.perf_counter() - t)
            ms = {"lanes": round(statistics.median(times) * 1e3, 3)}
        report["shapes"][f"{n}x{w}@{past}"] = {
            **{f"{k}_ms": v for k, v in ms.items()},
            "gmac_s": round(call.macs / (ms["lanes"] * 1e-3) / 1e9, 1)}
    print_and_write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
