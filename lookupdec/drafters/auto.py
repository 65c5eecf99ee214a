"""``auto``: every available source drafts, one scored tree is verified.

Each step every source (the live context always; reference documents, corpus
datastores and earlier outputs when given) proposes a tree scored with its own
calibrated acceptance probabilities. The trees are merged into one trie (a
path proposed by several sources keeps its best score). Keeping the best of
several estimates biases it upward, so the merged scores are calibrated once
more, by score, by how many sources proposed the path and by depth, against
how often such paths were accepted (``MergedCalibration``). The subtree to
verify is chosen from the verifier's cost curve: the one with the best
expected tokens per millisecond at the current cache length, or nothing when
no tree beats a plain step (``lookupdec.drafters.select``). After
verification each source learns which of *its* nodes were accepted.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from lookupdec.costs import CostCurve
from lookupdec.drafters.base import DraftRequest, Drafter, ExtraRows, StepOutcome, as_drafter
from lookupdec.drafters.calibrate import MATCH_EDGES, Calibration
from lookupdec.drafters.ledger import SourceLedger, StepShares, step_shares
from lookupdec.drafters.merged import MergedCalibration
from lookupdec.drafters.select import DEFAULT_MARGIN, select_nodes
from lookupdec.drafters.state import DrafterState
from lookupdec.drafters.step_costs import StepCosts
from lookupdec._native import auto_choose, split_outcome
from lookupdec.tree import DraftTree, Merged, merge_trees

# Most nodes each source proposes: candidates for the selection, which keeps far fewer.
SOURCE_BUDGET = 48
# Longest match the context source measures: the calibration's longest match bucket.
CONTEXT_MAX_N = MATCH_EDGES[-1]
# "No node of this source's was verified", for trees of up to 256 nodes: views of one read-only
# array (a fresh np.full cost ~24 us right after a forward).
_UNVERIFIED = np.full(256, -1, np.int64)
_UNVERIFIED.flags.writeable = False
_NO_NODES = np.zeros(0, np.int64)
_NO_NODES.flags.writeable = False


def context_source(calibration: Calibration | None) -> Drafter:
    """The live-context source as ``auto`` runs it: PLD with a fixed deep draft and a wide fallback.

    Scores, not PLD's adaptive depth, decide how much of it is verified. Matches are
    measured up to ``CONTEXT_MAX_N`` tokens: how long a match runs is what its score is
    keyed by (``NodeScorer``'s ``grow``).
    """
    from lookupdec.drafters.pld import PLDConfig, PLDDrafter

    cfg = PLDConfig(max_width=SOURCE_BUDGET, max_occurrences=8, max_n=CONTEXT_MAX_N, min_depth=16, init_depth=16,
                    max_depth=16, grow=0, fallback_width=8, fallback_depth=6)
    return PLDDrafter(cfg, calibration=calibration)


class AutoDrafter(Drafter):
    """Merges every available source into one tree sized by the cost curve.

    Args:
        references: token-id lists of documents passed with the request (LLMA).
        prediction: token ids of the request's predicted output (drafted as LLMA drafts,
            under the source ``prediction``).
        indexes: opened corpus datastores (REST).
        history: a store of earlier outputs.
        calibration: shared acceptance rates (a private one when None).
        cost: the verifier's CostCurve, or a callable returning it (called on
            the first ``begin``); None prices every width alike, so any tree
            with positive scores is drafted in full.
        sources: drafters to use instead of the ones built from the inputs above.
        margin: see ``lookupdec.drafters.select.DEFAULT_MARGIN``.
        name: the method name reported in results.
        draft_model: a small-LM ``DraftModel`` (``drafters/small_lm.py``): called only on
            steps where it is expected to pay more than the lookup tree (``drafters/gate.py``);
            it drafts deterministic nodes here, so they merge exactly under sampling too.
        gate: switch off a source whose marginal tokens do not pay for its marginal time, and
            re-try it now and then at a bounded cost (``lookupdec.drafters.ledger``); only with
            two sources or more (a single-source method keeps its source).
        ledger: the ``SourceLedger`` to keep the accounts in (the Decoder passes one per method
            and temperature band, so evidence carries across requests); None: a private one.
        state: the decoder's ``DrafterState`` (``drafters/state.py``): Token Recycling's tables
            live there; None: a private one.

    Example:
        >>> d = AutoDrafter(cost=CostCurve((1, 64), (30.0, 31.0), 0, (0.0, 0.0), "cpu", ""))
        >>> d.begin([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
        >>> len(d.propose(DraftRequest(budget=16, max_depth=20))) > 0
        True
    """

    name = "auto"

    # Merge, rate, select, cut and share in one native call (``_choose``); False takes the Python
    # route, its reference (always taken with a second-stage source, a sampled tree or chain verification).
    native_choice = True

    def __init__(self, *, references: Sequence[Sequence[int]] | None = None,
                 prediction: Sequence[int] | None = None, indexes: Sequence | None = None,
                 history=None, calibration: Calibration | None = None,
                 cost: CostCurve | Callable[[], CostCurve] | None = None,
                 sources: Sequence[Drafter] | None = None, margin: float = DEFAULT_MARGIN,
                 name: str = "auto", draft_model=None, gate: bool = True,
                 ledger: SourceLedger | None = None, state: DrafterState | None = None) -> None:
        self.name = name
        self.calibration = calibration if calibration is not None else Calibration()
        self.state = state if state is not None else DrafterState(self.calibration)
        own_sources = sources is None  # then the first is the context source
        if sources is None:
            sources = [context_source(self.calibration)]
            if references:
                from lookupdec.drafters.llma import LLMADrafter

                sources.append(LLMADrafter(references, calibration=self.calibration))
            if prediction:
                from lookupdec.drafters.llma import LLMADrafter

                sources.append(LLMADrafter([prediction], calibration=self.calibration, source="prediction"))
            if indexes:
                from lookupdec.drafters.rest import RESTDrafter

                sources.append(RESTDrafter(indexes, calibration=self.calibration))
            if history is not None:
                from lookupdec.drafters.history import HistoryDrafter

                sources.append(HistoryDrafter(history, calibration=self.calibration))
            from lookupdec.drafters.lookahead import LookaheadDrafter
            from lookupdec.drafters.recycle import RecycleDrafter

            # The target's own drafts, on every step: its earlier top-k, and the Lookahead
            # pool (its window runs only where the verifier takes tree masks).
            sources.append(RecycleDrafter(calibration=self.calibration, state=self.state, table_key=name))
            sources.append(LookaheadDrafter(calibration=self.calibration, cost=cost))
        self.sources = [as_drafter(x) for x in sources]
        self.draft = None
        if draft_model is not None:
            from lookupdec.drafters.small_lm import SmallLMDrafter

            self.draft = SmallLMDrafter(draft_model, calibration=self.calibration, cost=cost, sampled=False)
            self.sources.append(self.draft)  # a second-stage source: proposes only where it pays
        self._merged_calibration = MergedCalibration(self.calibration)
        names = [str(s.name) for s in self.sources]
        # Unique account names (two LLMA sources: references and a prediction, say).
        self._names = [n if names[:i].count(n) == 0 else f"{n}#{names[:i].count(n) + 1}" for i, n in enumerate(names)]
        if gate and len(self.sources) > 1:
            self.ledger = ledger if ledger is not None else SourceLedger()
            if own_sources:  # the context source: auto never drafts less than pld would
                self.ledger.keep_on(self._names[0])
        else:
            self.ledger = None
        self._active = [True] * len(self.sources)
        self._draft_ms = [0.0] * len(self.sources)  # per source, its drafting ms this step (a list: a few items)
        # Per source, its share of the latest deferred top-k (paid at the commit, after the accounting
        # of ``propose`` orders the sources by what they cost).
        self._topk_ms = [0.0] * len(self.sources)
        # What each source put into this step's forward, settled in the ledger at its commit.
        self._step: StepShares | None = None
        self._cost = cost
        self._step_costs = StepCosts(lambda: self.cost)
        self.margin = float(margin)
        self._past = 0
        # Tokens of steps without a proposal that the sources have not been told yet.
        self._unseen: list[int] = []
        self._last: tuple[Merged, list[int]] | None = None  # the merged proposal and the nodes chosen from it
        # Rows of this step's window, per source: (source index, first row, rows).
        self._windows: list[tuple[int, int, int]] = []
        # Window rows each source may run this step, as priced by ``propose`` (0: none).
        self._step_windows = [0] * len(self.sources)
        # Sizes of the recent selections: sources are asked for a few times more, not always 48.
        from collections import deque

        self._recent_k: deque[int] = deque(maxlen=32)

    @property
    def topk(self) -> int:
        """Top-k candidates per verified row asked of the verifier: the most any source asks (protocol v3)."""
        return max((int(s.topk) for s, on in zip(self.sources, self._active) if on), default=0)

    def window(self, request: DraftRequest) -> ExtraRows | None:
        """The sources' extra rows side by side (protocol v3): each source's rows see only its own.

        Called after ``propose`` by the decoder; the rows' cost was already in that
        step's selection (``window_rows``), and their number in its budget: when the window
        does not fit beside the chosen tree, no source runs one.
        """
        parts, self._windows = [], []
        if not request.extra_rows:
            return None
        at = 0
        for i, s in enumerate(self.sources):
            x = s.window(request) if self._active[i] and self._step_windows[i] else None
            if x is not None and len(x):
                parts.append(x)
                self._windows.append((i, at, len(x)))
                at += len(x)
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        visible = np.zeros((at, at), bool)
        for (_, lo, m), x in zip(self._windows, parts):
            visible[lo:lo + m, lo:lo + m] = x.visible
        return ExtraRows(np.concatenate([x.tokens for x in parts]), np.concatenate([x.depth for x in parts]),
                         visible)

    def window_rows(self) -> int:
        """Extra rows the sources will run this step (priced with the tree's rows)."""
        return int(sum(self._window_rows_of()))

    def _window_rows_of(self) -> list[int]:
        return [int(s.window_rows()) if on else 0 for s, on in zip(self.sources, self._active)]

    @property
    def cost(self) -> CostCurve | None:
        if callable(self._cost) and not isinstance(self._cost, CostCurve):
            self._cost = self._cost()
        return self._cost

    def begin(self, prompt_ids: Sequence[int]) -> None:
        for s in self.sources:
            s.begin(prompt_ids)
        self._past = len(prompt_ids)
        self._unseen = []
        self._merged_calibration.restart()
        self._last = None
        self._step = None
        self._active = self.ledger.drafting(self._names) if self.ledger is not None else [True] * len(self.sources)
        _ = self.cost  # measure (or load) the curve before the first step, not inside it

    def _costs(self, budget: int, extra: int = 0) -> np.ndarray:
        """``t[w]`` = modelled ms of a forward of ``w`` tree rows (root included) plus ``extra`` window
        rows, at the current cache length (``drafters/step_costs.py``)."""
        return self._step_costs.table(self._past, budget, extra)

    def propose(self, request: DraftRequest) -> DraftTree:
        sub = request.sub(min(request.budget, self._source_budget()))
        active = self._active = self.ledger.drafting(self._names) if self.ledger is not None else self._active
        self._draft_ms = [0.0] * len(self.sources)
        self._catch_up()
        trees = [DraftTree.empty()] * len(self.sources)
        for i, src in enumerate(self.sources):
            if active[i] and not src.second_stage:
                trees[i] = self._ask(i, sub)
        # The window is part of the step; the tree is chosen against a step that already carries it.
        # Under chain verification no window row runs and one path is verified: that is what is priced.
        windows = self._window_rows_of() if request.extra_rows else [0] * len(self.sources)
        extra = sum(windows)
        costs = self._costs(request.budget, extra)
        if self.native_choice and request.tree and not any(t.sampled for t in trees) \
                and not any(s.second_stage and on for s, on in zip(self.sources, active)):
            merged, tree, nodes, cut, shares = self._choose(trees, costs, request, windows)
        else:
            merged = merge_trees(trees)
            tree = self._merged_calibration.apply(merged)
            sel = self._select(tree, costs, request)
            # Second-stage sources (the small LM) are asked only where they pay against that selection.
            late = [i for i, s in enumerate(self.sources)
                    if s.second_stage and active[i] and s.pays(sel, request.max_depth, self.margin)]
            if late:
                for i in late:
                    trees[i] = self._ask(i, sub)
                merged = merge_trees(trees)
                tree = self._merged_calibration.apply(merged)
                sel = self._select(tree, costs, request)
            nodes, cut, shares = sel.nodes, None, None
        # The window counts inside the draft budget: the tree is chosen first (its tokens pay in
        # this step, the window's only in later ones), and the window runs only if it fits beside it.
        if extra and len(nodes) + extra > request.budget:
            windows, extra = [0] * len(self.sources), 0
            costs = self._costs(request.budget)
            nodes, cut, shares = self._select(tree, costs, request).nodes, None, None
        self._step_windows = windows
        chosen = nodes.tolist()  # once: the accounting and the commit walk these as plain ints
        self._last = (merged, chosen)
        self._recent_k.append(len(chosen))
        if self.ledger is not None:
            if shares is None:
                self._account(merged, chosen, costs, request.budget, windows)
            else:
                self._step = shares
        if cut is not None:
            return cut
        return tree.subset(nodes) if len(nodes) < len(tree) else tree

    def _choose(self, trees: list[DraftTree], costs: np.ndarray, request: DraftRequest, windows: list[int]):
        """Merge, rate, select, cut and share in one native call (``auto_choose``, ext/choose.pxi): the
        Python route (``merge_trees``, ``MergedCalibration.apply``, ``_select``, ``DraftTree.subset``,
        ``step_shares``) is its reference in the tests.

        Returns ``(merged, rated tree, chosen nodes, cut, shares)``: ``cut`` is the chosen subtree and
        ``shares`` the sources' ``StepShares``, both None when nothing was proposed.
        """
        extra = sum(windows)
        window_costs = [self._costs(request.budget, extra - m) if m else None for m in windows]
        spent = [d + t for d, t in zip(self._draft_ms, self._topk_ms)]
        out = auto_choose(trees, self._merged_calibration.calibration.levels(), costs, request.budget,
                          request.max_depth, self.margin, spent, window_costs)
        if out is None:  # nothing proposed (a third of auto's proposals)
            return merge_trees(trees), DraftTree.empty(), _NO_NODES, None, None
        (toks, pars, scs, srcs, depth, maps, agree), rated, record, nodes, cut, (rows_ms, forward, owner) = out
        self._merged_calibration.record(*record)
        merged = Merged(DraftTree.trusted(toks, pars, scs, srcs), maps, agree)
        tree = DraftTree.trusted(toks, pars, rated, srcs)
        if cut is not None:
            t, p, sc, sr, ids = cut
            cut = DraftTree.trusted(t, p, sc, sr, ids=ids)
        else:
            cut = tree
        return merged, tree, nodes, cut, StepShares(rows_ms, forward, owner)

    def _ask(self, i: int, request: DraftRequest) -> DraftTree:
        """Source ``i``'s proposal, its time added to its drafting ms this step (after any catching up)."""
        t0 = time.perf_counter()
        tree = self.sources[i].propose(request)
        self._draft_ms[i] += (time.perf_counter() - t0) * 1e3
        return tree

    def _select(self, tree: DraftTree, costs: np.ndarray, request: DraftRequest):
        """The nodes of ``tree`` worth verifying; under chain verification a prefix of its best-scored path.

        Returns:
            A ``Selection`` whose ``nodes`` index ``tree``.
        """
        if request.tree or not len(tree):
            return select_nodes(tree, costs, request.budget, request.max_depth, self.margin)
        from lookupdec.verify import best_path_nodes

        path = np.asarray(best_path_nodes(tree), np.int64)
        sel = select_nodes(tree.subset(path), costs, request.budget, request.max_depth, self.margin)
        return replace(sel, nodes=path[sel.nodes])

    def _source_budget(self) -> int:
        """Nodes each source is asked for: ``SOURCE_BUDGET``, or less when recent steps selected few.

        Candidates beyond twice the largest recent selection (and 16) are almost never chosen,
        and each costs drafting time (Token Recycling's expansion above all).
        """
        if len(self._recent_k) < 8:
            return SOURCE_BUDGET
        return int(min(SOURCE_BUDGET, max(16, 2 * max(self._recent_k) + 8)))

    def _account(self, merged: Merged, chosen: list[int], costs: np.ndarray, budget: int,
                 windows: list[int]) -> None:
        """Each source's marginal rows this step and what they cost (``ledger.step_shares``)."""
        k, extra = len(chosen), sum(windows)
        # A window's rows: the step without them (the tree chosen as it is).
        window_ms = [float(costs[1 + k] - self._costs(budget, extra - m)[1 + k]) if m else 0.0 for m in windows]
        # A source's drafting this step includes its share of the deferred top-k, paid only at the
        # commit: the latest share stands for it (without it Token Recycling, whose expansion costs
        # less than the context's lookup but whose top-k costs more than both, owned the nodes the
        # context proposed as well, and the ledger kept it on for tokens that were not its own).
        spent = [d + t for d, t in zip(self._draft_ms, self._topk_ms)]
        self._step = step_shares(merged, spent, chosen, costs, window_ms)

    def _catch_up(self) -> None:
        """Tell the sources the tokens of the steps that proposed nothing, in one call each.

        Telling them ``a`` then ``b`` is telling them ``a + b`` (no proposal is pending on such
        steps; ``tests/test_catch_up.py`` checks it for every model-free source); their time is
        this step's drafting.
        """
        if not self._unseen:
            return
        tokens, self._unseen = self._unseen, []
        self._merged_calibration.learn(tokens)
        spent, told = self._draft_ms, StepOutcome((), tokens)
        for i, s in enumerate(self.sources):
            t0 = time.perf_counter()
            s.commit(told)
            spent[i] += (time.perf_counter() - t0) * 1e3

    def commit(self, outcome: StepOutcome) -> None:
        new = outcome.new_tokens
        self._past += len(new)
        if self._last is None and not len(outcome.row_tokens) and not len(outcome.extra_argmax):
            # A step that proposed nothing (a gate paused drafting, budget 0): the sources learn
            # its tokens when they next draft. Told every step, they cost ~0.15 ms a step, 1-2%
            # of a one-row forward, on steps that run as plain decoding.
            self._unseen.extend(int(t) for t in new)
            self._step = None
            return
        self._catch_up()
        self._merged_calibration.learn(new)
        windows, self._windows = {i: (lo, m) for i, lo, m in self._windows}, []
        spent = self._draft_ms

        topk = {"row_tokens": outcome.row_tokens, "topk_ids": outcome.topk_ids, "topk_probs": outcome.topk_probs}

        def outcome_for(i: int, accepted: tuple, tree: DraftTree, origin: np.ndarray) -> StepOutcome:
            # Top-k rows ride along, and the source's own slice of the window's argmax (built
            # directly: ``dataclasses.replace`` costs more than the whole commit of a source).
            lo, m = windows.get(i, (0, 0))
            return StepOutcome(accepted, new, tree, origin, extra_argmax=outcome.extra_argmax[lo:lo + m], **topk)

        def tell(i: int, s, o: StepOutcome) -> None:
            t0 = time.perf_counter()
            s.commit(o)
            spent[i] += (time.perf_counter() - t0) * 1e3

        if self._last is None:
            for i, s in enumerate(self.sources):
                tell(i, s, outcome_for(i, (), DraftTree.empty(), np.zeros(0, np.int64)))
            self._step = None
            return
        merged, chosen = self._last
        self._last = None
        # Auto's node a is merged node chosen[a]; each source is told the step in its own node ids
        # (one native call: the Python loop over a few dozen nodes a source cost ~15 us right after
        # a forward; tests/oracles/choose.py keeps it as the reference).
        accepted_merged, parts = split_outcome(merged.maps, chosen, outcome.accepted, outcome.origin,
                                               len(outcome.tree), len(merged.tree))
        nothing = None  # what a source none of whose nodes was verified is told (windowless: one for all)
        for i, (s, part) in enumerate(zip(self.sources, parts)):
            if part is not None:
                tell(i, s, outcome_for(i, part[0], outcome.tree, part[1]))
            elif i in windows:  # proposed nothing (or was off), or nothing was chosen: with its own slice of the window's argmax
                tell(i, s, outcome_for(i, (), outcome.tree, np.full(len(outcome.tree), -1, np.int64)))
            else:
                if nothing is None:  # a read-only view, shared by the sources told it
                    n = len(outcome.tree)
                    unverified = _UNVERIFIED[:n] if n <= len(_UNVERIFIED) else np.full(n, -1, np.int64)
                    nothing = outcome_for(i, (), outcome.tree, unverified)
                tell(i, s, nothing)
        # The deferred top-k is the cost of the sources that asked for it.
        asked = [i for i, (s, on) in enumerate(zip(self.sources, self._active)) if on and s.topk > 0]
        for i in asked:
            spent[i] += outcome.topk_ms / len(asked)
            self._topk_ms[i] = outcome.topk_ms / len(asked)
        step, self._step = self._step, None
        if self.ledger is not None and step is not None:
            host = float(getattr(self.cost, "host_ms", 0.0) or 0.0)
            self.ledger.settle(step, accepted_merged, spent, host, len(new), self._names)
