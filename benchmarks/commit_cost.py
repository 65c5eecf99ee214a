"""What a commit (``kvcache.keep_rows``) costs on transformers' cache, with the layers' buffers in
one ``LayerStore`` (what ``new_cache`` builds) and with a buffer per layer, in the same run.

A commit keeps the accepted rows of a verified tree: when they are not a prefix of the tree's
rows they are moved, in every layer. On a GPU every operation is a kernel launch from the host.

Usage:
    python benchmarks/commit_cost.py [--past 600] [--width 16] [--keep 0,3,7,12] [--repeats 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--past", type=int, default=600, help="cached rows before the verified rows")
    ap.add_argument("--width", type=int, default=16, help="rows of each verify forward")
    ap.add_argument("--keep", default="0,3,7,12", help="offsets (in the verified rows) of the rows kept")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default=None, help="torch device [default: LOOKUPDEC_DEVICE, else CUDA if available]")
    args = ap.parse_args()

    import torch

    from lookupdec.kvcache import BufferedCache, BufferedLayer, keep_rows, new_cache, with_cache
    from lookupdec.models import load_model

    torch.set_num_threads(args.threads)
    lm = load_model(device=args.device)
    model, device = lm.model, lm.model.device
    offsets = [int(x) for x in args.keep.split(",")]
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    kinds = {"one store": lambda: new_cache(model.config, args.past + 64),
             "a buffer per layer": lambda: BufferedCache([BufferedLayer(args.past + 64) for _ in range(n_layers)])}
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (1, args.past), generator=gen).to(device)
    steps = [torch.randint(100, 40000, (1, args.width), generator=gen).to(device) for _ in range(args.repeats)]
    for name, make in kinds.items():
        cache, ms = make(), []
        with torch.inference_mode():
            model(prompt, **with_cache(model, cache), use_cache=True)
            past = args.past
            for ids in steps:
                model(ids, **with_cache(model, cache), use_cache=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                keep_rows(cache, past, [past + o for o in offsets])
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                ms.append((time.perf_counter() - t) * 1e3)
                past += len(offsets)
        print(f"{name:>20}: {statistics.median(ms):.3f} ms a commit (median of {len(ms)}; {device}, "
              f"{torch.get_num_threads()} threads, {n_layers} layers)")


if __name__ == "__main__":
    main()
