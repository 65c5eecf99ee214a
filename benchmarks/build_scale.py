"""A datastore build at scale: time, peak RSS and disk of one synthetic-token build.

Streams a Zipfian token corpus (the generator of benchmarks/datastore.py,
drawn chunk by chunk so the corpus is never held in memory) into
``build_index_from_tokens`` and reports the build's wall time, its peak
resident set (the build summary's peak_rss_bytes: this process's maximum RSS, fresh per run)
and the bytes of the index on disk. Run it once per corpus size, each in its
own process, to see whether peak RSS grows with the corpus:

    python benchmarks/build_scale.py --tokens 100000000 --shard-tokens 50000000 -o /work/bench-data/z100m.index
    python benchmarks/build_scale.py --tokens 1000000000 --shard-tokens 50000000 -o /work/bench-data/z1b-20.index

The index it leaves is what ``benchmarks/datastore.py --index PATH`` times.
The same ``--seed`` and ``--chunk`` give the same corpus; prints one
JSON object (and writes it with ``--json``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 49152


def zipf_documents(tokens: int, *, seed: int = 0, doc_mean: int = 300, chunk: int = 1 << 22) -> Iterator[np.ndarray]:
    """Documents of about ``tokens`` Zipf-Mandelbrot tokens in total (s = 1.07,
    q = 2.7 over a 49,152 vocabulary, as benchmarks/datastore.py), lengths
    geometric with mean doc_mean, generated one document batch at a time.

    Args:
        tokens: corpus tokens to generate (the last document is cut to fit).
        seed: the corpus is a function of the seed alone.
        doc_mean: mean document length.
        chunk: tokens drawn per batch (memory, not the corpus, depends on it).

    Returns:
        An iterator of int32 arrays (no separators; the build adds them).

    Example:
        >>> sum(d.size for d in zipf_documents(10_000))
        10000
    """
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(VOCAB, dtype=np.float64) + 2.7) ** 1.07
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    ids = rng.permutation(VOCAB).astype(np.int32)
    left = tokens
    while left > 0:
        target = min(chunk, left)
        lengths = rng.geometric(1.0 / doc_mean, size=2 * chunk // doc_mean + 16)
        k = int(np.searchsorted(np.cumsum(lengths), target, side="right"))
        lengths = lengths[:k] if k else np.array([target])  # whole documents that fit, else one cut to fit
        m = int(lengths.sum())
        ranks = np.searchsorted(cdf, rng.random(m), side="right").astype(np.int32)
        batch = ids[np.minimum(ranks, VOCAB - 1)]
        for piece in np.split(batch, np.cumsum(lengths)[:-1]):
            yield piece
        left -= m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, required=True, help="corpus tokens")
    ap.add_argument("--shard-tokens", type=int, required=True, help="shard size passed to the build")
    ap.add_argument("-o", "--out", type=Path, required=True, help="index directory to create (replaced if present)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()

    from lookupdec.index import build_index_from_tokens

    t0 = time.perf_counter()
    s = build_index_from_tokens(zipf_documents(args.tokens, seed=args.seed), args.out,
                                shard_tokens=args.shard_tokens, overwrite=True)
    wall = time.perf_counter() - t0
    res = {"tokens": s.tokens, "documents": s.documents, "shards": s.shards, "shard_tokens": args.shard_tokens,
           "seconds": wall, "index_seconds": s.index_seconds, "bytes_on_disk": s.bytes_on_disk,
           "disk_bytes_per_token": s.bytes_on_disk / s.tokens,
           "peak_rss_mb": s.peak_rss_bytes / 2**20, "path": str(args.out)}
    print(json.dumps(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
