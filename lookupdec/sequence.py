"""One request's decoding state, stepped by the decoder one verify forward at a time.

A ``Sequence`` holds what one generation needs between forwards: its
drafter, its KV cache and committed length, its sampling settings and
generator, its text stream (stop strings), the tokens made so far and the
per-step statistics. A step is split in two so that the forward itself can
be shared by several sequences (a batch verified in one forward):

- ``plan(budget)``: draft a tree under the last committed token and check it
  (no model work beyond what the drafter itself does);
- the caller runs the forward (``TreeVerifier.forward`` for one sequence,
  ``forward_batch`` for several);
- ``finish(plan, result, forward_s)``: accept a path (greedy or exact
  speculative sampling), keep its cache rows, hand the outcome to the
  drafter, append the tokens and check the stopping rules.

``Sequence.run`` (what ``Decoder.generate`` calls) is ``prefill()`` then
``plan``/forward/``finish`` until ``done``; plain autoregressive decoding
(``ar``) is the same loop with empty trees.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence as Seq

import numpy as np

from lookupdec.drafters.base import SOURCE_NAMES, DraftRequest, ExtraRows, NoDrafter, StepOutcome, as_drafter
from lookupdec.inference import inference
from lookupdec.pricing import StepTiming
from lookupdec.proposals import check_tree, check_window, topk_of
from lookupdec.results import GenerationResult, StepStats
from lookupdec.stream import TextStream
from lookupdec.tree import DraftTree

# The torch side of a step, bound by the first Sequence (``_bind_torch``), so that importing this
# module stays torch-free and a step runs no import statement: right after a forward has cooled
# the caches, each cost 3-12 us (thirty-first session).
torch = argmax_row = greedy_accept = sample_accept = position_uniform = target_probs = draw = sample_at = None


def _bind_torch() -> None:
    global torch, argmax_row, greedy_accept, sample_accept, position_uniform, target_probs, draw, sample_at
    if torch is not None:
        return
    import torch as torch_module

    from lookupdec import accept, sampling, tree_rows

    argmax_row, greedy_accept, sample_accept = tree_rows.argmax_row, accept.greedy_accept, accept.sample_accept
    position_uniform, target_probs = sampling.position_uniform, sampling.target_probs
    draw, sample_at = sampling.draw, sampling.sample_at
    torch = torch_module


def masked_argmax(logits, allowed: np.ndarray) -> int:
    """The highest logit among ``allowed`` tokens (bool mask over the vocabulary)."""
    mask = torch.from_numpy(np.ascontiguousarray(allowed)).to(logits.device)
    return argmax_row(logits.masked_fill(~mask, float("-inf")))


def draw_token(logits, params: "SamplingParams", u: float, allowed: np.ndarray | None) -> int:
    """The token at uniform ``u`` of the target distribution, renormalised over ``allowed`` when a
    grammar gives a mask (None: ``sampling.draw``, one native call on a CPU row)."""
    return draw(logits, params, u) if allowed is None else sample_at(masked_probs(logits, params, allowed), u)


def masked_probs(logits, params: "SamplingParams", allowed: np.ndarray):
    """The target distribution (temperature, top-p, top-k) renormalised over ``allowed`` tokens.

    When the target's filters leave no mass on any allowed token, the tempered softmax
    over the allowed tokens is used instead (the grammar must still be followed).
    """
    mask = torch.from_numpy(np.ascontiguousarray(allowed)).to(logits.device)
    p = target_probs(logits, params) * mask
    total = p.sum()
    if float(total) > 0:
        return p / total
    return torch.softmax(logits.float().masked_fill(~mask, float("-inf")) / max(params.temperature, 1e-6), -1)


if TYPE_CHECKING:
    from lookupdec.batch import BatchGate
    from lookupdec.sampling import SamplingParams
    from lookupdec.verify import VerifyResult


@dataclass(frozen=True)
class StepPlan:
    """What one sequence puts into the next verify forward.

    Attributes:
        root: the last committed token (row 0).
        tree: the checked draft (rows ``1 .. n``).
        kept: for each node of ``tree``, its id in the drafter's own proposal, as
            ``tree.node_ids()`` (None: the proposal itself, uncut).
        extra: the drafter's window rows, or None.
        topk: top-k per verified row the drafter asked for (0: none).
        request: what the drafter was asked for.
        draft_s: seconds spent drafting and checking.
    """

    root: int
    tree: DraftTree
    kept: np.ndarray | None
    extra: ExtraRows | None
    topk: int
    request: DraftRequest
    draft_s: float

    @property
    def drafts(self) -> bool:
        """Whether the step verifies anything beyond its root (tree nodes or window rows)."""
        return len(self.tree) > 0 or self.extra is not None


class Sequence:
    """The state of one generation (see the module docstring).

    Args:
        decoder: the ``Decoder`` whose verifier, tokenizer and limits serve it.
        prompt_ids: the prompt's token ids (already checked to fit the context).
        drafter: the request's drafter.
        method_name: reported in the result.
        max_new: the most tokens generated.
        params: ``SamplingParams`` (temperature 0 = greedy).
        generator: the sampling ``torch.Generator`` (None when greedy). Its seed keys the
            uniform number of every output position (``sampling.position_uniform``): the token
            at position ``t`` is the target's distribution there inverted at that number, so a
            tree of deterministic drafts emits exactly the tokens plain sampling would; trees of
            sampled drafts (with ``q``) take their acceptance draws from the generator itself.
        stops: stop strings.
        on_text: called with each new piece of final text.
        constraint: a ``lookupdec.constraints.Constraint`` (None: unconstrained). Drafts are
            pruned to the paths it allows, its forced tokens join the draft, and every
            verified row is masked with the state of the path leading to it (greedy: argmax
            over allowed tokens; sampling: the target's probabilities renormalised over them).

    Example:
        >>> seq = Sequence(dec, ids, NoDrafter(), "ar", 8, SamplingParams(0.0, 1.0, 0), None, [], None)  # doctest: +SKIP
        >>> seq.prefill()                                                            # doctest: +SKIP
        >>> while not seq.done:                                                      # doctest: +SKIP
        ...     plan = seq.plan()
        ...     res = dec.verifier.forward(seq.cache, seq.past, plan.root, plan.tree, extra=plan.extra, topk=plan.topk)
        ...     seq.finish(plan, res, 0.0)
    """

    def __init__(self, decoder, prompt_ids: Seq[int], drafter, method_name: str, max_new: int,
                 params: "SamplingParams", generator, stops: Seq[str], on_text: Callable[[str], None] | None,
                 constraint=None) -> None:
        _bind_torch()
        self.verifier = decoder.verifier
        self.vocab_size = decoder.vocab_size
        self.default_budget = decoder.draft_budget
        # The decoder's cost provider (lookupdec.pricing.CostModel) learns from this sequence's
        # steps; None when nothing resolved it (methods that do not price, tests without a decoder).
        self.costs = getattr(decoder, "_cost_model", None)
        self.eos = set(decoder.loaded.eos_ids)
        self.prompt_ids = list(prompt_ids)
        self.drafter = as_drafter(drafter)
        self.method_name = method_name
        self.max_new = int(max_new)
        self.params = params
        self.generator = generator
        self._key = generator.initial_seed() if generator is not None else 0
        self.constraint = constraint
        self.stream = TextStream(decoder.tokenizer, list(stops), on_text)
        self.cache = None
        # Rows reused across requests (``lookupdec.prefix_cache``; None: off): filled before the
        # prefill; the prompt's rows kept after it, all of this sequence's when it finishes.
        self.prefixes = getattr(decoder, "prefixes", None)
        self.cached_tokens = 0
        self.past = len(self.prompt_ids)
        self.new: list[int] = []
        self.stats: list[StepStats] = []
        self.by_source: dict[str, int] = {}
        self.stop_reason = "length"
        self.done = False
        self._t_start = 0.0
        # Loop time no part of a step timed (the gate, the cost model's observation): ``run`` adds
        # it to the next step's ``other_ms``, so a result's step times add up to its elapsed time.
        self._untimed_ms = 0.0
        self._elapsed = 0.0

    # -- the steps -------------------------------------------------------------------------------

    def prefill(self) -> None:
        """Start the drafter and run the prompt through the verifier (this sequence alone)."""
        self._t_start = time.perf_counter()
        if self.max_new == 0:
            self.stream.finish(self.new)
            self.done = True  # elapsed stays 0: nothing was generated
            return
        verifier = self.verifier
        self.cache = verifier.new_cache(len(self.prompt_ids) + self.max_new + verifier.width(self.default_budget))
        with torch.inference_mode():
            t0 = time.perf_counter()
            self.drafter.begin(list(self.prompt_ids))
            t1 = time.perf_counter()
            if self.prefixes is not None:
                self.cached_tokens = self.prefixes.fill(self.cache, self.prompt_ids)
            logits = verifier.prefill(self.cache, list(self.prompt_ids))
            if self.prefixes is not None:  # the prompt's rows at once: requests decoding beside it reuse them too
                self.prefixes.keep(self.prompt_ids, self.cache)
            t2 = time.perf_counter()
            outcome = StepOutcome.plain([self._choose(logits)])
            k = topk_of(self.drafter)
            if k:
                from lookupdec.verify import topk_rows

                ids, probs = topk_rows(logits.unsqueeze(0), k)
                outcome = StepOutcome((), outcome.new_tokens, row_tokens=np.array([self.prompt_ids[-1]], np.int64),
                                      topk_ids=ids, topk_probs=probs)
            self._absorb(outcome, 0, (t1 - t0) * 1e3, (t2 - t1) * 1e3, 0.0)

    @inference  # ``run`` and a batch step hold the mode for all their steps: no entry a step
    def plan(self, budget: int | None = None) -> StepPlan:
        """Draft and check the next step's tree.

        Args:
            budget: most tree nodes this step (None: the decoder's ``draft_budget``);
                a batch shares one budget among its sequences this way.
        Returns:
            The step's ``StepPlan``.
        Raises:
            DraftError: the drafter proposed an invalid tree or window.
        """
        if self.done:
            raise RuntimeError("plan() on a finished sequence")
        budget = self.default_budget if budget is None else int(budget)
        t0 = time.perf_counter()
        root = self.new[-1]
        # A step emits at most depth + 1 tokens: deeper nodes could never be used.
        max_depth = self.max_new - len(self.new) - 1
        tree_masks = self.verifier.tree_masks
        # The request says what the verifier runs: whole trees and extra rows, or one path.
        request = DraftRequest(budget, max_depth, tree=tree_masks)
        drafter = self.drafter
        drafting = bool(budget and max_depth)
        proposal = drafter.propose(request) if drafting else None
        # The window is part of the step's draft: no budget, no window rows (and below: none
        # that does not fit beside the tree; ``auto`` prices that itself before choosing).
        extra = check_window(drafter, request, self.vocab_size) if drafting else None
        if proposal is not None:
            tree, kept = check_tree(drafter, proposal, self.vocab_size, budget, max_depth, tree_masks)
        else:
            tree, kept = DraftTree.empty(), None
        if self.constraint is not None and drafting:
            from lookupdec.constraints import constrain_draft

            # Plain ``ar`` (a drafter that never drafts) stays one token per forward: no forced tokens joined.
            tree, kept = constrain_draft(self.constraint, tree, kept, budget, max_depth,
                                         join=not isinstance(drafter, NoDrafter))
        if extra is not None and len(tree) + len(extra) > budget:
            extra = None  # the window counts inside the budget: one that does not fit beside the tree does not run
        t1 = time.perf_counter()
        # Top-k rows (Token Recycling's table) are part of drafting: a step that drafts nothing (a
        # batch's gate paused it, draft_budget=0) asks for none. Measured at 4 sequences with
        # budget 0: their top-k took ~1.4 of the 2.5 ms ``auto`` spent beyond ``ar`` a step.
        return StepPlan(root, tree, kept, extra, topk_of(drafter) if drafting else 0, request, t1 - t0)

    @inference
    def finish(self, plan: StepPlan, res: "VerifyResult", forward_s: float, observe: bool = True) -> None:
        """Accept a path of the verified tree, keep its cache rows and hand the outcome on.

        Args:
            plan: this step's plan.
            res: the verifier's result for this sequence's rows.
            forward_s: the forward's wall time (shared by a batch: the caller decides the share).
            observe: feed the step's timing to the decoder's cost model (False for a share
                of a batched forward, whose width is not this sequence's).
        """
        params = self.params
        t0 = time.perf_counter()
        # Logit rows the walk visits beyond those the verifier fetched are computed on
        # use; their time counts as verification.
        lazy_s = res.rows.compute_s
        allowed = None if self.constraint is None else self.constraint.row_masks(res.tree)
        if params.greedy:
            acc = greedy_accept(res.tree, lambda r: argmax_row(res.row(r)) if allowed is None
                                else masked_argmax(res.row(r), allowed(r)))
        else:
            probs = (lambda r: target_probs(res.row(r), params)) if allowed is None else \
                (lambda r: masked_probs(res.row(r), params, allowed(r)))
            if res.tree.sampled:
                acc = sample_accept(res.tree, probs, self.generator)
            else:
                # Deterministic drafts: each row's token is drawn at its output position's own
                # uniform, as plain sampling draws it there; a child holding that token is
                # accepted (probability p(x), as speculative sampling accepts a one-hot draft).
                tree, base = res.tree, len(self.new)

                def at(r: int) -> int:
                    u = position_uniform(self._key, base + (len(tree.path(r - 1)) if r else 0))
                    return draw_token(res.row(r), params, u, None if allowed is None else allowed(r))

                acc = greedy_accept(tree, at)
        lazy_s = res.rows.compute_s - lazy_s
        # Deferred top-k (Token Recycling): over the rows the walk computed, no lm_head row
        # more; its time is the drafter's. A step with neither top-k nor extra rows keeps the
        # outcome's shared empty defaults.
        t_topk = time.perf_counter()
        signals = res.signals().fields() if plan.topk or len(res.extra_argmax) else {}
        topk_s = time.perf_counter() - t_topk
        self.verifier.commit(self.cache, self.past, acc.nodes)
        self.past += 1 + acc.accepted
        # Node ids of the verified tree in the drafter's own proposal: carried by the tree
        # through every cut (check_tree, the grammar, a batch's budget, the chain fallback).
        origin = res.tree.node_ids()
        if acc.nodes:
            for src in res.tree.sources[list(acc.nodes)].tolist():
                name = SOURCE_NAMES.get(src, "other")
                self.by_source[name] = self.by_source.get(name, 0) + 1
        # Forced tokens the grammar added (origin -1) are not the drafter's nodes.
        mine = tuple(int(origin[i]) for i in acc.nodes if origin[i] >= 0) if acc.nodes else ()
        outcome = StepOutcome(mine, acc.tokens, res.tree, origin, topk_ms=topk_s * 1e3, **signals)
        t1 = time.perf_counter()
        past = self.past - 1 - acc.accepted
        self._absorb(outcome, len(res.tree), (plan.draft_s + topk_s) * 1e3, (forward_s + lazy_s) * 1e3,
                     (t1 - t0 - lazy_s - topk_s) * 1e3)
        if observe and self.costs is not None:
            self._observe(plan, res, past)

    def run(self, gate: "BatchGate | None" = None) -> GenerationResult:
        """Prefill, then step alone until done; returns the result.

        Args:
            gate: a ``BatchGate(min_size=1)`` that judges the drafting steps by what they deliver
                against plain steps and sets each step's budget (``Decoder.generate`` passes its
                per-band gate for ``auto``); None: every step drafts with the default budget.
        """
        self.prefill()
        verifier = self.verifier
        with torch.inference_mode():  # once, not per plan and finish (each entry costs ~10 us after a forward)
            mark = time.perf_counter()
            while not self.done:
                budget = None if gate is None else gate.budget(1, self.default_budget)
                plan = self.plan(budget)
                t0 = time.perf_counter()
                res = verifier.forward(self.cache, self.past, plan.root, plan.tree, extra=plan.extra, topk=plan.topk)
                done, carried = len(self.new), self._untimed_ms
                self.finish(plan, res, time.perf_counter() - t0)
                now = time.perf_counter()
                if gate is not None:
                    gate.record(1, budget != 0, plan.drafts, len(self.new) - done, now - mark)
                st = self.stats[-1]
                self._untimed_ms = max((now - mark) * 1e3 - (st.draft_ms + st.verify_ms + st.other_ms - carried), 0.0)
                mark = now
        return self.result()

    def result(self) -> GenerationResult:
        """The generation's result (call once ``done``)."""
        stats = self.stats
        steps = len(stats)
        new = self.new
        elapsed = self._elapsed
        return GenerationResult(
            text=self.stream.text,
            token_ids=tuple(new),
            prompt_tokens=len(self.prompt_ids),
            new_tokens=len(new),
            steps=steps,
            mean_accepted=len(new) / steps if steps else 0.0,
            tokens_per_s=len(new) / elapsed if elapsed > 0 else 0.0,
            elapsed_s=elapsed,
            method=self.method_name,
            stop_reason=self.stop_reason,
            cached_tokens=self.cached_tokens,
            step_stats=tuple(stats),
            accepted_by_source=dict(self.by_source),
            incomplete=self.constraint is not None and not self.constraint.is_complete,
            constraint_s=0.0 if self.constraint is None else self.constraint.mask_s,
        )

    # -- internals -------------------------------------------------------------------------------

    def _observe(self, plan: StepPlan, res: "VerifyResult", past: int) -> None:
        """Hand the step just recorded to the decoder's cost model (``lookupdec.pricing``)."""
        st = self.stats[-1]
        m = 0 if plan.extra is None else len(plan.extra)
        lazy = res.rows.compute_s > 0  # the fast backend: lm_head timed apart, extra rows in its first product
        self.costs.observe(StepTiming(self.verifier.width(len(res.tree) + m), past, st.verify_ms,
                                      res.rows.computed + m if lazy else 0, res.rows.compute_s * 1e3,
                                      st.draft_ms, st.other_ms))

    def _choose(self, logits) -> int:
        allowed = None if self.constraint is None else self.constraint.mask()
        if self.params.greedy:
            return argmax_row(logits) if allowed is None else masked_argmax(logits, allowed)
        return draw_token(logits, self.params, position_uniform(self._key, len(self.new)), allowed)

    def _absorb(self, outcome: StepOutcome, draft_size: int, draft_ms: float, verify_ms: float,
                other_ms: float) -> None:
        """Append the step's tokens (cut at the first EOS, a stop string and max_new), tell the
        drafter unless the sequence is done, and record the step."""
        t0 = time.perf_counter()
        new = self.new
        start = len(new)
        for tok in outcome.new_tokens:
            if len(new) >= self.max_new:
                break
            new.append(tok)
            if tok in self.eos:
                self.stop_reason = "eos"
                break
        if self.constraint is not None:
            self.constraint.commit(new[start:])
        if self.stream.active:
            keep = self.stream.update(new)
            if keep is not None:
                del new[keep:]
                self.stop_reason = "stop"
        done = self.stop_reason != "length" or len(new) >= self.max_new
        t1 = time.perf_counter()
        if not done:
            self.drafter.commit(outcome)
        t2 = time.perf_counter()
        self.stats.append(StepStats(draft_size, outcome.n_accepted, draft_ms + (t2 - t1) * 1e3, verify_ms,
                                    other_ms + (t1 - t0) * 1e3 + self._untimed_ms))
        self._untimed_ms = 0.0
        if done:
            self._finish_all()

    def _finish_all(self) -> None:
        if self.prefixes is not None:  # rows 0..past-1 are the committed tokens': the prompt's, then the output's
            self.prefixes.keep(self.prompt_ids + self.new, self.cache)
        self.stream.finish(self.new)
        self._elapsed = time.perf_counter() - self._t_start
        self.done = True
