"""PNG figures of a run, drawn with matplotlib's Agg backend (no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from .metrics import OVERALL, TaskSummary
from .tasks import TASK_TITLES, TASKS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(summaries: Mapping[tuple[str, str], TaskSummary], methods: Sequence[str],
                 path: str | Path) -> Path:
    """Grouped bars: speedup over the baseline per task (and overall), one bar per method.

    Error bars are the sample std of per-question speedups; the dashed line is 1×.

    Returns:
        ``path`` (a PNG).
    """
    plt = _pyplot()
    baseline = next(iter(summaries.values())).baseline
    tasks = [t for t in TASKS if (methods[0], t) in summaries] + [OVERALL]
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(tasks) + 0.4 * len(methods)), 4))
    for i, m in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(tasks))]
        ys = [summaries[(m, t)].speedup for t in tasks]
        err = [summaries[(m, t)].speedup_std for t in tasks]
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=m)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([TASK_TITLES.get(t, "Overall") for t in tasks])
    ax.set_ylabel(f"speedup over {baseline}")
    ax.set_title("Spec-Bench speedup per task")
    ax.legend(fontsize="small", ncol=min(4, len(methods)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_accept_hist(hists: Mapping[str, Mapping[int, int]], methods: Sequence[str], path: str | Path) -> Path:
    """One panel per method: share of steps that committed k tokens (k = accepted + 1).

    Returns:
        ``path`` (a PNG).
    """
    plt = _pyplot()
    shown = [m for m in methods if hists.get(m)]
    kmax = max((max(hists[m]) for m in shown), default=1)
    cols = min(3, max(1, len(shown)))
    rows = max(1, -(-len(shown) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False, sharex=True)
    for ax, m in zip(axes.flat, shown):
        h = hists[m]
        total = sum(h.values())
        ks = list(range(1, kmax + 1))
        ax.bar(ks, [h.get(k, 0) / total for k in ks])
        mean = sum(k * c for k, c in h.items()) / total
        ax.set_title(f"{m} (mean {mean:.2f}, {total} steps)", fontsize="small")
        ax.set_xlabel("tokens per step")
        ax.tick_params(labelbottom=True)  # sharex hides inner panels' labels otherwise
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    axes[0][0].set_ylabel("share of steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
