"""Whether the quantized products' speed depends on where the linker places their code.

Links the objects of the current build (``make build``) into copies of the extension with 0, 16,
32, 48 ... bytes of padding between the Cython module and the hand-written kernels, so every
kernel moves by that much and nothing else changes, then times one-row products in each copy,
one process at a time, the copies alternated round by round. Products on fresh random weights,
shaped like the embedded model's: its 30 layers' seven products (Q4_1 and Q8_0 alternating) and
the 49,152 x 576 Q8_0 ``lm_head``.

A kernel whose time moves with the padding (beyond the spread of one copy's own rounds) is
sensitive to code placement: any unrelated change to ``ext/`` can then speed it up or slow it
down. Before the prefetch was spread over the tile (``ahead_step`` in ext/csrc/qmatmul_tile.h),
16, 32 or 48 bytes of padding made the one-row ``lm_head`` product 40-60% slower (one thread,
AMD EPYC with AVX-512).

Usage:
    python benchmarks/layout_check.py [--pads 0,16,32,48] [--rounds 2] [--threads 1] [--rows 1]
                                      [--bf16 | --isa avx512|avx2|c] [--out FILE]

Prints a JSON object (and writes it to ``--out`` when given) naming the CPU, ISA and threads.
Needs gcc and the object files ``python setup.py build_ext --inplace`` leaves under build/.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from json_report import print_and_write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
K, VOCAB = 576, 49152
LAYER_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (n, k): q k v o gate up down


def objects() -> tuple[str, list[str]]:
    found = sorted(glob.glob(str(ROOT / "build" / "temp.*" / "ext")))
    if not found:
        sys.exit("layout_check: no object files under build/temp.*/ext: run `make build` first")
    ext = Path(found[-1])
    native, kernels = ext / "_native.o", sorted(glob.glob(str(ext / "csrc" / "*.o")))
    if not native.exists() or not kernels:
        sys.exit(f"layout_check: {ext} lacks _native.o or csrc/*.o: run `make build` first")
    return str(native), kernels


def link(pad: int, out_dir: Path) -> Path:
    """A copy of the package whose extension has ``pad`` bytes between the module and the kernels."""
    native, kernels = objects()
    pkg = out_dir / f"pad{pad}" / "lookupdec"
    shutil.copytree(ROOT / "lookupdec", pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    src = out_dir / f"pad{pad}.s"
    src.write_text(".text\n.globl lk_layout_pad\nlk_layout_pad:\n" + (f".skip {pad}, 0xcc\n" if pad else "")
                   + '.section .note.GNU-stack,"",@progbits\n')  # no executable stack for the copy
    obj = out_dir / f"pad{pad}.o"
    subprocess.run(["gcc", "-c", str(src), "-o", str(obj)], check=True)
    so = next(iter(glob.glob(str(ROOT / "lookupdec" / "_native*.so"))), None)
    if so is None:
        sys.exit("layout_check: lookupdec/_native*.so missing: run `make build` first")
    subprocess.run(["gcc", "-shared", "-pthread", native, str(obj), *kernels, "-ldl", "-o", str(pkg / Path(so).name)],
                   check=True)
    return pkg.parent


def child(rows: int, threads: int, iters: int, bf16: bool, isa: str | None) -> dict:
    """Median ms of the layers' products (summed) and of lm_head, over ``iters`` passes."""
    import numpy as np
    import torch  # loads the OpenMP runtime the products share, as in the decoder

    import lookupdec._native as native
    from lookupdec._native import QMATMUL_BF16, QMATMUL_FORMATS, qmatmul_force_isa, qmatmul_ptr

    if not native.__file__.startswith(os.environ["LK_LAYOUT_DIR"]):
        sys.exit(f"layout_check: imported {native.__file__}, not the padded copy")

    torch.set_num_threads(threads)
    if isa and not qmatmul_force_isa(isa):
        sys.exit(f"layout_check: this CPU cannot run the {isa!r} products")
    rng = np.random.default_rng(0)
    flag = QMATMUL_BF16 if bf16 else 0

    def matrix(n, k, fmt):
        nblk = k // 32
        q4 = fmt == QMATMUL_FORMATS["q4_1"]
        qs = rng.integers(0, 256, size=(n, nblk * (16 if q4 else 32)), dtype=np.uint8)
        dm = rng.standard_normal((n, nblk * (2 if q4 else 1))).astype(np.float32)
        return fmt, n, k, qs, dm

    layers = [matrix(n, k, QMATMUL_FORMATS["q4_1" if i % 2 else "q8_0"])
              for layer in range(30) for i, (n, k) in enumerate(LAYER_SHAPES)]
    head = matrix(VOCAB, K, QMATMUL_FORMATS["q8_0"])
    xs = {k: rng.standard_normal((rows, k)).astype(np.float32) for k in {K, 1536}}
    y = np.empty((rows, VOCAB), np.float32)

    def run(m):
        fmt, n, k, qs, dm = m
        qmatmul_ptr(fmt | flag, xs[k].ctypes.data, rows, k, qs.ctypes.data, dm.ctypes.data, n, y.ctypes.data, threads)

    t_layers, t_head = [], []
    for _ in range(iters + 1):
        t0 = time.perf_counter_ns()
        for m in layers:
            run(m)
        t1 = time.perf_counter_ns()
        run(head)
        t_layers.append((t1 - t0) / 1e6)
        t_head.append((time.perf_counter_ns() - t1) / 1e6)
    return {"layers_ms": round(statistics.median(t_layers[1:]), 3), "lm_head_ms": round(statistics.median(t_head[1:]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pads", default="0,16,32,48", help="bytes of padding ahead of the kernels, one copy each")
    ap.add_argument("--rounds", type=int, default=2, help="processes per copy, the copies alternated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--iters", type=int, default=60, help="timed passes a process")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 products (QMATMUL_BF16)")
    ap.add_argument("--isa", choices=["avx512", "avx2", "c"], default=None,
                    help="run this instruction set's float32 products (default: the widest this CPU has)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.rows, args.threads, args.iters, args.bf16, args.isa)))
        return
    try:
        pads = [int(p) for p in args.pads.split(",")]
    except ValueError:
        sys.exit(f"layout_check: --pads must be comma-separated byte counts, got {args.pads!r}")
    if any(p < 0 for p in pads) or args.rounds < 1 or args.threads < 1 or args.rows < 1 or args.iters < 1:
        sys.exit("layout_check: --pads must be >= 0 and --rounds, --threads, --rows, --iters >= 1")
    if args.bf16 and args.isa:
        sys.exit("layout_check: --bf16 times the bfloat16 products, which follow the widest ISA: drop --isa")
    sys.path.insert(0, str(ROOT))
    from lookupdec._native import qmatmul_bf16_isa, qmatmul_isa
    import torch

    from lookupdec.costs import device_description

    runs: dict[int, list[dict]] = {p: [] for p in pads}
    with tempfile.TemporaryDirectory(prefix="lk-layout-") as tmp:
        dirs = {p: link(p, Path(tmp)) for p in pads}
        for _ in range(args.rounds):
            for p in pads:
                env = {**os.environ, "PYTHONPATH": str(dirs[p]), "LK_LAYOUT_DIR": str(dirs[p])}
                cmd = [sys.executable, __file__, "--child", "--rows", str(args.rows), "--threads", str(args.threads),
                       "--iters", str(args.iters)] + (["--bf16"] if args.bf16 else []) \
                    + (["--isa", args.isa] if args.isa else [])
                out = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"layout_check: the copy with {p} bytes of padding failed:\n{out.stderr[-2000:]}")
                runs[p].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {
        "device": device_description(torch.device("cpu")),
        "isa": qmatmul_bf16_isa() if args.bf16 else args.isa or qmatmul_isa(),
        "threads": args.threads, "rows": args.rows, "bf16": args.bf16,
        "runs": {str(p): r for p, r in runs.items()},
        "lm_head_ms_by_pad": {str(p): [r["lm_head_ms"] for r in rs] for p, rs in runs.items()},
        "layers_ms_by_pad": {str(p): [r["layers_ms"] for r in rs] for p, rs in runs.items()},
    }
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
