"""auto's choices under different cost curves, and the LogitSpec idea, replayed without a model.

Replays recorded greedy outputs (``benchmarks/record_outputs.py --topk 8``) through ``auto``
in the offline simulator (``benchmarks/simulate.py``) once per measured cost curve, sizing its
trees with ``lookupdec.pricing.CostModel`` over that curve (as the decoder does: monotone), and
reports per curve: tau, mean nodes verified per step, and the speedup over ``ar`` modelled with
that curve. ``pld`` runs beside it as the reference. A steep curve should make ``auto`` verify
fewer nodes; a flat one more.

``--logitspec`` adds a LogitSpec-style source (Liu et al., 2025) to ``auto`` and replays again:
the target's top candidates at the last verified row (the row that gave the bonus token) are
guesses for the token *after* it; each candidate ``c`` is looked up as the key ``(root, c)`` in
the context, and what followed there is drafted under ``c``. Kept only if tau rises at equal
modelled cost (issue 17 point 6).

Usage::

    python benchmarks/curve_choices.py RECORDS.jsonl --curves xeon,amd-avx512,amd-avx2-demo --logitspec
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import COST_CURVES, _ReplayHistory, load_records, parse_curve, simulate  # noqa: E402

from lookupdec.costs import CostCurve  # noqa: E402
from lookupdec.drafters.base import DraftRequest, StepOutcome  # noqa: E402
from lookupdec.drafters.calibrate import Calibration, NodeScorer, conditional  # noqa: E402
from lookupdec.drafters.state import DrafterState  # noqa: E402
from lookupdec.tree import DraftTree  # noqa: E402


class LogitSpecSource:
    """Drafts under the target's other top candidates for the root's row, looked up as ``(root, c)``.

    Args:
        calibration: shared acceptance rates.
        candidates: how many of the last row's top-k are tried (the root itself skipped).
        depth: nodes per candidate chain (the candidate included).
        occurrences: most recent occurrences of ``(root, c)`` followed.

    Example:
        >>> s = LogitSpecSource(Calibration(), candidates=2)
        >>> s.begin([1, 2, 3, 9, 2, 5, 6])
        >>> s.commit(StepOutcome((), (2,), row_tokens=np.array([6]), topk_ids=np.array([[2, 3, 5]]),
        ...                      topk_probs=np.array([[0.5, 0.3, 0.1]], np.float32)))
        >>> s.propose(DraftRequest(8, 8)).tokens.tolist()   # after (2, 3): 9 2 5 6 2; after (2, 5): 6 2
        [3, 9, 2, 5, 6, 5, 6, 2]
    """

    name = "logitspec"
    topk = 8

    def __init__(self, calibration: Calibration, candidates: int = 4, depth: int = 8, occurrences: int = 1) -> None:
        self.candidates = candidates
        self.depth = depth
        self.occurrences = occurrences
        self._scorer = NodeScorer("logitspec", calibration)
        self._seq: list[int] = []
        self._at: dict[tuple[int, int], list[int]] = defaultdict(list)  # bigram -> positions of its 2nd token
        self._cands: list[tuple[int, float]] = []

    def _index_from(self, start: int) -> None:
        seq = self._seq
        for i in range(max(start, 1), len(seq)):
            self._at[(seq[i - 1], seq[i])].append(i)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._seq = [int(t) for t in prompt_ids]
        self._at = defaultdict(list)
        self._index_from(1)
        self._cands = []

    def propose(self, request: DraftRequest) -> DraftTree:
        seqs, raw_first = [], {}
        root = self._seq[-1] if self._seq else -1
        depth = min(self.depth, request.max_depth)
        for c, p in self._cands[: self.candidates + 1]:
            if c == root or depth <= 0:
                continue
            for i in self._at.get((root, c), ())[::-1][: self.occurrences]:
                seqs.append([c] + self._seq[i + 1: i + depth])
                raw_first[c] = max(raw_first.get(c, 0.0), p)
        tree = DraftTree.from_sequences(seqs).prune(request.budget) if seqs else DraftTree.empty()
        raw = conditional(tree)
        if len(tree):
            first = tree.parents < 0
            raw[first] = [raw_first[int(t)] for t in tree.tokens[first]]
        return self._scorer.score(tree, raw, 2, 0)

    def commit(self, outcome: StepOutcome) -> None:
        self._scorer.learn(outcome.new_tokens)
        start = len(self._seq)
        self._seq.extend(int(t) for t in outcome.new_tokens)
        self._index_from(start)
        if len(outcome.row_tokens):
            # The last row: the distribution the bonus token (the next root) was chosen from.
            self._cands = list(zip(outcome.topk_ids[-1].tolist(), outcome.topk_probs[-1].tolist()))
        else:
            self._cands = []


def auto_factory(cost: CostCurve, logitspec: bool, without: Sequence[str] = (), gate: bool = True):
    """Fresh ``auto`` drafters per record sharing one calibration and one source ledger (as a Decoder's
    requests do), priced by a CostModel over ``cost``; ``without`` names sources left out."""
    from lookupdec.drafters.auto import AutoDrafter, context_source
    from lookupdec.drafters.lookahead import LookaheadDrafter
    from lookupdec.drafters.llma import LLMADrafter
    from lookupdec.drafters.recycle import RecycleDrafter
    from lookupdec.drafters.history import HistoryDrafter
    from lookupdec.drafters.ledger import SourceLedger
    from lookupdec.pricing import CostModel

    calibration = Calibration()
    state = DrafterState(calibration)  # one decoder's: Token Recycling's table warms across records
    model = CostModel(cost)
    store = _ReplayHistory()
    ledger = SourceLedger()

    def make(rec):
        store.remember_previous(rec)
        sources = [context_source(calibration)]
        if rec.references:
            sources.append(LLMADrafter([list(d) for d in rec.references], calibration=calibration))
        sources.append(HistoryDrafter(store, calibration=calibration))
        sources.append(RecycleDrafter(calibration=calibration, state=state, table_key="auto"))
        sources.append(LookaheadDrafter(calibration=calibration, cost=model))
        if logitspec:
            sources.append(LogitSpecSource(calibration))
        sources = [s for s in sources if s.name not in without]
        return AutoDrafter(sources=sources, calibration=calibration, cost=model, ledger=ledger, gate=gate, state=state)

    return make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument("--curves", default="xeon,amd-avx512,amd-avx2-demo",
                    help=f"comma list of {', '.join(COST_CURVES)} or points '1:30,16:45,64:90'")
    ap.add_argument("--logitspec", action="store_true", help="also replay auto with the LogitSpec source")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--no-gate", action="store_true",
                    help="keep every source on (the gate decides from measured drafting ms, so gated replays "
                         "vary a little from run to run; without it a replay is deterministic)")
    args = ap.parse_args(argv)
    records = [r for p in args.records for r in load_records(p)]
    if any(r.topk_ids is None for r in records):
        print("curve_choices: records need the target's top-k (record_outputs.py --topk 8)", file=sys.stderr)
        return 2
    from lookupdec.drafters.pld import PLDDrafter

    print("| curve | c(16)/c(1) | drafter | tau | mean nodes | est. speedup vs ar |")
    print("|---|---:|---|---:|---:|---:|")
    for name in [c.strip() for c in args.curves.split(",") if c.strip()]:
        cost = parse_curve(name)
        ratio = cost.ms_at(16) / cost.ms_at(1)
        gate = not args.no_gate
        runs = [("pld", lambda: PLDDrafter()), ("auto", auto_factory(cost, False, gate=gate))]
        if args.logitspec:
            runs.append(("auto+logitspec", auto_factory(cost, True, gate=gate)))
        for label, factory in runs:
            res = simulate(factory, records, budget=args.budget, cost=cost)
            o = res.overall
            print(f"| {name} | {ratio:.2f} | {label} | {o.tau:.3f} | {o.mean_draft:.2f} | {o.est_speedup:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
