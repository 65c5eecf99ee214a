"""Every source pays its own way: ``auto`` switches off a source whose tokens do not pay for its time.

The sources are added in order of what they cost this step (drafting time
plus the rows they run beside the tree): a source's *marginal* tokens are the
accepted tokens that no cheaper source proposed (without it they would not
have been drafted); its *marginal* milliseconds are its own drafting time
(propose and commit, and its share of the deferred top-k when it asks for
one), the tree rows no cheaper source put into the forward,
and the rows it runs beside the tree (a Lookahead window), each priced by the
cost model. (Counting only the tokens no *other* source proposed leaves two
sources that draft the same tokens with nothing of their own, and may switch
off the cheap one.) Removing the source changes
a run of ``T`` tokens in ``S`` ms to ``T - U`` tokens in ``S - M`` ms, which
is faster exactly when ``U / M < T / S``. So a source pays when its marginal
tokens per ms are at least the overall rate.

``SourceLedger`` keeps both rates as running sums over recent steps (each step
multiplies earlier ones by ``decay``), by source name. A Decoder keeps one
ledger per method and temperature band across its requests (a short request
alone would end before the evidence is in). After ``min_steps`` steps on, a source
that costs at least ``min_share`` (1%) of a step and whose rate falls below ``(1 - slack)`` times the overall rate is switched off,
one source per step (of several that fail, the one with the fewest tokens per
ms, and among equals the dearest: of two sources drafting the same tokens, the
cheaper keeps them); the others' accounts then start again (their marginal
shares change with the set).
An off source is re-tried for ``probe_steps`` steps at a time, paid from a
budget that grows by ``probe_share`` (1%) of every step's time and shrinks by
what each probe step costs, so re-trying costs at most that share of the time
(plus one probe). A probe whose own tokens pay for its time switches the
source back on; one that brought no token never does.
A source marked ``keep_on`` is never switched off: ``auto`` marks the context source (what
``pld`` drafts from), so it never drafts less than ``pld`` would. Measured on a 2-core Xeon
with the quantized weights: on an open-ended first turn the context's tokens were mostly also
proposed by cheaper sources, its drafting time passed 1% of a (now 12 ms) step, and it was
switched off; on the next turn, a rewrite of the first answer where ``pld`` reached tau 5.8,
``auto`` stayed at 1.7 until a re-try came round.
Decisions are logged (logger ``lookupdec.auto``, level INFO).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from lookupdec.tree import Merged

log = logging.getLogger("lookupdec.auto")


@dataclass(frozen=True)
class StepShares:
    """What each source put into one drafted step's forward (``step_shares``), settled at its commit.

    Attributes:
        rows_ms: per source, the ms of the tree rows it alone brought and of its window rows.
        forward_ms: the modelled forward of the chosen tree (and window).
        owner: per merged node, the source credited with it (-1: none).

    Plain lists: made and read once a drafted step, over a few sources and a few dozen nodes.
    """

    rows_ms: list[float]
    forward_ms: float
    owner: list[int]


def step_shares(merged: Merged, draft_ms: Sequence[float], chosen: Sequence[int], costs: np.ndarray,
                window_ms: Sequence[float]) -> StepShares:
    """Each source's marginal rows this step and what they cost.

    A node several sources proposed is owned by the cheapest of them this step (drafting
    ms, with its share of the deferred top-k, plus its window rows' ms): the sources are added in order of cost, and each is
    credited with the rows and accepted tokens that the cheaper ones did not bring. So of
    two sources drafting the same tokens the dear one has nothing of its own to show for
    its cost, and the cheap one keeps them.

    Args:
        merged: the sources' trees merged (``maps[i]``: the merged node of each of source i's nodes).
        draft_ms: per source, its drafting ms this step (``auto`` adds its latest share of the deferred top-k).
        chosen: the merged nodes chosen for verification (ints: a list or an int array).
        costs: ``costs[w]``, the modelled forward of ``w`` tree rows beside the step's window.
        window_ms: per source, what its window rows add to the step.

    Example:
        >>> from lookupdec.tree import DraftTree, merge_trees
        >>> merged = merge_trees([DraftTree.chain([5, 6]), DraftTree.chain([5])])
        >>> sh = step_shares(merged, np.array([0.5, 0.1]), np.array([0, 1]),
        ...                  np.array([np.inf, 10.0, 12.0, 14.0]), [0.0, 0.0])
        >>> sh.owner, sh.rows_ms      # the cheap second source owns node 0
        ([1, 0], [2.0, 2.0])
    """
    # Plain lists: a few sources and a few dozen nodes, where each numpy call costs more than the work.
    k, maps = len(chosen), merged.maps
    rows_ms = [float(x) for x in window_ms]
    spent = [float(x) for x in draft_ms]
    owner = [-1] * len(merged.tree)
    for i in sorted(range(len(maps)), key=lambda s: spent[s] + rows_ms[s]):  # stable: ties in source order
        for m in maps[i].tolist():
            if owner[m] < 0:
                owner[m] = i
    forward = float(costs[1 + k])
    if k:
        mine = [0] * len(maps)
        for c in chosen:
            if owner[c] >= 0:
                mine[owner[c]] += 1
        for i, u in enumerate(mine):
            if u:
                rows_ms[i] += forward - float(costs[1 + k - u])
    return StepShares(rows_ms, forward, owner)


@dataclass
class SourceAccount:
    """One source's running totals.

    Attributes:
        name: the source's name.
        on: whether it drafts this step (off and not probing: it does not).
        tokens, ms: decayed marginal tokens and ms over its recent steps on.
        steps: steps on since it was last switched (or re-tried).
        probe_left: steps left in the current re-try (0: not probing).
        probe_tokens, probe_ms: what the current re-try has brought and cost.
        switches: times it was switched off.
        probes: times it was re-tried.
    """

    name: str
    on: bool = True
    tokens: float = 0.0
    ms: float = 0.0
    steps: int = 0
    probe_left: int = 0
    probe_tokens: float = 0.0
    probe_ms: float = 0.0
    switches: int = 0
    probes: int = 0
    last_ms: float = 0.0
    n: float = 0.0  # decayed count of its steps on

    @property
    def drafting(self) -> bool:
        return self.on or self.probe_left > 0


class SourceLedger:
    """Which sources draft, from what each brought and cost (module docstring).

    Args:
        names: sources known from the start (others are added on first use).
        decay: weight of the previous steps at each new step.
        min_steps: steps on before a source may be switched off.
        slack: a source is off when its rate is below ``(1 - slack)`` times the overall rate.
            (64 steps and 0.3 were chosen on the offline replay of 21 Spec-Bench turns under three
            measured curves, ``benchmarks/curve_choices.py``: 16 steps and 0.1 switched the live
            context off on evidence from one short answer.)
        probe_steps: steps of one re-try.
        probe_share: share of the time that re-trying may cost.
        min_share: a source costing less than this share of a step's time is never switched
            off (its saving would be smaller than the risk of losing its tokens on little evidence).

    Example:
        >>> led = SourceLedger(["good", "useless"], min_steps=4)
        >>> for _ in range(6): led.record(30.0, 2, ["good", "useless"], [1.0, 0.0], [1.0, 5.0])
        >>> led.drafting(["good", "useless"])
        [True, False]
    """

    def __init__(self, names: Sequence[str] = (), *, decay: float = 0.97, min_steps: int = 64, slack: float = 0.3,
                 probe_steps: int = 8, probe_share: float = 0.01, min_share: float = 0.01) -> None:
        self._accounts: dict[str, SourceAccount] = {str(n): SourceAccount(str(n)) for n in names}
        self.decay = float(decay)
        self.min_steps = int(min_steps)
        self.slack = float(slack)
        self.probe_steps = int(probe_steps)
        self.probe_share = float(probe_share)
        self.min_share = float(min_share)
        self.n = 0.0
        self.tokens = 0.0
        self.ms = 0.0
        self.budget_ms = 0.0
        self.probe_spent_ms = 0.0
        self.total_ms = 0.0
        self._keep: set[str] = set()

    def keep_on(self, name: str) -> None:
        """Never switch source ``name`` off (and switch it back on now if it was)."""
        self._keep.add(str(name))
        a = self.account(name)
        a.on, a.probe_left = True, 0

    @property
    def accounts(self) -> list[SourceAccount]:
        return list(self._accounts.values())

    def account(self, name: str) -> SourceAccount:
        """The account of source ``name`` (created, on, on first use)."""
        a = self._accounts.get(name)
        if a is None:
            a = self._accounts[name] = SourceAccount(name)
        return a

    def drafting(self, names: Sequence[str]) -> list[bool]:
        """For each of ``names``, whether it drafts this step."""
        return [self.account(n).drafting for n in names]

    @property
    def rate(self) -> float:
        """Overall tokens per ms over recent steps (0 before any)."""
        return self.tokens / self.ms if self.ms > 0 else 0.0

    def settle(self, shares: StepShares, accepted: Sequence[int], spent_ms: Sequence[float], host_ms: float, tokens: int,
               names: Sequence[str]) -> None:
        """``record`` a drafted step from its ``StepShares``: each source's accepted merged nodes
        (``accepted``) are its marginal tokens, its rows and drafting (``spent_ms``) its marginal ms."""
        # Plain lists: a few sources and accepted nodes, where each numpy call costs more than the work.
        owner, spent = shares.owner, [float(x) for x in spent_ms]
        unique = [0.0] * len(names)
        for m in accepted:
            if owner[m] >= 0:
                unique[owner[m]] += 1.0
        self.record(shares.forward_ms + sum(spent) + host_ms, tokens, names, unique,
                    [r + s for r, s in zip(shares.rows_ms, spent)])

    def record(self, step_ms: float, tokens: int, names: Sequence[str], unique_tokens: Sequence[float],
               marginal_ms: Sequence[float]) -> None:
        """One step: its time and tokens, and each drafting source's marginal tokens and ms.

        Args:
            step_ms: the step's time (forward, drafting, host).
            tokens: tokens the step produced (accepted + 1).
            names: the step's sources.
            unique_tokens: per source, accepted tokens no cheaper source proposed (ignored for sources off).
            marginal_ms: per source, what it added to the step's time (ignored for sources off).
        """
        d = self.decay
        step_ms = max(float(step_ms), 1e-6)
        self.tokens = self.tokens * d + float(tokens)
        self.ms = self.ms * d + step_ms
        self.n = self.n * d + 1.0
        self.total_ms += step_ms
        self.budget_ms += self.probe_share * step_ms
        rate = self.rate
        failing: list[SourceAccount] = []
        for n, u, m in zip(names, unique_tokens, marginal_ms):
            a = self.account(n)
            if not a.drafting:
                continue
            u, m = float(u), max(float(m), 0.0)
            a.last_ms = m
            if a.probe_left > 0:
                a.probe_tokens += u
                a.probe_ms += m
                self.budget_ms -= m
                self.probe_spent_ms += m
                a.probe_left -= 1
                if a.probe_left == 0 and self._end_probe(a, rate):
                    self._restart_others(a)
                continue
            a.tokens = a.tokens * d + u
            a.ms = a.ms * d + m
            a.n = a.n * d + 1.0
            a.steps += 1
            if a.steps >= self.min_steps and a.name not in self._keep and not self._pays(a.tokens, a.ms, rate, a.n):
                failing.append(a)
        if failing:
            # One switch per step: two sources proposing the same tokens both look useless
            # (neither's tokens are its own); once one is off the other's are. The one off is
            # the one with the fewest tokens per ms, and among equals the dearest, so that of
            # two sources drafting the same tokens the cheaper one keeps drafting them.
            a = min(failing, key=lambda x: (x.tokens / max(x.ms, 1e-9), -x.ms))
            self._restart_others(a)
            a.on = False
            a.switches += 1
            log.info("auto: source %s switched off: %.3f marginal tokens/ms against %.3f overall",
                     a.name, a.tokens / max(a.ms, 1e-9), rate)
        self._maybe_probe()

    def _pays(self, tokens: float, ms: float, rate: float, steps: float) -> bool:
        """Whether a source on keeps drafting: too cheap to judge, or its tokens pay (``_earns``)."""
        if steps > 0 and self.n > 0 and ms / steps < self.min_share * self.ms / self.n:
            return True  # too cheap to be worth switching off
        return self._earns(tokens, ms, rate)

    def _earns(self, tokens: float, ms: float, rate: float) -> bool:
        """Marginal tokens per ms at least ``1 - slack`` times the overall rate."""
        return tokens >= (1.0 - self.slack) * rate * ms

    def _restart_others(self, changed: SourceAccount) -> None:
        """The set of sources changed: every other source's marginal share changes with it."""
        for b in self._accounts.values():
            if b is not changed and b.on:
                b.tokens = b.ms = b.n = 0.0
                b.steps = 0

    def _end_probe(self, a: SourceAccount, rate: float) -> bool:
        # Back on only when the re-try's own tokens pay for its time: the "too cheap to switch
        # off" exemption of ``_pays`` does not apply here (a re-try that brought no token would
        # otherwise switch a source on again whenever its rows were priced cheaply this time).
        if a.probe_tokens > 0 and self._earns(a.probe_tokens, a.probe_ms, rate):
            a.on = True
            a.tokens, a.ms, a.steps, a.n = a.probe_tokens, a.probe_ms, self.probe_steps, float(self.probe_steps)
            log.info("auto: source %s switched back on after a re-try (%.3f tokens/ms against %.3f overall)",
                     a.name, a.probe_tokens / max(a.probe_ms, 1e-9), rate)
            return True
        log.debug("auto: source %s stays off after a re-try", a.name)
        return False

    def _maybe_probe(self) -> None:
        off = []  # one plain loop (called every drafted step: generators cost more than the work)
        for a in self._accounts.values():
            if a.probe_left > 0:
                return
            if not a.on:
                off.append(a)
        if not off:
            return
        # The cheapest to re-try first, when the budget covers a whole probe at its last known cost.
        a = min(off, key=lambda x: (x.probes, x.last_ms))
        if self.budget_ms >= self.probe_steps * a.last_ms:
            a.probe_left = self.probe_steps
            a.probe_tokens = a.probe_ms = 0.0
            a.probes += 1
