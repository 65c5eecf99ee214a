"""The load benchmark's report: percentiles, ratios over `ar`, the Markdown tables and the plot
(``serve_load.py`` runs the passes; its ``Row`` records are what these read)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve_load import Row


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), 0 for no data."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def ratios(rows: list[Row]) -> dict[tuple[str, int], list[float]]:
    """(config, concurrency) -> its tokens/s over ``ar``'s in the same round, one per round."""
    ar = {(r.concurrency, r.round): r.tokens_per_s for r in rows if r.config == "ar"}
    out: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        base = ar.get((r.concurrency, r.round))
        if r.config != "ar" and base:
            out.setdefault((r.config, r.concurrency), []).append(r.tokens_per_s / base)
    return out


def markdown(rows: list[Row], meta: dict) -> str:
    kind = "conversations, every turn" if meta.get("conversations") else "prompts, first turns"
    lines = [f"Serving load: {meta['requests']} requests ({meta['prompts']} Spec-Bench {kind}), "
             f"{meta['max_new_tokens']} new tokens max, greedy; "
             f"{meta.get('device') or meta.get('cpu')}, {meta['threads']}; {meta['rounds']} round(s), the configurations interleaved."
             + (f" Stopped early: {meta['stopped']}." if meta.get("stopped") else ""), "",
             "| config | concurrency | round | tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | tau "
             "| steps | step ms | forward ms | in steps | reused | exact |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (r.config, r.concurrency, r.round)):
        ours = r.config != "llama_cpp"
        lines.append(f"| {r.config} | {r.concurrency} | {r.round} | {r.tokens_per_s:.1f} | {r.ttft_p50_ms:.0f} "
                     f"| {r.ttft_p99_ms:.0f} | {r.tpot_p50_ms:.1f} | {r.tpot_p99_ms:.1f} | "
                     f"{f'{r.tau:.2f}' if ours else '-'} | {r.steps if ours else '-'} | "
                     f"{f'{r.step_ms:.1f}' if ours else '-'} | {f'{r.forward_ms:.1f}' if ours else '-'} | "
                     f"{f'{r.in_steps:.0%}' if ours else '-'} | {f'{r.reused:.0%}' if ours else '-'} | "
                     f"{'-' if r.exact is None else ('yes' if r.exact else 'NO')} |")
    rat = ratios(rows)
    if rat:
        lines += ["", "Tokens/s over batched `ar`'s at the same concurrency in the same round (each round's, then their mean):",
                  "", "| config | concurrency | per round | mean |", "|---|---:|---|---:|"]
        for (config, c), xs in sorted(rat.items()):
            lines.append(f"| {config} | {c} | {', '.join(f'{x:.2f}' for x in xs)} | {sum(xs) / len(xs):.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for config in dict.fromkeys(r.config for r in rows):
        by_c: dict[int, list[float]] = {}
        for r in rows:
            if r.config == config:
                by_c.setdefault(r.concurrency, []).append(r.tokens_per_s)
        pts = [(c, sum(v) / len(v)) for c, v in sorted(by_c.items())]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_title("lookupdec serve: throughput against concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
