"""Per-step work on logit rows, native against the torch route it replaced.

- the deferred top-k (Token Recycling's): ``lookupdec.tree_rows.topk_rows`` against torch's ``topk`` +
  ``logsumexp``, for 1, 3 and 8 rows;
- a sampled token: ``lookupdec.sampling.draw`` against ``sample_at(target_probs(...))``, one row at
  temperature 0.7.

Random rows of the embedded model's vocabulary size; medians of ``--repeats``.

Usage:
    python benchmarks/logit_rows.py --threads 2 [--vocab 49152] [--k 8]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args(argv)

    import torch

    from lookupdec.costs import device_description
    from lookupdec.sampling import SamplingParams, draw, sample_at, target_probs
    from lookupdec.tree_rows import topk_rows

    if args.threads:
        torch.set_num_threads(args.threads)

    def torch_topk(x, k):
        vals, ids = torch.topk(x, k, dim=-1)
        probs = torch.exp(vals - torch.logsumexp(x, dim=-1, keepdim=True))
        return ids.numpy(), probs.numpy()

    def median_ms(fn):
        for _ in range(10):
            fn()
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    print(f"{device_description(torch.device('cpu'))}; {torch.get_num_threads()} threads; vocab {args.vocab}, k {args.k}")
    for rows in (1, 3, 8):
        x = torch.randn(rows, args.vocab, generator=torch.Generator().manual_seed(rows)) * 4
        native = median_ms(lambda: topk_rows(x, args.k))
        plain = median_ms(lambda: torch_topk(x, args.k))
        print(f"top-k of {rows} rows: native {native:.3f} ms, torch {plain:.3f} ms ({plain / native:.1f}x)")
    row = torch.randn(args.vocab, generator=torch.Generator().manual_seed(0)) * 4
    params = SamplingParams(0.7)
    native = median_ms(lambda: draw(row, params, 0.37))
    plain = median_ms(lambda: sample_at(target_probs(row, params), 0.37))
    print(f"a sampled token: native {native:.3f} ms, torch {plain:.3f} ms ({plain / native:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
