"""The run's files: a JSON of every figure and a Markdown table like Spec-Bench's."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

from .metrics import OVERALL, TaskSummary, TurnShortfalls, accept_histograms, as_dict, method_order
from .runner import TurnRecord
from .tasks import TASK_TITLES, TASKS


def record_dict(r: TurnRecord) -> dict:
    """A ``TurnRecord`` as JSON fields, ``tokens_per_s`` included."""
    d = asdict(r)
    d["tokens_per_s"] = r.tokens_per_s
    d["accept_hist"] = {str(k): v for k, v in r.accept_hist.items()}
    return d


def write_json(path: str | Path, config: Mapping, records: Sequence[TurnRecord],
               summaries: Mapping[str, Mapping[tuple[str, str], TaskSummary]] | None = None,
               error: str | None = None, turns: Mapping[str, TurnShortfalls] | None = None) -> Path:
    """Write the run (config, per-turn records, summaries per baseline, error) atomically.

    Args:
        path: the JSON file to write.
        config: the run's settings (command line, model, versions).
        records: every ``TurnRecord``.
        summaries: baseline name -> ``summarize(records, baseline)``.
        error: the mismatch message of a failed run.
        turns: ``turn_shortfalls(records, ...)``: each method's turns under the threshold.

    Returns:
        ``path``.
    """
    path = Path(path)
    doc = {
        "config": dict(config),
        "error": error,
        "summary": {b: as_dict(s) for b, s in (summaries or {}).items()},
        "turns": {m: asdict(t) for m, t in (turns or {}).items()},
        "accept_hist": {m: {str(k): v for k, v in h.items()} for m, h in accept_histograms(records).items()},
        "records": [record_dict(r) for r in records],
    }
    tmp = path.with_suffix(path.suffix + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=True)
    os.replace(tmp, path)
    return path


def _num(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _decode_cell(s: TaskSummary) -> str:
    if math.isnan(s.decode_speedup):
        return "–"
    return f"{_num(s.decode_speedup)}× / {_num(s.decode_tokens_per_s, 1)}"


def markdown_table(summaries: Mapping[tuple[str, str], TaskSummary], methods: Sequence[str],
                   second: Mapping[tuple[str, str], TaskSummary] | None = None) -> str:
    """Spec-Bench's leaderboard table, plus per-task accepted tokens and tokens/s.

    Args:
        summaries: ``summarize(records, baseline)`` for the main baseline.
        methods: row order.
        second: ``summarize`` against a second baseline (``ar``); adds an
            "Overall vs <second>" column to the speedup tables.

    Returns:
        Markdown: a caption line, the speedup table, a blank line, the
        table of mean accepted tokens / tokens/s per task, and, when any method
        reports its first steps' time, the decode-only speedups per task.

    Example:
        >>> print(markdown_table(summarize(records, "hf"), ["hf", "ar", "pld"]))  # doctest: +SKIP
    """
    any_s = next(iter(summaries.values()))
    baseline = any_s.baseline
    tasks = [t for t in TASKS if (methods[0], t) in summaries]
    n = {t: summaries[(methods[0], t)].n_questions for t in tasks + [OVERALL]}
    sec_name = next(iter(second.values())).baseline if second else None

    head = ["Method"] + [f"{TASK_TITLES[t]} (n={n[t]})" for t in tasks] + [f"Overall (n={n[OVERALL]})"]
    if second:
        head.append(f"Overall vs {sec_name}")
    head += ["Mean accepted", "Tokens/s", "Overhead", "Overhead, decode"]
    lines = [
        f"Speedup over `{baseline}` (ratio of mean per-question tokens/s, as Spec-Bench's speed.py; "
        "± is the sample std of per-question speedups; Overhead is the share of step time "
        "spent outside the target's forward passes; Overhead, decode: the same over the decoding "
        "steps alone, each prompt's forward left out).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for m in methods:
        row = [f"`{m}`"]
        for t in tasks + [OVERALL]:
            s = summaries[(m, t)]
            row.append(f"{_num(s.speedup)}×±{_num(s.speedup_std)}")
        if second:
            row.append(f"{_num(second[(m, OVERALL)].speedup)}×")
        o = summaries[(m, OVERALL)]
        row += [_num(o.mean_accepted), _num(o.tokens_per_s, 1),
                "–" if math.isnan(o.overhead_pct) else f"{o.overhead_pct:.1f}%",
                "–" if math.isnan(o.decode_overhead_pct) else f"{o.decode_overhead_pct:.1f}%"]
        lines.append("| " + " | ".join(row) + " |")

    lines += ["", "Mean accepted tokens per step / tokens/s, per task.", ""]
    head2 = ["Method"] + [TASK_TITLES[t] for t in tasks] + ["Overall"]
    lines.append("| " + " | ".join(head2) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head2) - 1)) + "|")
    for m in methods:
        row = [f"`{m}`"] + [f"{_num(summaries[(m, t)].mean_accepted)} / {_num(summaries[(m, t)].tokens_per_s, 1)}"
                            for t in tasks + [OVERALL]]
        lines.append("| " + " | ".join(row) + " |")

    if any(not math.isnan(summaries[(m, OVERALL)].decode_speedup) for m in methods):
        lines += ["", f"Decode only: speedup over `{baseline}` / tokens/s, each turn's first step (the prompt's "
                  "forward up to its first token, which every method pays alike) left out; – where a method "
                  "does not report it.", ""]
        head3 = head2 + ([f"Overall vs {sec_name}"] if second else [])
        lines.append("| " + " | ".join(head3) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(head3) - 1)) + "|")
        for m in methods:
            row = [f"`{m}`"] + [_decode_cell(summaries[(m, t)]) for t in tasks + [OVERALL]]
            if second:
                x = second[(m, OVERALL)].decode_speedup
                row.append("–" if math.isnan(x) else f"{_num(x)}×")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def turn_table(shortfalls: Mapping[str, TurnShortfalls], methods: Sequence[str]) -> str:
    """Markdown: per method, the turns under the threshold against the baseline ("" when none compared).

    Example:
        >>> print(turn_table(turn_shortfalls(records, "ar"), ["ar", "pld"]))  # doctest: +SKIP
    """
    rows = [m for m in methods if m in shortfalls]
    if not rows:
        return ""
    first = shortfalls[rows[0]]
    lines = [f"Turns below {first.threshold:.2f}x `{first.baseline}`'s tokens/s (one call a turn, or the median of "
             f"its repeats). On a noisy machine a method timed against itself misses this on many turns: run "
             f"`{first.baseline}@fresh` beside it as the control, listed last in --methods (each turn runs the "
             f"methods in that order, and a control next to `{first.baseline}` shares its spell of the machine).", "",
             "| Method | Turns | Below | Below, decode only | Lowest (question, turn) |",
             "|---|---:|---:|---:|---:|"]
    for m in rows:
        t = shortfalls[m]
        decode = "–" if t.decode_below < 0 else str(t.decode_below)
        lines.append(f"| `{m}` | {t.turns} | {t.below} | {decode} | {_num(t.lowest)}× (q{t.lowest_at[0]}, "
                     f"turn {t.lowest_at[1]}) |")
    return "\n".join(lines) + "\n"


def ordered_methods(records: Sequence[TurnRecord], preferred: Sequence[str]) -> list[str]:
    """Methods of ``records``, in ``preferred`` order first, then the rest."""
    present = method_order(records)
    first = [m for m in dict.fromkeys(preferred) if m in present]
    return first + [m for m in present if m not in first]
