"""Build throughput: a local build with --jobs 1 and 2, and a Ray build on a 2-CPU local cluster, same corpus.

    python benchmarks/build_throughput.py datastore/sample/stdlib.jsonl [--shard-tokens N]

Prints, per engine, the wall time, tokens/s over the whole build, tokenizing and
indexing tokens/s (local builds), peak RSS, and checks that every build wrote
the same shard files. Numbers depend on the machine's load: note `uptime`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--shard-tokens", type=int, default=1_000_000)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    from lookupdec.index import build_index

    print(f"load average: {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="build-bench-"))
    rows = []
    try:
        runs = [("local --jobs 1", dict(jobs=1)), ("local --jobs 2", dict(jobs=2))]
        if not args.no_ray:
            runs.append(("ray, 2 CPUs", dict(engine="ray")))
        for name, kw in runs:
            if kw.get("engine") == "ray":
                import ray

                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            out = work / name.replace(" ", "_").replace(",", "")
            s = build_index(args.corpus, out, shard_tokens=args.shard_tokens, progress=False, **kw)
            if kw.get("engine") == "ray":
                ray.shutdown()
            rows.append((name, s, out))
            tok = f"{s.tokenize_tokens_per_s:,.0f}" if s.tokenize_seconds else "-"
            idx = f"{s.index_tokens_per_s:,.0f}" if s.index_seconds else "-"
            print(f"{name:16s} {s.tokens:,} tokens, {s.shards} shards: {s.seconds:6.2f} s, "
                  f"{s.tokens / s.seconds:,.0f} tokens/s overall; tokenizing {tok} tokens/s; indexing {idx} tokens/s; "
                  f"peak RSS {s.peak_rss_bytes / 2**20:,.0f} MiB")
        base = rows[0][1]
        for name, s, out in rows[1:]:
            same = all((out / p.name).read_bytes() == p.read_bytes()
                       for p in rows[0][2].iterdir() if p.name != "manifest.json")
            print(f"{name}: {base.seconds / s.seconds:.2f}x the --jobs 1 build's speed; files identical: {same}")
        if len(rows) == 3:
            print(f"ray overhead over local --jobs 2: {rows[2][1].seconds / rows[1][1].seconds:.2f}x its wall time")
        print(f"load average: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
