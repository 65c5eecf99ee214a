"""Why the 8-bit format (``quantized-int8``) has its own kernel: fbgemm's dynamic int8 product is not row-independent.

fbgemm's dynamic int8 linear (``torch.ops.quantized.linear_dynamic``) quantizes
the activations with ONE scale for the whole batch of rows, so a verify row's
output depends on the other rows of the forward (a tree's other nodes, another
sequence of a batch): greedy output could then differ from ``ar``, which
computes that row alone. Quantizing per row means one product call per row,
which gives up the batching speculation lives on. This script measures both:

- row dependence: the max change of row 0's output when the other rows of the
  batch change (float32 and float16 weights: 0 by construction of their kernels
  up to their width-dependent rounding; int8: the shared scale);
- time of the products of ``--layers`` layers of the embedded model's shapes
  (distinct weights per layer, so they stream from memory) at several widths:
  float32 (oneDNN), float16 (fbgemm), int8 batched (one scale), int8 per row
  (one call per row: row-independent), int8 row-scaled (each row quantized
  with its own scale, one exact int32 product for all rows, ``torch._int_mm``:
  row-independent bit for bit, yet not exact end to end, see README's Weight
  formats), and two formats the fast forward does
  not offer, for comparison: weight-only int8 with per-channel scales
  (``_weight_int8pack_mm``; torch takes bfloat16 activations for it on CPU) and
  bfloat16 weights and activations (``F.linear``; oneDNN, AMX where the CPU has
  it). Both round every activation to bfloat16, whose 8-bit mantissa makes a
  row's output depend on the width of its forward by far more than float32's
  rounding (see RESULTS.md's exactness audit in bfloat16).

Usage:
    python benchmarks/int8_rows.py [--threads 2] [--layers 30] [--widths 1,4,8,16] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The embedded model's four products (out, in): fused qkv, o, fused gate/up, down.
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--widths", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    import torch

    from lookupdec.costs import device_description
    from lookupdec.products import make_linear

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    widths = [int(w) for w in args.widths.split(",")]
    weights = [[torch.randn(o, i, generator=g) * 0.05 for o, i in SHAPES] for _ in range(args.layers)]

    def int8_pack(w):
        return torch.ops.quantized.linear_prepack(torch.quantize_per_tensor(w, float(w.abs().max()) / 127, 0,
                                                                            torch.qint8), None)

    def int8(x, p):
        return torch.ops.quantized.linear_dynamic(x, p, True)  # reduce_range: fbgemm's usual setting

    def int8_channels(w):
        """Per-output-channel int8 weights (out, in) and their float32 scales."""
        scale = w.abs().amax(1).clamp_min(1e-30) / 127
        return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale

    def int8_row_scaled(x, p):
        sx = x.abs().amax(1, keepdim=True).clamp_min_(1e-30).div_(127)
        return torch._int_mm(torch.round(x / sx).to(torch.int8), p[0]).float().mul_(sx).mul_(p[1])

    def int8_weight_only(w):
        q, scale = int8_channels(w)
        return q, scale.bfloat16()

    packs = {
        "float32": [[make_linear(w, None, "float32") for w in layer] for layer in weights],
        "float16": [[make_linear(w, None, "float16") for w in layer] for layer in weights],
        "int8": [[int8_pack(w) for w in layer] for layer in weights],
        "int8 weights": [[int8_weight_only(w) for w in layer] for layer in weights],
        "int8 channels": [[(q.t(), s) for q, s in map(int8_channels, layer)] for layer in weights],  # (in, out)
        "bfloat16": [[w.bfloat16() for w in layer] for layer in weights],
    }
    run = {
        "float32": lambda x, p: p(x),
        "float16": lambda x, p: p(x),
        "int8 batched": int8,
        "int8 per row": lambda x, p: torch.cat([int8(x[r:r + 1], p) for r in range(x.shape[0])]),
        "int8 row-scaled": int8_row_scaled,
        "int8 w-only": lambda x, p: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), p[0], p[1]),
        "bfloat16": lambda x, p: torch.nn.functional.linear(x.bfloat16(), p),
    }
    pack_of = {"float32": "float32", "float16": "float16", "int8 batched": "int8", "int8 per row": "int8",
               "int8 row-scaled": "int8 channels", "int8 w-only": "int8 weights", "bfloat16": "bfloat16"}

    # Row dependence: row 0 alone in a batch of 8 vs with the other 7 rows scaled up 50x.
    w0 = weights[0][2]
    x = torch.randn(8, 576, generator=g)
    y = x.clone()
    y[1:] *= 50
    print(f"{device_description('cpu')}; {args.threads} threads; {args.layers} layers of {SHAPES}")
    print("row 0's output when the other rows of its batch change (max |diff|):")
    for name, fn in run.items():
        p = packs[pack_of[name]][0][2]
        a, b = fn(x, p)[0].float(), fn(y, p)[0].float()
        print(f"  {name:15} {float((a - b).abs().max()):.3g}   (|row 0| max {float(a.abs().max()):.3g})")
    del w0

    print(f"products of {args.layers} layers, median of {args.repeats} (ms):")
    print(f"{'rows':>5} " + " ".join(f"{n:>15}" for n in run))
    inputs = {576: None, 1536: None}
    for w in widths:
        inputs = {576: torch.randn(w, 576, generator=g), 1536: torch.randn(w, 1536, generator=g)}
        row = []
        for name, fn in run.items():
            ts = []
            for rep in range(args.repeats + 1):
                t = time.perf_counter()
                for layer in packs[pack_of[name]]:
                    for (o, i), p in zip(SHAPES, layer):
                        fn(inputs[i], p)
                if rep:
                    ts.append(time.perf_counter() - t)
            row.append(statistics.median(ts) * 1e3)
        print(f"{w:>5} " + " ".join(f"{ms:>15.1f}" for ms in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
