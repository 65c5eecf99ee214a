"""Grid sweep of PLD settings through the offline simulator (no model).

Every combination of the given values is replayed over the records; the table
lists each setting's overall est. speedup (under a verify-cost curve), the same
on two halves of the records (questions of each task alternately assigned to
halves A and B, both turns of a question in the same half) so a setting that
wins on one half only shows up, and the per-task speedups relative to the
baseline (the drafter's defaults unless ``--baseline`` says otherwise).

Usage::

    python benchmarks/sweep_pld.py benchmarks/out/greedy_pc2_128.jsonl benchmarks/out/greedy_o2pc6_128.jsonl \\
        -g max_width=8,12,16 -g fallback_width=0,2,3 --cost fast --top 20
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Mapping, Sequence

if __package__ in (None, ""):  # run as a script: make the checkout and simulate.py importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import (COST_CURVES, Record, SimResult, _parse_value, drafter_factory, parse_curve,  # noqa: E402
                      load_records, simulate)
from lookupdec.costs import CostCurve  # noqa: E402


def halves(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """Split records into two halves: each task's questions alternately (in question-id order).

    Both turns of a question land in the same half, so no half sees a second
    turn whose first turn it lacks.
    """
    by_task: dict[str, list[int]] = {}
    for r in records:
        qs = by_task.setdefault(r.task, [])
        if r.question_id not in qs:
            qs.append(r.question_id)
    side = {(t, q): i % 2 for t, qs in by_task.items() for i, q in enumerate(sorted(qs))}
    a = [r for r in records if side[(r.task, r.question_id)] == 0]
    b = [r for r in records if side[(r.task, r.question_id)] == 1]
    return a, b


def run(settings: Mapping[str, object], records: Sequence[Record], cost: CostCurve,
        budget: int) -> SimResult:
    return simulate(drafter_factory("pld", settings, records), records, budget=budget, cost=cost)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Sweep PLD settings through the offline simulator.")
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument("-g", "--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="values of one PLDConfig field to sweep (repeatable; the grid is their product)")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a fixed setting for every point of the grid")
    ap.add_argument("-b", "--baseline", action="append", default=[], metavar="KEY=VALUE",
                    help="baseline settings (default: the drafter's defaults)")
    ap.add_argument("--cost", default="fast", help="cost curve: " + " | ".join(COST_CURVES) + " or '1:ms,8:ms,...'")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--top", type=int, default=25, help="rows shown, best overall first")
    args = ap.parse_args(argv)

    def kv(items):
        out = {}
        for item in items:
            k, _, v = item.partition("=")
            out[k] = _parse_value(v)
        return out

    fixed, base_settings = kv(args.set), kv(args.baseline)
    grid = {}
    for item in args.grid:
        k, _, vs = item.partition("=")
        grid[k] = [_parse_value(v) for v in vs.split(",")]
    cost = parse_curve(args.cost)
    records = [r for p in args.records for r in load_records(p)]
    half_a, half_b = halves(records)

    def score(settings):
        return (run(settings, records, cost, args.budget), run(settings, half_a, cost, args.budget),
                run(settings, half_b, cost, args.budget))

    base, base_a, base_b = score(base_settings)
    tasks = list(base.by_task)
    rows = []
    for values in itertools.product(*grid.values()):
        settings = {**fixed, **dict(zip(grid, values))}
        try:
            full, a, b = score(settings)
        except ValueError as e:  # an invalid combination (e.g. init_depth > max_depth)
            print(f"skip {settings}: {e}", file=sys.stderr)
            continue
        rel = {t: full.by_task[t].est_speedup / base.by_task[t].est_speedup for t in tasks}
        rows.append((full.overall.est_speedup, settings, full, a, b, rel))
    rows.sort(key=lambda r: -r[0])

    print(f"cost {args.cost}, {len(records)} records (halves {len(half_a)} + {len(half_b)}), budget {args.budget}; "
          f"baseline {base_settings or 'defaults'}: est. speedup {base.overall.est_speedup:.3f} "
          f"(A {base_a.overall.est_speedup:.3f}, B {base_b.overall.est_speedup:.3f}), tau {base.overall.tau:.3f}\n")
    head = ["settings", "tau", "draft", "speedup", "A", "B"] + [f"{t[:8]}/base" for t in tasks]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for sp, settings, full, a, b, rel in rows[:args.top]:
        desc = " ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
        cells = [desc, f"{full.overall.tau:.3f}", f"{full.overall.mean_draft:.2f}", f"{sp:.3f}",
                 f"{a.overall.est_speedup:.3f}", f"{b.overall.est_speedup:.3f}"] + [f"{rel[t]:.3f}" for t in tasks]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
