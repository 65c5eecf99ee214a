"""What the Python around `auto`'s sources costs a step, piece by piece, on fixed random trees.

`auto`'s host time (the share of a step outside the target's forward) is spread over many small
pieces; a decoding run cannot resolve a change of a few tens of microseconds in one of them (the
same run repeated moves its drafting time by 15%). This times the pieces alone, in a loop, on
trees the size a step sees: three sources of 10, 12 and 40 nodes scored by their calibration
(conditionals first),
merged, calibrated again, ranked and selected; Token Recycling's 32-node proposal from a full
table (its native expansion with the calibrated rate inside, as the drafter runs it); the ledger's
ownership pass. Warm caches, so a floor: in a real step, right after a
forward, the same code runs slower. Run it before and after a change, on a quiet machine.

Usage:
    python benchmarks/drafting_glue.py [--repeats 5] [--number 2000]
"""
from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the checkout's package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pieces(seed: int = 0) -> dict:
    """Name -> a call doing one step's worth of that piece."""
    from lookupdec.drafters.calibrate import Calibration, NodeScorer, conditional
    from lookupdec.drafters.ledger import step_shares
    from lookupdec.drafters.merged import MergedCalibration
    from lookupdec.drafters.base import DraftRequest
    from lookupdec.drafters.recycle import RecycleConfig, RecycleDrafter
    from lookupdec.drafters.select import select_nodes
    from lookupdec.tree import DraftTree, merge_trees

    rng = np.random.default_rng(seed)

    def tree(n: int, source: int) -> DraftTree:
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        return DraftTree(rng.integers(0, 50, n), np.array(parents), rng.random(n), np.full(n, source, np.int16))

    trees = [tree(10, 1), tree(12, 2), tree(40, 3)]
    cal = Calibration()
    scorer, merged_cal = NodeScorer("pld", cal, grow=True), MergedCalibration(cal)
    costs = np.concatenate([[np.inf], 7.0 + 1.5 * np.arange(80)])

    def score_merge_select() -> None:
        for t in trees:
            scorer.score(t, conditional(t), 3, 1)  # as a lookup source scores its tree
        merged = merge_trees(trees)
        t = merged_cal.apply(merged)
        select_nodes(DraftTree.trusted(t.tokens, t.parents, t.scores, t.sources), costs, 64)
        scorer.restart()
        merged_cal.restart()

    vocab = 2000
    recycle = RecycleDrafter(RecycleConfig(max_nodes=32), calibration=cal)
    recycle.table.update(np.arange(vocab), rng.integers(0, vocab, (vocab, 8)),
                         (np.sort(rng.random((vocab, 8)), axis=1)[:, ::-1] / 4).astype(np.float32))
    request = DraftRequest(budget=32, max_depth=64)

    def recycle_proposal() -> None:
        recycle.propose(request)
        recycle.begin([5])  # the proposal forgotten again (begin keeps the table)

    recycle.begin([5])

    merged = merge_trees(trees)
    chosen = np.arange(4)
    draft_ms = np.array([0.1, 0.2, 0.15])

    def ownership() -> None:
        step_shares(merged, draft_ms, chosen, costs, [0.0, 2.0, 0.0])

    return {"score, merge, calibrate, select (10+12+40 nodes)": score_merge_select,
            "Token Recycling proposal (32 nodes)": recycle_proposal,
            "ledger ownership (step_shares)": ownership}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timings of each piece (the fastest is reported)")
    ap.add_argument("--number", type=int, default=2000, help="calls per timing")
    args = ap.parse_args()
    if args.repeats < 1 or args.number < 1:
        ap.error("--repeats and --number must be at least 1")
    print("| piece | us a call (fastest of repeats) |\n|---|---:|")
    for name, fn in pieces().items():
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeats)) / args.number
        print(f"| {name} | {best * 1e6:.1f} |")


if __name__ == "__main__":
    main()
