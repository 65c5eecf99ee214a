"""Datastore microbenchmarks: suffix-array build, lookup latency, disk size.

Builds a text-like token corpus (Zipf-Mandelbrot over a 49,152 vocabulary,
documents of ~300 tokens on average separated by -1), then in one run:

  * suffix-array build: lookupdec's SA-IS vs pysais and pydivsufsort (both
    given the tokens as 2 bytes each, their largest alphabet), each in a fresh
    subprocess that loads the corpus saved by this process: wall and CPU
    seconds of the library call, and its extra peak memory = peak RSS during
    the call (VmHWM, reset once the input is loaded) - RSS before it - 4
    bytes/token (an int32 suffix array over the tokens);
  * lookup latency, median and p99 over contexts drawn from the corpus (half
    16-token windows, half a short corpus tail behind random tokens, so both
    long and short matches occur; a window keeps only the tokens after its
    last document separator, as a drafter's context would), on an index
    built with ``build_index_from_tokens`` in ``--shards`` shards and opened
    with ``open_index``:
      - ``SuffixIndex.lookup`` called as the drafters call it (a list of ints),
        the latency users feel;
      - the one native call inside it (``_native.Shards.lookup``);
      - the bare kernels (match + trie add + top) on one in-memory suffix
        array of the whole corpus, and a plain numpy version of the same rules;
  * disk bytes/token (int32 tokens + int32 SA) and, when
    ``lookupdec.index.build_index`` is available, build_index on the sample
    corpus (datastore/make_sample_corpus.py) with tokenizing and indexing
    rates reported separately.

Prints a Markdown table; ``--json PATH`` also writes every figure.
The machine may be shared: CPU seconds are reported next to wall seconds.

Usage:
    python benchmarks/datastore.py                 # 50M tokens (full run)
    python benchmarks/datastore.py --quick         # 1M tokens, smoke run
    python benchmarks/datastore.py --builders '' --no-build-index --no-numpy --shards 8
                                                   # lookup latency only, 8 shards
    python benchmarks/datastore.py --index /work/bench-data/z1b-20.index --no-composed
                                                   # lookup latency on an index already built
                                                   # (e.g. by benchmarks/build_scale.py)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUILDERS = ("lookupdec", "pysais", "pydivsufsort")


def zipf_corpus(n: int, vocab: int = 49152, doc_mean: int = 300, seed: int = 0) -> np.ndarray:
    """n int32 tokens: Zipf-Mandelbrot ranks (s = 1.07, q = 2.7, close to
    English word frequencies) mapped to shuffled ids, -1 between documents
    whose lengths are geometric with mean doc_mean."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(vocab, dtype=np.float64) + 2.7) ** 1.07
    ids = rng.permutation(vocab).astype(np.int32)
    tokens = ids[rng.choice(vocab, size=n, p=p / p.sum())]
    seps = np.cumsum(rng.geometric(1.0 / doc_mean, size=n // doc_mean * 2 + 16))
    tokens[seps[seps < n]] = -1
    return tokens


# ---- suffix-array builders (each run in a fresh subprocess) -----------------

def _two_bytes(tokens: np.ndarray) -> np.ndarray:
    """Tokens as uint16 (SEP -> 0, id -> id + 1): what the byte-level peers can take."""
    return (tokens.astype(np.int64) + 1).astype(np.uint16)


def _prepare(builder: str, tokens_path: str, two_bytes_path: str):
    """The builder's input in the form it takes (made before the baseline, so
    format conversions are not charged to the build)."""
    if builder == "lookupdec":
        return np.load(tokens_path)
    if builder == "pysais":
        return np.load(two_bytes_path).astype(">u2").tobytes()
    if builder == "pydivsufsort":
        return np.load(two_bytes_path)
    raise ValueError(f"unknown builder {builder!r}; choose from {BUILDERS}")


def _build(builder: str, data):
    """The library call alone (its raw result)."""
    if builder == "lookupdec":
        from lookupdec import _native
        return _native.suffix_array(data)
    if builder == "pysais":
        import PySAIS
        return PySAIS.sais(data, reduce_size=False)  # over 2 bytes per token
    import pydivsufsort
    return pydivsufsort.divsufsort(data)


def _token_sa(builder: str, raw: np.ndarray) -> np.ndarray:
    """The suffix array over tokens from a builder's raw result."""
    return raw[raw % 2 == 0] // 2 if builder == "pysais" else raw


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure_child(builder: str, tokens_path: str, two_bytes_path: str) -> None:
    """Runs in a fresh subprocess: prints one JSON line of time and memory.

    Memory is the build's own peak: the resident-set high-water mark (VmHWM)
    is reset once the input is loaded, and read right after the library
    call. ru_maxrss cannot be used here: Linux carries the parent's peak RSS
    into the child across exec, so it would report the parent's corpus
    generation instead of the build.
    """
    if builder == "lookupdec":
        from lookupdec import _native  # noqa: F401  (import cost outside the timing)
    elif builder == "pysais":
        import PySAIS  # noqa: F401
    else:
        import pydivsufsort  # noqa: F401
    data = _prepare(builder, tokens_path, two_bytes_path)
    n = int(np.load(tokens_path, mmap_mode="r").shape[0])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS (the input is resident)
    base_kb = _status_kb("VmRSS")
    cpu0, t0 = time.process_time(), time.perf_counter()
    raw = _build(builder, data)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak_kb = _status_kb("VmHWM")
    # beyond the input and an int32 suffix array over the tokens
    extra = (peak_kb - base_kb) * 1024 - 4 * n
    sa = _token_sa(builder, raw)
    print(json.dumps({"builder": builder, "seconds": seconds, "cpu_seconds": cpu,
                      "extra_bytes_per_token": extra / n, "peak_minus_input_mb": (peak_kb - base_kb) / 1024,
                      "n": int(sa.size)}))


def measure_build(builder: str, tokens_path: str, two_bytes_path: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--_measure", builder, tokens_path, two_bytes_path],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        return {"builder": builder, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- lookups -----------------------------------------------------------------

def make_contexts(tokens, count: int, max_n: int, seed: int = 1) -> list[np.ndarray]:
    """Contexts drawn from a corpus: tokens is one array, or a list of arrays
    (an index's shards), each context taken from one of them picked in
    proportion to its size."""
    rng = np.random.default_rng(seed)
    parts = [tokens] if isinstance(tokens, np.ndarray) else [t for t in tokens if t.size > max_n]
    sizes = np.array([t.size for t in parts], dtype=np.float64)
    out = []
    for i in range(count):
        tokens = parts[int(rng.choice(len(parts), p=sizes / sizes.sum()))] if len(parts) > 1 else parts[0]
        p = int(rng.integers(max_n, tokens.size))
        if i % 2 == 0:
            ctx = tokens[p - max_n:p]
        else:  # a short corpus tail behind random tokens: short, frequent matches
            tail = int(rng.integers(1, 5))
            ctx = np.concatenate([rng.integers(0, 49152, size=max_n - tail), tokens[p - tail:p]])
        seps = np.flatnonzero(ctx == -1)  # a drafter's context never holds a separator
        if seps.size:
            ctx = ctx[seps[-1] + 1:]
        out.append(np.ascontiguousarray(ctx, dtype=np.int32))
    return out


def documents(tokens: np.ndarray) -> list[np.ndarray]:
    """The documents of a corpus array (split at the separators)."""
    seps = np.flatnonzero(tokens == -1)
    bounds = np.concatenate([[-1], seps, [tokens.size]])
    return [tokens[a + 1:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]


def open_sharded(tokens: np.ndarray, shards: int, out_dir: Path):
    """tokens built into an index of about `shards` shards with build_index_from_tokens, then opened."""
    from lookupdec.index import build_index_from_tokens, open_index

    docs = documents(tokens)
    total = sum(d.size + 1 for d in docs)  # each document with its separator
    build_index_from_tokens(docs, out_dir, shard_tokens=max(2, -(-total // shards)), overwrite=True)
    return open_index(out_dir)


def native_lookup(native, trie, tokens, sa, ctx, max_n, min_n, max_occ, depth, budget):
    length, lo, hi = native.match(tokens, sa, ctx, max_n, min_n)
    trie.reset()
    if length:
        trie.add(tokens, sa, lo, hi, length, max_occ, depth)
    return length, trie.top(budget)


def numpy_lookup(tokens, sa, ctx, max_n, min_n, max_occ, depth, budget):
    """The same lookup in plain numpy + Python (the baseline)."""
    n = tokens.size

    def srange(pattern):
        L = pattern.size

        def less(i, upper):  # suffix sa[i] < pattern (or <= for the upper bound)
            s = int(sa[i])
            seg = tokens[s:s + L]
            diff = np.flatnonzero(seg != pattern[:seg.size])
            if diff.size:
                return seg[diff[0]] < pattern[diff[0]]
            return seg.size < L or upper

        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if less(mid, False) else (lo, mid)
        a, hi = lo, n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if less(mid, True) else (lo, mid)
        return a, lo

    seps = np.flatnonzero(ctx == -1)
    usable = ctx[seps[-1] + 1:] if seps.size else ctx
    a, b, best = min_n - 1, min(max_n, usable.size) + 1, (0, 0)
    while b - a > 1:
        mid = (a + b) // 2
        lo, hi = srange(usable[usable.size - mid:])
        a, b, best = (mid, b, (lo, hi)) if hi > lo else (a, mid, best)
    if a < min_n:
        return 0, None
    lo, hi = best
    k = min(hi - lo, max_occ)
    starts = sa[lo + (np.arange(k) * (hi - lo)) // k].astype(np.int64) + a
    pos = starts[:, None] + np.arange(depth)
    win = tokens[np.minimum(pos, n - 1)]
    valid = np.cumprod((pos < n) & (win != -1), axis=1).astype(bool)
    nodes = []
    for d in range(1, depth + 1):
        rows = win[valid[:, d - 1], :d]
        if rows.size == 0:
            break
        paths, counts = np.unique(rows, axis=0, return_counts=True)
        nodes.extend((-int(c), d, tuple(p.tolist())) for p, c in zip(paths, counts))
    nodes.sort()
    return a, nodes[:budget]


def _public(r):
    """(match length, tree) of a Lookup, the shape time_lookups reads."""
    return r.match_len, r.tree


def time_lookups(fn, contexts) -> dict:
    return time_interleaved({"x": (fn, contexts)})["x"]


def time_interleaved(runs: dict) -> dict:
    """Times several lookups on the same contexts, taking turns call by call, so a
    shared machine's load changes touch every one alike. At each turn each
    lookup reads a different context (lookup k is count * k / len(runs)
    contexts ahead): a context just read by another lookup would be in the CPU
    caches and time faster than a drafter's fresh one.

    Args:
        runs: name -> (fn, inputs); fn(inputs[i]) returns (match length, anything).
    Returns:
        name -> median, p99 and mean µs, and the mean match length.
    """
    names = list(runs)
    count = len(next(iter(runs.values()))[1])
    for name in names:
        fn, inputs = runs[name]
        for x in inputs[:20]:
            fn(x)  # warm-up
    times = {name: [] for name in names}
    lengths = {name: [] for name in names}
    stride = max(count // len(names), 1)
    for i in range(count):
        for k, name in enumerate(names):
            fn, inputs = runs[name]
            x = inputs[(i + k * stride) % count]
            t0 = time.perf_counter_ns()
            length, _ = fn(x)
            times[name].append(time.perf_counter_ns() - t0)
            lengths[name].append(length)
    out = {}
    for name in names:
        us = np.array(times[name]) / 1e3
        out[name] = {"median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
                     "mean_us": float(us.mean()), "mean_match_len": float(np.mean(lengths[name]))}
    return out


# ---- build_index on the sample corpus ----------------------------------------

def bench_build_index(out_dir: Path) -> dict | None:
    try:
        from lookupdec.index import build_index
    except ImportError:
        return None
    script = ROOT / "datastore" / "make_sample_corpus.py"
    if not script.exists():
        return None
    corpus = out_dir / "stdlib.jsonl"
    if not corpus.exists():
        subprocess.run([sys.executable, str(script), "-o", str(corpus)], check=True, cwd=ROOT)
    s = build_index([corpus], out_dir / "stdlib.index", overwrite=True, progress=False)
    return {"documents": s.documents, "tokens": s.tokens, "shards": s.shards,
            "seconds": s.seconds, "tokenize_tokens_per_s": s.tokenize_tokens_per_s,
            "index_tokens_per_s": s.index_tokens_per_s,
            "bytes_per_token": s.bytes_on_disk / max(s.tokens, 1)}


# ---- main --------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=50_000_000, help="corpus size (default 50M)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1M tokens, 200 lookups")
    ap.add_argument("--lookups", type=int, default=2000, help="contexts timed (default 2000)")
    ap.add_argument("--builders", default=",".join(BUILDERS), help="comma-separated SA builders ('' for none)")
    ap.add_argument("--shards", type=int, default=1, help="shards of the index the lookups run on (default 1)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the (slow) numpy lookup baseline")
    ap.add_argument("--no-composed", action="store_true",
                    help="accepted so recorded commands still run: the lookup composed in Python "
                    "(tests/oracles/suffix_lookup.py) is test code and no longer timed")
    ap.add_argument("--no-build-index", action="store_true", help="skip build_index on the sample corpus")
    ap.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    ap.add_argument("--index", type=Path, help="time lookups on this already-built index directory (e.g. "
                    "one made by benchmarks/build_scale.py) instead of generating and building; "
                    "contexts are drawn from its own shards")
    ap.add_argument("--warmup", type=int, default=0, help="with --index: look this many other contexts up "
                    "before timing (a fresh process pays a page fault per first-touched page of the "
                    "memory maps; a long-running server has paid them)")
    ap.add_argument("--_measure", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._measure:
        _measure_child(*args._measure)
        return 0
    if args.quick:
        args.tokens, args.lookups = 1_000_000, 200
    if args.index:
        return time_index(args)

    from lookupdec import _native
    from lookupdec.costs import device_description

    results: dict = {"tokens": args.tokens, "vocab": 49152, "cpus": os.cpu_count(), "cpu_model": device_description("cpu")}
    print(f"corpus: {args.tokens:,} Zipfian tokens, vocab 49,152, documents ~300 tokens", file=sys.stderr)
    tokens = zipf_corpus(args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        tokens_path, two_bytes_path = os.path.join(tmp, "tokens.npy"), os.path.join(tmp, "tokens_u16.npy")
        np.save(tokens_path, tokens)
        np.save(two_bytes_path, _two_bytes(tokens))
        results["build"] = []
        for builder in filter(None, args.builders.split(",")):
            print(f"building with {builder} ...", file=sys.stderr)
            results["build"].append(measure_build(builder, tokens_path, two_bytes_path))
    sa = _native.suffix_array(tokens)
    assert _native.check_suffix_array(tokens, sa) == ""
    results["disk_bytes_per_token"] = (tokens.nbytes + sa.nbytes) / tokens.size

    max_n, min_n, max_occ, depth, budget = 16, 2, 5000, 10, 64
    results["lookup_params"] = dict(max_n=max_n, min_n=min_n, max_occurrences=max_occ, depth=depth, budget=budget)
    contexts = make_contexts(tokens, args.lookups, max_n)
    lists = [c.tolist() for c in contexts]  # what the drafters pass
    kw = dict(max_n=max_n, min_n=min_n, max_occurrences=max_occ, depth=depth, budget=budget)
    trie = _native.ContinuationTrie(max_occ * depth)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"building an index of {args.shards} shard(s) ...", file=sys.stderr)
        t0 = time.perf_counter()
        index = open_sharded(tokens, args.shards, Path(tmp) / "bench.index")
        results["index"] = {"shards": index.n_shards, "build_seconds": time.perf_counter() - t0}
        print("timing lookups ...", file=sys.stderr)
        one = index._native.lookup
        runs = {
            "public": (lambda c: _public(index.lookup(c, **kw)), lists),
            "one_call": (lambda c: one(c, max_n, min_n, max_occ, depth, budget)[:4:3], contexts),
            "native": (lambda c: native_lookup(_native, trie, tokens, sa, c, max_n, min_n, max_occ, depth, budget),
                       contexts),
        }
        for name, figures in time_interleaved(runs).items():
            results[f"lookup_{name}"] = figures
    if not args.no_numpy:
        results["lookup_numpy"] = time_lookups(
            lambda c: numpy_lookup(tokens, sa, c, max_n, min_n, max_occ, depth, budget), contexts)

    if not args.no_build_index:
        print("build_index on the sample corpus ...", file=sys.stderr)
        out_dir = ROOT / "benchmarks" / "out"
        out_dir.mkdir(parents=True, exist_ok=True)
        results["build_index"] = bench_build_index(out_dir)

    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


LOOKUP = dict(max_n=16, min_n=2, max_occurrences=5000, depth=10, budget=64)


def time_index(args) -> int:
    """Lookup latency on an existing index: the public call and the native call
    inside it."""
    from lookupdec.index import open_index

    index = open_index(args.index)
    kw = LOOKUP
    shards = [(s.tokens, s.sa) for s in index._shards]
    contexts = make_contexts([t for t, _ in shards], args.lookups, kw["max_n"])
    lists = [c.tolist() for c in contexts]
    one = index._native.lookup
    p = (kw["max_n"], kw["min_n"], kw["max_occurrences"], kw["depth"], kw["budget"])
    from lookupdec import _native
    from lookupdec.costs import device_description

    runs = {"public": (lambda c: _public(index.lookup(c, **kw)), lists),
            "one_call": (lambda c: one(c, *p)[:4:3], contexts)}
    try:  # the same native call without the in-memory top bisection levels (a build before them has none)
        bare = _native.Shards(shards, index._token_limit, top_levels=0).lookup
        runs["one_call_no_top"] = (lambda c: bare(c, *p)[:4:3], contexts)
    except TypeError:
        bare = one
    if args.warmup:
        print(f"warming up with {args.warmup} other contexts ...", file=sys.stderr)
        for c in make_contexts([t for t, _ in shards], args.warmup, kw["max_n"], seed=2):
            one(c, *p)
            bare(c, *p)
    tokens = sum(int(t.size) for t, _ in shards)
    r = {"index": str(args.index), "entries": tokens, "shards": index.n_shards, "lookups": args.lookups,
         "warmup": args.warmup,
         "cpu_model": device_description("cpu"), "load_before": os.getloadavg()[0], "lookup_params": kw}
    print(f"timing {args.lookups} lookups on {args.index} ({tokens:,} entries, {index.n_shards} shards) ...",
          file=sys.stderr)
    for name, figures in time_interleaved(runs).items():
        r[f"lookup_{name}"] = figures
    r["load_after"] = os.getloadavg()[0]
    lines = [f"{args.index}: {tokens:,} entries in {index.n_shards} shard(s), {r['cpu_model']}, "
             f"1-min load {r['load_before']:.2f} before, {r['load_after']:.2f} after, "
             f"{args.warmup} warm-up contexts", "",
             "| lookup | median µs | p99 µs | mean µs | mean match length |", "|---|---|---|---|---|"]
    for name in runs:
        x = r[f"lookup_{name}"]
        lines.append(f"| {name} | {x['median_us']:.1f} | {x['p99_us']:.1f} | {x['mean_us']:.1f} | "
                     f"{x['mean_match_len']:.1f} |")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0


def render(r: dict) -> str:
    lines = [f"Suffix array of {r['tokens']:,} tokens (vocab {r['vocab']:,}, Zipfian, {r['cpus']} CPUs, "
             f"{r['cpu_model']}):", "",
             "| builder | wall s | CPU s | extra memory B/token |", "|---|---|---|---|"]
    for b in r["build"]:
        if "error" in b:
            lines.append(f"| {b['builder']} | failed: {b['error']} | | |")
        else:
            lines.append(f"| {b['builder']} | {b['seconds']:.2f} | {b['cpu_seconds']:.2f} | "
                         f"{b['extra_bytes_per_token']:.2f} |")
    p = r["lookup_params"]
    lines += ["", f"Lookup (max_n {p['max_n']}, min_n {p['min_n']}, up to {p['max_occurrences']} occurrences, "
              f"depth {p['depth']}, top {p['budget']}), {r['tokens']:,}-token index in "
              f"{r['index']['shards']} shard(s), rows timed interleaved context by context:", "",
              "| lookup | median µs | p99 µs | mean µs | mean match length |", "|---|---|---|---|---|"]
    names = {"public": "SuffixIndex.lookup (public, list context)", "one_call": "Shards.lookup (the native call)",
             "native": "bare kernels, one in-memory array", "numpy": "numpy, one in-memory array"}
    for name, label in names.items():
        x = r.get(f"lookup_{name}")
        if x:
            lines.append(f"| {label} | {x['median_us']:.1f} | {x['p99_us']:.1f} | {x['mean_us']:.1f} | "
                         f"{x['mean_match_len']:.1f} |")
    lines += ["", f"Disk: {r['disk_bytes_per_token']:.1f} bytes/token (int32 tokens + int32 suffix array)."]
    bi = r.get("build_index")
    if bi:
        lines += ["", "build_index on the stdlib sample corpus:", "",
                  "| documents | tokens | shards | seconds | tokenizing tokens/s | indexing tokens/s | disk B/token |",
                  "|---|---|---|---|---|---|---|",
                  f"| {bi['documents']:,} | {bi['tokens']:,} | {bi['shards']} | {bi['seconds']:.1f} | "
                  f"{bi['tokenize_tokens_per_s']:,.0f} | {bi['index_tokens_per_s']:,.0f} | {bi['bytes_per_token']:.2f} |"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
