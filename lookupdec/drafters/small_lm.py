"""The small-LM fallback: draft with a separate, smaller causal LM sharing the target's tokenizer.

``DraftModel`` is decoder state (like the calibration): the draft model, a
``TreeVerifier`` over it used as a plain runner (its own KV cache per
generation, the same fast CPU forward as the target when it qualifies), and
its measured cost per drafted token. ``SmallLMDrafter`` is one generation's
source:

- its cache holds a prefix of the committed tokens; ``commit`` cuts it to the
  longest cached prefix that the committed tokens confirm (the accepted draft
  tokens' rows stay valid), and the next ``propose`` feeds the rest (the bonus
  token, tokens accepted from other sources) in one forward: lazy catch-up;
- it drafts a chain of depth ``D`` (one draft forward per token), with the
  second-best / a second drawn token as a leaf sibling on the first
  ``config.alternates`` levels (free: that level's distribution is already
  computed). ``D`` maximises expected tokens per ms,
  ``(1 + sum_d prod_{j<=d} a_j) / (D * draft_ms + c(1 + nodes))``, from the
  calibrated conditional acceptance ``a_j`` at each depth, the measured draft
  cost and the target's cost curve ``c`` (``choose_depth``); it is chosen
  before any token is drawn, so the tree's shape never depends on them;
- greedy (and inside ``auto``): argmax / top-2 tokens, deterministic nodes.
  Sampling (method ``draft`` with a temperature): tokens drawn from the draft's
  distribution under the target's temperature / top-k / top-p, siblings without
  replacement, each node carrying the distribution it was drawn from (``q``),
  with the generator the decoder hands over in ``set_sampling``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.calibrate import Calibration, NodeScorer
from lookupdec.sampling import sample, target_probs
from lookupdec.tree import DraftTree
from lookupdec.tree_rows import argmax_row

# Prior conditional acceptance of a draft token before any outcome (a few dozen outcomes override it).
PRIOR_ACCEPT = 0.6


@dataclass(frozen=True)
class SmallLMConfig:
    """Settings of :class:`SmallLMDrafter`.

    Raises:
        ValueError: bounds below their minimum.
    """

    # Deepest chain drafted; each level costs one draft forward.
    max_depth: int = 8
    # Depth used when the target's cost curve is unknown (no ``cost`` given).
    default_depth: int = 4
    # Levels (from the first) that get a second candidate as a leaf sibling: top-2 there.
    alternates: int = 1
    # Extra rows of draft-model cache reserved per generation beyond prompt + new tokens.
    slack: int = 64

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.default_depth < 1:
            raise ValueError(f"max_depth and default_depth must be >= 1, got {self.max_depth}, {self.default_depth}")
        if self.alternates < 0:
            raise ValueError(f"alternates must be >= 0, got {self.alternates}")


class DraftModel:
    """A loaded draft model, its runner and its measured cost, shared by a decoder's generations.

    Args:
        loaded: a ``lookupdec.models.LoadedModel`` with the target's tokenizer (checked by the caller).
        fast: run the lean CPU forward when the model qualifies.

    Attributes:
        ms_per_token: running estimate of one single-token draft forward (ms).
    """

    def __init__(self, loaded, *, fast: bool = True) -> None:
        from lookupdec.verify import TreeVerifier

        self.loaded = loaded
        self.name = loaded.name
        self.runner = TreeVerifier(loaded.model, fast=fast)
        self.vocab_size = int(loaded.model.config.get_text_config(decoder=True).vocab_size)
        self.ms_per_token = self._measure()

    @torch.inference_mode()
    def _measure(self, steps: int = 5) -> float:
        cache = self.runner.new_cache(32)
        self.runner.prefill(cache, [1] * 8)
        times = []
        for i in range(steps):
            t = time.perf_counter()
            self.runner.forward(cache, 8 + i, 1, DraftTree.empty())
            times.append((time.perf_counter() - t) * 1e3)
        return float(statistics.median(times[1:]))

    def observe_ms(self, ms: float) -> None:
        self.ms_per_token = 0.9 * self.ms_per_token + 0.1 * float(ms)


def expected_tokens(accept: Sequence[float]) -> np.ndarray:
    """``e[D] = 1 + sum_{d<=D} prod_{j<=d} accept[j-1]``: expected tokens of a step drafting a chain of depth D.

    Example:
        >>> expected_tokens([0.5, 0.5]).tolist()
        [1.0, 1.5, 1.75]
    """
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(np.asarray(accept, np.float64)))])


def choose_depth(accept: Sequence[float], draft_ms: float, cost_ms: np.ndarray, max_depth: int, extra_nodes: int = 0,
                 margin: float = 0.02) -> tuple[int, float]:
    """The chain depth with the best expected tokens per ms, and that rate.

    Args:
        accept: conditional acceptance at depths 1..len(accept).
        draft_ms: draft cost per token (ms).
        cost_ms: the target's ``cost_ms[w]`` (``CostCurve.table``), ``w >= 1``.
        max_depth: deepest allowed.
        extra_nodes: leaf siblings verified with any non-empty chain.
        margin: depth 0 (a plain step) wins unless a draft beats it by this share.
    Returns:
        ``(depth, tokens per ms)``; depth 0 means draft nothing.
    Example:
        >>> choose_depth([0.9] * 8, 1.0, np.array([np.inf] + [10.0] * 20), 8)[0]
        8
        >>> choose_depth([0.1] * 8, 5.0, np.array([np.inf] + [10.0] * 20), 8)[0]
        0
    """
    top = min(int(max_depth), len(accept), len(cost_ms) - 2 - extra_nodes)
    plain = 1.0 / float(cost_ms[1])
    if top < 1:
        return 0, plain
    e = expected_tokens(accept[:top])
    depths = np.arange(1, top + 1)
    rates = e[1:] / (depths * draft_ms + np.asarray(cost_ms)[1 + depths + extra_nodes])
    k = int(np.argmax(rates))
    if rates[k] <= plain * (1.0 + margin):
        return 0, plain
    return int(depths[k]), float(rates[k])


def _draft_prior(raw: float, match_len: int, depth: int) -> float:
    return float(raw)  # the draft's own probability of its token


class SmallLMDrafter(Drafter):
    """Drafts from a small LM with its own KV cache (see the module docstring).

    Args:
        draft_model: a ``DraftModel``.
        calibration: shared acceptance rates (a private one when None).
        cost: the target's CostCurve or a callable returning it; None = ``config.default_depth``.
        config: a ``SmallLMConfig``.
        sampled: draft by sampling when ``set_sampling`` gives a temperature (method
            ``draft``); False always drafts deterministic argmax / top-2 nodes (inside ``auto``,
            whose merged tree must hold deterministic nodes only).

    Example:
        >>> d = SmallLMDrafter(DraftModel(tiny_loaded))          # doctest: +SKIP
        >>> d.begin([5, 6, 7]); len(d.propose(DraftRequest(8, 8)))   # doctest: +SKIP
        5
    """

    name = "draft"

    # In ``auto`` it drafts after the lookup sources, and only where ``pays`` says so.
    second_stage = True

    def pays(self, selection, max_depth: int, margin: float) -> bool:
        """Whether this step's draft beats the lookup ``selection`` by ``margin`` (``drafters/gate.py``)."""
        from lookupdec.drafters.gate import draft_pays

        return draft_pays(self, selection, max_depth, margin)

    def __init__(self, draft_model: DraftModel, *, calibration: Calibration | None = None, cost=None,
                 config: SmallLMConfig | None = None, sampled: bool = True) -> None:
        self.model = draft_model
        self.config = config or SmallLMConfig()
        self.calibration = calibration if calibration is not None else Calibration()
        self.scorer = NodeScorer("draft", self.calibration, prior=_draft_prior)
        self._cost = cost
        self._table: np.ndarray | None = None
        self._table_past = -1
        self._drafted: dict[int, int] = {}  # cache row -> drafted token held there
        self.allow_sampling = bool(sampled)
        self.params = None
        self.generator: torch.Generator | None = None
        self._ids: list[int] = []
        self._cache = None
        self._cached = 0       # cache rows holding ids[:cached]
        self._chain: list[int] = []   # node ids of the last proposal's main chain

    # ------------------------------------------------------------ protocol
    def set_sampling(self, params, generator: torch.Generator | None) -> None:
        """The request's sampling settings and the generator for draft draws (see drafters/base.py)."""
        self.params = params
        self.generator = generator

    @property
    def sampling(self) -> bool:
        return self.allow_sampling and self.params is not None and not self.params.greedy

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._ids = [int(t) for t in prompt_ids]
        self.scorer.restart()
        self._cache = None
        self._cached = 0
        self._chain = []
        if callable(self._cost) and not hasattr(self._cost, "table"):
            self._cost = self._cost()

    def commit(self, outcome: StepOutcome) -> None:
        self.scorer.learn(outcome.new_tokens)
        self._learn_depths(outcome)
        start = len(self._ids)
        self._ids.extend(int(t) for t in outcome.new_tokens)
        # Cached rows past the committed prefix hold drafted tokens: keep those the new tokens confirm.
        if self._cache is not None and self._cached > start:
            ok = start
            while ok < self._cached and ok < len(self._ids) and self._drafted.get(ok) == self._ids[ok]:
                ok += 1
            self._cut(ok)

    def expected_rate(self, max_depth: int) -> tuple[int, float]:
        """The depth this drafter would draft now and its expected tokens per ms (``choose_depth``)."""
        table = self._cost_table()
        if table is None:
            return min(self.config.default_depth, max_depth), float("inf")
        accept = [self.calibration.rate(("draft-depth", min(d, 16), 0), PRIOR_ACCEPT)
                  for d in range(1, self.config.max_depth + 1)]
        return choose_depth(accept, self.model.ms_per_token, table, max_depth, self.config.alternates)

    def propose(self, request: DraftRequest) -> DraftTree:
        self._chain = []
        alt = self.config.alternates
        depth, _ = self.expected_rate(min(request.max_depth, self.config.max_depth))
        depth = min(depth, request.max_depth, request.budget)
        alt = min(alt, depth, request.budget - depth)
        if depth <= 0:
            self.scorer.score(DraftTree.empty(), np.zeros(0), 0, SOURCES["draft"])
            return DraftTree.empty()
        with torch.inference_mode():
            probs = self._catch_up()
            tokens, parents, raw, qs = [], [], [], []
            parent = -1
            t0 = time.perf_counter()
            for d in range(1, depth + 1):
                q = probs
                x, qx = self._pick(q)
                node = len(tokens)
                tokens.append(x), parents.append(parent), raw.append(qx), qs.append(q)
                self._chain.append(node)
                if d <= alt:
                    rest = q.clone()
                    rest[x] = 0.0
                    mass = float(rest.sum())
                    if mass > 0.0:  # exists or not depending on x only, an earlier draw: exact
                        rest /= mass
                        y, qy = self._pick(rest)
                        tokens.append(y), parents.append(parent), raw.append(qy), qs.append(rest)
                parent = node
                if d < depth:
                    probs = self._step(x)
            if depth > 1:
                self.model.observe_ms((time.perf_counter() - t0) * 1e3 / (depth - 1))
        tree = DraftTree(np.array(tokens, np.int64), np.array(parents, np.int32),
                         q=torch.stack(qs).numpy() if self.sampling else None)
        scored = self.scorer.score(tree, np.array(raw), 0, SOURCES["draft"])
        if self.sampling:
            return DraftTree(scored.tokens, scored.parents, scored.scores, scored.sources, tree.q, True)
        return scored

    # ------------------------------------------------------------ internals
    def _cost_table(self):
        cost = self._cost
        if cost is None:
            return None
        if callable(cost) and not hasattr(cost, "table"):
            cost = self._cost = cost()
        past = len(self._ids)
        if self._table is None or abs(past - self._table_past) >= 64:
            self._table = cost.table(past, self.config.max_depth + self.config.alternates + 2)
            self._table_past = past
        return self._table

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling:
            return target_probs(logits, self.params).float().cpu()
        return torch.softmax(logits.float().cpu(), dim=-1)

    def _pick(self, q: torch.Tensor) -> tuple[int, float]:
        if self.sampling:
            x = sample(q, self.generator)  # q's own law, one uniform draw (multinomial: one per token)
        else:
            x = argmax_row(q)
        return x, float(q[x])

    def _catch_up(self) -> torch.Tensor:
        """Feed the committed tokens the cache lacks; the draft's distribution after the last one."""
        runner = self.model.runner
        ids = self._ids
        if self._cache is None:
            self._cache = runner.new_cache(len(ids) + 256 + self.config.slack)
            self._drafted = {}
            self._cached = len(ids)
            return self._probs(runner.prefill(self._cache, ids))
        past = self._cached
        rest = ids[past:]
        if not rest:  # everything cached (cannot happen after a commit, which adds a bonus token)
            self._cut(past - 1)
            past, rest = past - 1, ids[past - 1:]
        res = runner.forward(self._cache, past, rest[0], DraftTree.chain(rest[1:]))
        runner.commit(self._cache, past, tuple(range(len(rest) - 1)))
        self._cached = len(ids)
        return self._probs(res.row(len(rest) - 1))

    def _step(self, token: int) -> torch.Tensor:
        """Append a drafted token to the cache; the draft's distribution after it."""
        pos = self._cached
        res = self.model.runner.forward(self._cache, pos, token, DraftTree.empty())
        self._drafted[pos] = token
        self._cached = pos + 1
        return self._probs(res.row(0))

    def _cut(self, rows: int) -> None:
        from lookupdec.kvcache import keep_rows

        keep_rows(self._cache, rows, [])
        self._cached = rows
        self._drafted = {k: v for k, v in self._drafted.items() if k < rows}

    def _learn_depths(self, outcome: StepOutcome) -> None:
        """Conditional acceptance per depth of the main chain (for ``choose_depth``)."""
        chain, self._chain = self._chain, []
        if not chain:
            return
        got = set(outcome.accepted)
        # Inside auto only some of the nodes may have been verified: an unverified one says nothing.
        verified = set(outcome.origin.tolist()) if len(outcome.origin) else None
        for d, node in enumerate(chain, 1):
            if verified is not None and node not in verified:
                break
            hit = node in got
            self.calibration.observe(("draft-depth", min(d, 16), 0), hit)
            if not hit:
                break


def draft_method(*, draft_model: DraftModel | None = None, calibration: Calibration | None = None,
                 cost=None) -> SmallLMDrafter:
    """Method ``draft``: the small LM alone (sampling with q when the request samples).

    Raises:
        ValueError: no draft model.
    """
    if draft_model is None:
        raise ValueError("method 'draft' needs a draft model: pass draft_model= or draft_layers= to the Decoder "
                         "(--draft-model ID|DIR|GGUF or --draft-layers K on the command line)")
    return SmallLMDrafter(draft_model, calibration=calibration, cost=cost)
