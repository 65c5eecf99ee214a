"""Several sequences stepped together: one verify forward for all their trees.

Continuous batching: sequences join (after their own prefill) and leave (when done)
between steps. Each step:

1. every active sequence plans its draft alone (``Sequence.plan``), sized by its drafter
   as if it ran alone;
2. ``price_batch`` cuts those drafts to what pays *for the batch*: the forward's cost is
   the cost curve at the batch's total width, ``c(B + nodes)``, against ``B`` tokens for
   the same batch decoding plainly (``c(B)``). Nodes are taken best first (their
   acceptance estimates, the same scores ``auto`` ranks by) while the modelled tokens per
   ms keep rising; a batch keeps no draft at all unless it beats plain decoding by the
   selection margin. So a step is never priced slower than the batch decoding plainly,
   and speculation shrinks as the batch widens (a node's expected token is worth less
   against ``B`` sure ones);
3. one ``TreeVerifier.forward_batch`` verifies every sequence's tree;
4. every sequence accepts its own path (``Sequence.finish``).

Where nothing pays at the batch's width for several steps in a row, ``BatchGate`` stops the
drafting itself for a while (``Sequence.plan`` with budget 0 runs no drafter), re-trying at
growing intervals: drafting that the pricing then throws away is host time for nothing.

Window rows (a Lookahead drafter's extra rows) bring no token in their own step, so in a
batch of two or more they are dropped (the drafter then skips that step's window). A
sampled tree (with q) is never cut here: a cut chosen by its drawn tokens' scores would
bias the sampling, so it is verified whole, as its drafter sized it.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np

from lookupdec.decoder_args import check_callback, check_flag, checked_batch, nth_seed
from lookupdec.drafters.select import DEFAULT_MARGIN
from lookupdec.inference import inference

if TYPE_CHECKING:
    from typing import Callable

    from lookupdec.costs import CostCurve
    from lookupdec.sequence import Sequence, StepPlan


@dataclass(frozen=True)
class BatchPrice:
    """What ``price_batch`` chose for one batched step.

    Attributes:
        plans: the plans to verify, cut (same order as given).
        width: rows of the forward (roots, kept nodes, kept sampled trees).
        expected_tokens: modelled tokens the step yields (``B`` + the kept nodes' scores).
        ms: modelled ms of the forward at ``width``.
        plain_ms: modelled ms of the same batch decoding plainly (width ``B``).
    """

    plans: tuple
    width: int
    expected_tokens: float
    ms: float
    plain_ms: float


def _best_first(c: tuple) -> tuple:
    """Sort key of a node ``(path score, depth, sequence, node)``: a node never before its ancestors."""
    return -c[0], c[1], c[2], c[3]


def price_batch(plans: "Seq[StepPlan]", curve: "CostCurve | None", past: int | None = None,
                margin: float = DEFAULT_MARGIN, padded: bool = False) -> BatchPrice:
    """Cut the plans of one batched step to the drafts that pay at the batch's total width.

    Args:
        plans: one plan per active sequence.
        curve: the verifier's cost curve (None: every width costs the same, so every node is kept).
        past: cached rows to price at (the batch's mean; None: the curve's own).
        margin: a draft must beat plain decoding's tokens per ms by this fraction.
        padded: the forward pads every sequence to the widest one's rows (transformers'
            padded batch, ``TreeVerifier.pads_batches``): ``B`` sequences of up to ``D`` rows
            cost ``c(B * D)``. Without it they cost ``c(B + nodes)`` (the fast forward).
    Returns:
        A ``BatchPrice``; its plans keep their node provenance (``kept``) so drafters learn
        from the nodes they proposed.

    Under a flat curve (every width costs the same) every node is kept, so two sequences with
    trees of ``a`` and ``b`` nodes give ``width == 2 + a + b`` (padded: ``2 * (1 + max(a, b))``).

    Unpadded, nodes are taken best first while the modelled tokens per ms rise (a node never
    before its ancestors: their path scores are at least its own). Padded, the rows a sequence
    adds below the widest one's are free, so the choice is the rows per sequence ``D``: every
    sequence keeps its best ``D - 1`` nodes, for the ``D`` with the most tokens per ms. Both
    are the best ancestor-closed choice (tested against a search over every choice).
    """
    plans = list(plans)
    b = len(plans)
    padded = padded and b > 1
    fixed = sum(len(p.tree) for p in plans if p.tree.sampled)
    floor = max([1] + [1 + len(p.tree) for p in plans if p.tree.sampled])  # a sampled tree is never cut
    own: list[list[tuple]] = [[] for _ in plans]  # per sequence: (path score, depth, sequence, node), best first
    for s, p in enumerate(plans):
        t = p.tree
        if len(t) and not t.sampled:
            ps, depth = t.path_scores(), t.depth
            own[s] = sorted(((float(ps[i]), int(depth[i]), s, i) for i in range(len(t))), key=_best_first)

    def ms(width: int) -> float:
        return 1.0 if curve is None else curve.ms_at(width, past)

    plain_ms = ms(b)
    plain_rate = b / plain_ms
    base_tokens = b + sum(float(p.tree.path_scores().sum()) for p in plans if p.tree.sampled)
    keep: list[list[int]] = [[] for _ in plans]
    if padded:
        top = 1 + max(len(cs) for cs in own)  # rows of the widest sequence keeping every node

        def rows(depth: int) -> int:  # the forward's rows when every sequence keeps up to depth - 1 nodes
            return b * max(floor, depth)

        best_d = top if curve is None else 1
        if curve is not None:
            tokens = base_tokens
            best_rate = base_tokens / ms(rows(1))
            for depth in range(2, top + 1):
                tokens += sum(cs[depth - 2][0] for cs in own if len(cs) >= depth - 1)  # each one's next best node
                rate = tokens / ms(rows(depth))
                if rate > best_rate:
                    best_d, best_rate = depth, rate
            if best_d > 1 and best_rate <= plain_rate * (1.0 + margin):
                best_d = 1
        for s, cs in enumerate(own):
            keep[s] = [c[3] for c in cs[:best_d - 1]]
        width = rows(best_d)
    else:
        cand = list(heapq.merge(*own, key=_best_first))  # every sequence's nodes, best first
        best_k, best_rate = 0, (base_tokens / ms(b + fixed))
        if curve is None:
            best_k = len(cand)
        else:
            tokens = base_tokens
            for k, c in enumerate(cand, 1):
                tokens += c[0]
                rate = tokens / ms(b + fixed + k)
                if rate > best_rate:
                    best_k, best_rate = k, rate
            if best_k and best_rate <= plain_rate * (1.0 + margin):
                best_k = 0
        for c in cand[:best_k]:
            keep[c[2]].append(c[3])
        width = b + fixed + best_k
    out = []
    expected = base_tokens
    for s, p in enumerate(plans):
        t = p.tree
        plan = p if b < 2 or p.extra is None else replace(p, extra=None)
        if len(t) and not t.sampled and len(keep[s]) < len(t):
            cut = t.subset(np.sort(np.asarray(keep[s], np.int64)))  # its ids name the proposal's nodes
            plan = replace(plan, tree=cut, kept=cut.node_ids())
        if len(t) and not t.sampled:
            expected += float(t.path_scores()[keep[s]].sum()) if keep[s] else 0.0
        out.append(plan)
    return BatchPrice(tuple(out), width, expected, ms(width), plain_ms)


class BatchGate:
    """Stops a batch's drafting while it does not pay, and re-tries it.

    Every sequence of a batched step drafts (its drafters, its selection) before
    ``price_batch`` cuts the drafts to what pays at the batch's total width. On a steep cost
    curve a wide batch keeps nothing, and all that drafting is host time for nothing
    (measured on a 2-core Xeon with quantized weights: batched ``auto`` at concurrency 4 and
    8 ran at 0.92x and 0.90x batched ``ar``, tau 1.01-1.04). After ``IDLE_STEPS`` batched
    steps in a row that kept nothing, the next ``pause`` steps plan with budget 0; the step
    after drafts again. If it keeps a draft the gate starts over; if not, the pause doubles
    (from ``FIRST_PAUSE`` up to ``MAX_PAUSE``), so re-tries cost at most a few percent of the
    steps.

    Kept drafts can still fail to pay: the pricing trusts acceptance rates and a cost curve
    measured for one sequence (measured after the native attention made steps cheaper: at
    concurrency 4, tau 1.01 with drafts kept, 0.94x batched ``ar``). So when the caller
    passes each step's tokens and seconds, the gate also compares what drafting steps
    deliver with what plain steps of the same batch size do: every ``JUDGE_STEPS`` drafting
    steps of one size that kept drafts, it pauses (doubling as above) when their tokens per
    second fall below the plain steps' (a few plain steps are run first to measure them,
    ``PROBE``). Each size keeps its own tally, so a server's batch that changes size as requests
    come and go is still judged (one shared tally, restarted at every change of size, could
    go without a verdict there). Steps that drafted and kept nothing are left to the idle rule:
    weighing them in the verdict too was tried, and paused a lone request's paying drafts
    (served at concurrency 1, 1.03x batched ``ar`` against 1.10x, same run; no change at 2-8).
    A gate made with ``min_size=1`` judges a single sequence's steps the same way, with pauses of
    at most ``max_pause`` steps and a milder idle rule (a lone sequence's step that keeps nothing
    costs only its drafting, so after ``IDLE_STEPS`` of them ``LONE_IDLE_SKIP`` plain steps follow
    each re-try, doubling while the re-tries keep nothing, up to ``LONE_MAX_SKIP``, until one keeps
    a draft): ``Decoder.generate`` keeps one per temperature band for
    ``auto`` (the server's engine uses the same one for a lone ``auto`` request, ``step_together``'s
    ``lone_gate``), whose pricing otherwise trusts the acceptance rates and the cost curve alone
    (measured on a 2-core AMD EPYC with AVX-512 at temperature 1.0: `auto` 0.94x `ar` at tau
    1.09, its drafting steps 12.0 ms of forward against `ar`'s 10.7). By default only batches
    of 2 or more are gated. Exactness is untouched: a step without a draft is ``ar``'s.
    """

    IDLE_STEPS = 4
    LONE_IDLE_SKIP = 2
    LONE_MAX_SKIP = 8
    FIRST_PAUSE = 8
    MAX_PAUSE = 128
    JUDGE_STEPS = 8
    PROBE = 4
    DECAY = 0.8  # weight of a plain measurement after each later plain step of its size

    def __init__(self, min_size: int = 2, max_pause: int | None = None) -> None:
        self.min_size = int(min_size)
        self.max_pause = self.MAX_PAUSE if max_pause is None else int(max_pause)
        self.idle = 0            # batched drafting steps in a row that kept nothing
        self.pause = self.FIRST_PAUSE
        self.skip = 0            # steps left to plan without drafting
        self._plain: dict[int, tuple[float, float]] = {}  # size -> decayed (tokens, seconds) of plain steps
        self._drafting: dict[int, tuple[float, float, int]] = {}  # size -> tokens, seconds, steps being judged

    def budget(self, size: int, budget: int | None) -> int | None:
        """The planning budget of the next step of ``size`` sequences: 0 while paused, else ``budget``."""
        if size < self.min_size or self.skip <= 0:
            return budget
        self.skip -= 1
        return 0

    def record(self, size: int, drafted: bool, kept: bool, tokens: int | None = None,
               seconds: float | None = None) -> None:
        """Learn from a step: ``drafted`` (it planned with a budget), ``kept`` (its pricing kept a draft),
        and, when given, the tokens it committed and its wall time."""
        if size < self.min_size:
            return
        timed = tokens is not None and seconds is not None and seconds > 0
        if not drafted:
            if timed:
                t, s = self._plain.get(size, (0.0, 0.0))
                self._plain[size] = (t * self.DECAY + tokens, s * self.DECAY + seconds)
            return
        if not kept:
            self.idle += 1
            if size < 2:
                # A lone sequence's idle step costs only its drafting, but that is ~0.55-0.67 ms of
                # a ~8 ms step (the sources catching up, proposing, merge, selection, their commits):
                # after IDLE_STEPS of them in a row, LONE_IDLE_SKIP plain steps follow each, doubling
                # while the re-tries keep nothing, up to LONE_MAX_SKIP, until one keeps a draft. A
                # draft that starts to pay (a copy in the context) is found at most LONE_MAX_SKIP
                # steps late.
                if self.idle >= self.IDLE_STEPS:
                    doublings = min(self.idle - self.IDLE_STEPS, 8)  # bounded: an idle run can be long
                    self.skip = min(self.LONE_IDLE_SKIP << doublings, self.LONE_MAX_SKIP)
                return
            if self.idle >= self.IDLE_STEPS:
                self._pause()
                self.idle = self.IDLE_STEPS - 1  # the re-try alone decides the next pause
            return
        self.idle = 0
        if not timed:
            self.pause = self.FIRST_PAUSE
            return
        self._judge(size, tokens, seconds)

    def _judge(self, size: int, tokens: int, seconds: float) -> None:
        """Add a step that kept drafts to its size's tally; every ``JUDGE_STEPS`` of them, compare with plain steps."""
        t, s, k = self._drafting.get(size, (0.0, 0.0, 0))
        t, s, k = t + tokens, s + seconds, k + 1
        if k < self.JUDGE_STEPS:
            self._drafting[size] = (t, s, k)
            return
        del self._drafting[size]
        plain = self._plain.get(size)
        if plain is None:
            self.skip = self.PROBE  # measure plain steps of this size, then judge the next drafting steps
        elif t * plain[1] < plain[0] * s:  # drafting's tokens/s below plain's
            self._pause()
        else:
            self.pause = self.FIRST_PAUSE

    def _pause(self) -> None:
        self.skip = self.pause
        self.pause = min(2 * self.pause, self.max_pause)


@dataclass(frozen=True)
class BatchStep:
    """One step of a batch.

    Attributes:
        size: sequences verified together.
        width: rows of the forward (a padded batch's: sequences times the widest one's rows,
            before the verifier rounds widths up to its ``pad_multiple``).
        drafted: draft nodes verified (all sequences).
        accepted: draft tokens accepted (all sequences).
        new_tokens: tokens committed (all sequences).
        forward_s: the forward's wall time.
        step_s: the whole step's wall time (plans, forward, acceptance).
        accepted_by_source: accepted draft tokens per source this step.
    """

    size: int
    width: int
    drafted: int
    accepted: int
    new_tokens: int
    forward_s: float
    step_s: float
    accepted_by_source: dict


@inference  # once for the batch's step, not per sequence's plan and finish (~10 us an entry after a forward)
def step_together(verifier, seqs: "Seq[Sequence]", curve: "CostCurve | None", budget: int | None = None,
                  margin: float = DEFAULT_MARGIN, gate: BatchGate | None = None,
                  lone_gate: BatchGate | None = None) -> BatchStep:
    """One step of every sequence in ``seqs`` (all prefilled, none done) with one verify forward.

    Args:
        verifier: the decoder's ``TreeVerifier`` (every sequence's).
        seqs: the active sequences.
        curve: the cost curve that prices the batch (``price_batch``); with one sequence its
            own drafter has already priced its tree, and it is verified as planned.
        budget: each sequence's planning budget (None: the decoder's draft budget).
        margin: see ``price_batch``.
        gate: a ``BatchGate`` kept across the batch's steps (None: every step drafts).
        lone_gate: the gate of a step with one sequence (``BatchGate(min_size=1)``, as
            ``Decoder.generate`` keeps for ``auto``); None: ``gate``, which leaves one sequence alone.
    Returns:
        A ``BatchStep``.
    Raises:
        DraftError: a drafter proposed an invalid tree (the caller decides whose request fails).
    """
    from lookupdec.verify import VerifyItem

    t0 = time.perf_counter()
    seqs = list(seqs)
    if len(seqs) == 1 and lone_gate is not None:
        gate = lone_gate
    step_budget = budget if gate is None else gate.budget(len(seqs), budget)
    plans = [s.plan(step_budget) for s in seqs]
    if len(seqs) > 1:
        past = int(np.mean([s.past for s in seqs]))
        price = price_batch(plans, curve, past, margin, padded=verifier.pads_batches)
        plans = list(price.plans)
        kept = price.width > len(seqs)
    else:
        kept = plans[0].drafts
    items = [VerifyItem(s.cache, s.past, p.root, p.tree, p.extra, p.topk) for s, p in zip(seqs, plans)]
    t1 = time.perf_counter()
    results = verifier.forward_batch(items)
    forward_s = time.perf_counter() - t1
    rows = [1 + len(p.tree) + (0 if p.extra is None else len(p.extra)) for p in plans]
    if verifier.pads_batches and len(rows) > 1:
        rows = [max(rows)] * len(rows)  # transformers' padded batch: every sequence has the widest one's rows
    width = sum(rows)
    before = [(len(s.new), dict(s.by_source)) for s in seqs]
    for s, p, r, w in zip(seqs, plans, results, rows):
        s.finish(p, r, forward_s * w / width, observe=len(seqs) == 1)  # each sequence's share of the forward
    by_source: dict[str, int] = {}
    accepted = new = 0
    for s, (n0, src0) in zip(seqs, before):
        new += len(s.new) - n0
        for k, v in s.by_source.items():
            d = v - src0.get(k, 0)
            if d:
                by_source[k] = by_source.get(k, 0) + d
                accepted += d
    step_s = time.perf_counter() - t0
    if gate is not None and len(seqs) >= gate.min_size:
        gate.record(len(seqs), step_budget != 0, kept, new, step_s)
    return BatchStep(len(seqs), width, sum(len(p.tree) for p in plans), accepted, new, forward_s, step_s, by_source)


def decode_batch(verifier, seqs: "Seq[Sequence]", curve: "CostCurve | None", batch_size: int,
                 done: "Callable[[int], None]") -> None:
    """Decode ``seqs`` to the end, up to ``batch_size`` stepped together (continuous batching).

    Sequences join in order, each after its own prefill, as soon as there is room, and leave
    when done: their KV cache is freed, then ``done(i)`` is called with their index.
    """
    waiting = list(range(len(seqs)))
    active: list[int] = []
    gate = BatchGate()

    def leave(i: int) -> None:
        seqs[i].cache = None  # free its KV cache now
        done(i)

    while waiting or active:
        while waiting and len(active) < batch_size:
            i = waiting.pop(0)
            seqs[i].prefill()
            if seqs[i].done:
                leave(i)
            else:
                active.append(i)
        if not active:
            continue
        step_together(verifier, [seqs[i] for i in active], curve, gate=gate)
        for i in [i for i in active if seqs[i].done]:
            active.remove(i)
            leave(i)


def generate_batch(decoder, prompts, batch_size, references, predictions, remember: bool, on_result,
                   settings: dict) -> list:
    """``Decoder.generate_batch``: check the settings, make every prompt's sequence, decode them together.

    ``settings`` are the other ``generate`` keywords, shared by every prompt (a ``seed`` becomes
    ``seed + i`` for prompt ``i``, less 2**64 past the largest seed). Every prompt is checked before any
    model work; an error names the prompt.
    """
    prompts = checked_batch(prompts, batch_size, references=references, predictions=predictions)
    check_flag(remember, "remember")
    n = len(prompts)
    check_callback(on_result, "on_result", "(index, result)")
    if "on_text" in settings or "drafter" in settings:
        raise ValueError("generate_batch takes no on_text or drafter (one per prompt would be needed)")
    settings = dict(settings)
    seed = settings.pop("seed", None)
    grammar = settings.pop("grammar", None)
    seqs = []
    for i, prompt in enumerate(prompts):
        try:
            seqs.append(decoder.new_sequence(
                prompt, references=None if references is None else references[i],
                prediction=None if predictions is None else predictions[i],
                seed=None if seed is None else nth_seed(seed, i), grammar=grammar, **settings))
        except (ValueError, TypeError) as exc:
            # The same error, its message naming the prompt: its type and fields stay (a
            # ContextTooLongError keeps its lengths; not every error type is built from a message).
            if n > 1 and exc.args and isinstance(exc.args[0], str):
                exc.args = (f"prompt {i}: {exc.args[0]}",) + exc.args[1:]
            raise
    # Plain decoding drafts nothing, so only other methods need the curve that prices the batch.
    curve = None if settings.get("method", "auto") == "ar" else decoder.costs()
    results: list = [None] * n

    def done(i: int) -> None:
        res = seqs[i].result()
        results[i] = res
        if remember:
            decoder.remember(res)
        if on_result is not None:
            on_result(i, res)

    decode_batch(decoder.verifier, seqs, curve, batch_size, done)
    return results
