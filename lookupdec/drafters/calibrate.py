"""Online calibration: turn each source's raw estimates into acceptance probabilities.

A source knows its own evidence (how many earlier occurrences continue with a
token, how long the match was) but not how often such evidence is right for
this model. ``Calibration`` learns that from what the verifier accepts:

- A node's *conditional* acceptance is the probability that it is accepted
  given that its parent was (or that it hangs under the root). Its path score
  is the product of the conditionals along the path, so it never exceeds its
  parent's.
- Each conditional is looked up by a key ``(source, raw bucket, match-length
  bucket, depth bucket)``: a Beta-style running rate, shrunk toward the rate of
  the coarser key ``(source, raw bucket, match-length bucket)``, which is in
  turn shrunk toward the source's prior guess. A few dozen outcomes move a
  bucket; the prior only matters at the start.
- Every proposed node whose parent path was confirmed by the tokens that
  followed is an observation: a hit if its token is the one that followed. This
  uses nodes that were pruned before verification too (greedy decoding
  reveals what the target chose at each confirmed position), and nodes deeper
  than their step's new tokens, decided by later steps (``Outcomes``).
- A lookup source's match length grows with depth (``NodeScorer``'s ``grow``):
  how long a match runs predicts best whether a copy goes on.

A Decoder keeps one Calibration for all its generations, so the rates carry
over from one request to the next, as a server would learn them.

Acceptance depends on the temperature: greedy decoding accepts a drafted token
when it is the argmax, sampling with the probability the target gives it. So
the rates are kept per temperature band (``Calibration.band``): greedy in the
decoder's Calibration itself, each sampling band in a child whose prior for a
key is the greedy rate of that key times the band's discount
(``BAND_DISCOUNT``), then what that band itself accepted. At a high
temperature the rates soon fall to what sampling accepts, and ``auto`` drafts
only what pays there, possibly nothing.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from lookupdec._native import calib_edges, calib_learn, calib_score
from lookupdec.tree import DraftTree

# Bucket edges: a value v falls in bucket bisect_right(EDGES, v).
RAW_EDGES = (0.15, 0.35, 0.6, 0.85, 0.999)
MATCH_EDGES = (2, 3, 4, 6, 8, 12, 16, 24, 32)
DEPTH_EDGES = (2, 3, 4, 6, 8, 12)
# Temperature bands: 0 is greedy; a temperature t > 0 is in band 1 + bisect_right(TEMPERATURE_EDGES, t),
# so (0, 0.5], (0.5, 0.85], (0.85, 1.2], above 1.2 (right-closed: 0.5 is in band 1).
TEMPERATURE_EDGES = (0.5, 0.85, 1.2)
# A sampling band's starting guess for a key: the greedy rate times this (from the AVX-512 run of
# issue 9: tau 2.17 greedy, 1.59 at 0.7 and 1.20 at 1.0, i.e. about 0.75 and 0.55 of the drafted
# gain per accepted position).
BAND_DISCOUNT = (1.0, 0.85, 0.75, 0.55, 0.4)
calib_edges(RAW_EDGES, MATCH_EDGES, DEPTH_EDGES)  # the native loops bucket with the same edges


def bucket(edges: Sequence[float], value: float) -> int:
    return bisect_right(edges, value)


def temperature_band(temperature: float) -> int:
    """The calibration band of a temperature: 0 for greedy (t <= 0), then 1..4.

    Example:
        >>> [temperature_band(t) for t in (0.0, 0.3, 0.5, 0.7, 1.0, 1.5)]
        [0, 1, 1, 2, 3, 4]
    """
    if temperature <= 0:
        return 0
    return 1 + sum(1 for e in TEMPERATURE_EDGES if temperature > e)


@dataclass
class Calibration:
    """Running acceptance rates by key, with two levels of shrinkage.

    Args:
        prior_weight: pseudo-observations of the prior (and of the coarse rate
            inside a fine key): small values learn fast, large values are steady.

    Example:
        >>> cal = Calibration()
        >>> key = ("pld", 4, 2, 0)
        >>> round(cal.rate(key, prior=0.5), 3)
        0.5
        >>> for _ in range(40): cal.observe(key, True)
        >>> cal.rate(key, prior=0.5) > 0.9
        True
    """

    prior_weight: float = 4.0
    _fine: dict[tuple, list[float]] = field(default_factory=dict)
    _coarse: dict[tuple, list[float]] = field(default_factory=dict)
    _bands: dict[int, "Calibration"] = field(default_factory=dict, repr=False)
    # A band's parent (the greedy rates) and its discount; None for the decoder's own.
    _parent: "Calibration | None" = field(default=None, repr=False)
    _discount: float = 1.0

    @property
    def root(self) -> "Calibration":
        """The greedy Calibration this one belongs to (itself for the greedy one)."""
        return self if self._parent is None else self._parent

    def band(self, temperature: float) -> "Calibration":
        """The rates for decoding at ``temperature``: this Calibration for greedy, a child per sampling band.

        Example:
            >>> cal = Calibration()
            >>> cal.band(0.0) is cal, cal.band(0.9) is cal.band(1.1), cal.band(0.3) is cal.band(1.0)
            (True, True, False)
        """
        return self.root._band_of(temperature_band(float(temperature)))

    def _band_of(self, b: int) -> "Calibration":
        """Band ``b``'s rates (``temperature_band``; 0: the greedy root), made on first use."""
        root = self.root
        if b == 0:
            return root
        child = root._bands.get(b)
        if child is None:
            child = root._bands[b] = Calibration(root.prior_weight, _parent=root, _discount=BAND_DISCOUNT[b])
        return child

    def rate(self, key: tuple, prior: float) -> float:
        """The calibrated probability for ``key`` (its last field is the depth bucket)."""
        if self._parent is not None:
            prior = self._parent.rate(key, prior) * self._discount
        w = self.prior_weight
        hc, tc = self._coarse.get(key[:-1], (0.0, 0.0))
        coarse = (hc + w * prior) / (tc + w)
        hf, tf = self._fine.get(key, (0.0, 0.0))
        return (hf + w * coarse) / (tf + w)

    def levels(self) -> list[tuple]:
        """What the native loops (``ext/calib.pxi``) read for ``rate``: ``(fine, coarse, discount,
        prior_weight)`` of the greedy root, then of this band (the dicts themselves, not copies)."""
        own = (self._fine, self._coarse, self._discount, self.prior_weight)
        return [own] if self._parent is None else [*self._parent.levels(), own]

    def observe(self, key: tuple, hit: bool) -> None:
        """One outcome of ``key`` (and of its coarse key). The decoding loop observes natively
        (``ext/calib.pxi``, the same update); this is for single outcomes and the references."""
        for table, k in ((self._fine, key), (self._coarse, key[:-1])):
            s = table.get(k)
            if s is None:
                s = table[k] = [0.0, 0.0]
            s[0] += 1.0 if hit else 0.0
            s[1] += 1.0

    def observations(self, source: str) -> int:
        """Outcomes seen for ``source`` so far."""
        return int(sum(t for k, (_, t) in self._coarse.items() if k[0] == source))


def lookup_prior(raw: float, match_len: int, depth: int) -> float:
    """A starting guess for lookup sources: the raw share, discounted for short matches and depth."""
    return float(raw) * min(0.9, 0.35 + 0.1 * match_len) * (0.92 ** (depth - 1))


class _Proposal:
    """One scored tree waiting for the tokens that decide its nodes (``Outcomes``)."""

    __slots__ = ("tokens", "parents", "depth", "keys", "order", "at", "state", "start", "deepest")

    def __init__(self, tokens: list[int], parents: list[int], depth: list[int], keys: list[tuple],
                 start: int) -> None:
        self.tokens, self.parents, self.depth, self.keys = tokens, parents, depth, keys
        # Nodes by depth (stable: parents come before their children at every depth).
        self.order = sorted(range(len(tokens)), key=depth.__getitem__)
        self.at = 0  # nodes of ``order`` decided so far
        self.state: list[bool | None] = [None] * len(tokens)  # its path followed / not / not known yet
        self.start = start  # where the tokens that follow it begin in ``Outcomes``' token list
        self.deepest = 0  # the depth of the deepest node decided as followed


class Outcomes:
    """Scored trees waiting for the tokens that decide their nodes, each observed once decided.

    A node is decided once as many tokens have followed its proposal as it is deep, on
    this step or on later ones: a node deeper than what one step accepts (one that the
    selection pruned, or beyond the bonus token) is decided by the steps after it. Deciding
    only with the step's own tokens would observe a node at depth ``d`` only where ``d - 1``
    drafted tokens were accepted, so a source that is verified a few tokens deep would never
    learn how its deep nodes fare (measured on 6 Spec-Bench translation first turns, where
    ``auto`` mostly verified 3 nodes: the context source's depth buckets 8-11 held 8 outcomes
    and 12+ none, so their rates were borrowed from shallow nodes). Greedy decoding reveals exactly
    whether a node would have been accepted; under sampling a node is a hit when its token
    is the one sampled, the same rule as for the step's own tokens. A proposal is decided
    within as many tokens as it is deep, so at most ``horizon`` wait (the oldest are dropped).

    Args:
        calibration: where the outcomes go.
        conditional: observe a node only when its parent's path followed (a conditional
            rate, ``NodeScorer``); otherwise a node under a path that did not follow is a
            miss as well (a whole path's rate, ``MergedCalibration``).
        horizon: the most proposals that wait.

    Example:
        >>> cal = Calibration()
        >>> out = Outcomes(cal)
        >>> out.add([5, 6, 7], [-1, 0, 1], [1, 2, 3], [("s", 0, 0, 1), ("s", 0, 0, 2), ("s", 0, 0, 3)])
        >>> out.learn([5])        # node 5 is decided; 6 and 7 wait
        >>> cal.observations("s")
        1
        >>> out.learn([6, 9])     # the next step decides them: 6 a hit, 7 a miss
        >>> cal.observations("s"), cal.rate(("s", 0, 0, 3), 0.5) < 0.5
        (3, True)
    """

    TRIM = 4096  # tokens no proposal waits on are dropped from the list once this many gather

    def __init__(self, calibration: Calibration, conditional: bool = True, horizon: int = 16) -> None:
        self.calibration = calibration
        self.conditional = conditional
        self.horizon = int(horizon)
        self._waiting: list[_Proposal] = []
        self._seen: list[int] = []  # the tokens that followed the waiting proposals, in order

    def add(self, tokens: list[int], parents: list[int], depth: list[int], keys: list[tuple]) -> None:
        """A proposal's nodes (parents before children), their depths and keys."""
        if tokens:
            self._waiting.append(_Proposal(tokens, parents, depth, keys, len(self._seen)))

    def clear(self) -> None:
        """Drop every waiting proposal (a new sequence starts: later tokens do not follow them)."""
        self._waiting, self._seen = [], []

    def learn(self, new_tokens: Sequence[int]) -> None:
        """Decide what the tokens that followed reveal, on every waiting proposal."""
        if not self._waiting or not len(new_tokens):
            return
        seen = self._seen
        seen.extend(int(t) for t in new_tokens)
        # One native call (``ext/calib.pxi``; ``tests/oracles/calibrate.py`` is the loop in Python):
        # a node is decided once as many tokens followed its proposal as it is deep.
        cal = self.calibration
        keep = calib_learn(cal._fine, cal._coarse, self._waiting, seen, self.conditional)
        self._waiting = keep = keep[-self.horizon:]
        if not keep:
            self._seen = []
        elif keep[0].start >= self.TRIM:
            cut = keep[0].start
            del seen[:cut]
            for w in keep:
                w.start -= cut


class NodeScorer:
    """One source's bridge to the shared Calibration: scores its trees, learns from outcomes.

    Args:
        source: the source's name (``SOURCES`` key), the first field of every key.
        calibration: the shared rates (a private one when None).
        prior: ``prior(raw, match_len, depth)``, the source's guess before any outcome.
        grow: the match grows with depth (lookup sources): a node at depth ``d`` is
            accepted only after its ``d - 1`` ancestors were, and then continues a match of
            ``match_len + d - 1`` tokens, which is its key's match length. How long the
            match already runs is what predicts a copy's next token best (on 104 Spec-Bench
            first turns, 8 per category, the most recent longest match's next token followed
            0.52 of the time after 2 matched tokens, 0.87 after 8-11, 0.94 after 16-23,
            0.99 after 32 or more, about alike at any depth of the same total).

    Example:
        >>> s = NodeScorer("pld", Calibration())
        >>> t = s.score(DraftTree.chain([5, 6]), raw=np.array([1.0, 1.0]), match_len=3, source_id=1)
        >>> bool(t.scores[0] >= t.scores[1] > 0)
        True
        >>> s.learn((5, 7))      # node 0 hit, node 1 missed
    """

    def __init__(self, source: str, calibration: Calibration | None = None,
                 prior: Callable[[float, int, int], float] = lookup_prior, grow: bool = False) -> None:
        self.source = source
        self.grow = bool(grow)
        self.calibration = calibration if calibration is not None else Calibration()
        self.prior = prior
        self._outcomes = Outcomes(self.calibration)

    def score(self, tree: DraftTree, raw: np.ndarray, match_len: int | Sequence[int], source_id: int) -> DraftTree:
        """``tree`` with calibrated path scores; remembered until ``learn``.

        Args:
            tree: the proposal (its own scores are ignored).
            raw: ``(n,)`` the source's raw conditional estimate per node (e.g.
                the share of the parent's occurrences that continue with it).
            match_len: the match length behind the proposal (one for all, or per node).
            source_id: stamped on every node.
        """
        n = len(tree)
        if n == 0:
            return tree
        parents = tree.parents.tolist()
        tokens = tree.tokens.tolist()
        per_node = isinstance(match_len, (list, tuple)) or (isinstance(match_len, np.ndarray) and match_len.ndim > 0)
        lens = [int(m) for m in match_len] if per_node else [int(match_len)] * n
        raws = np.asarray(raw, np.float64).tolist()
        if self.prior is lookup_prior:  # one native call (``ext/calib.pxi``), the loop below its reference
            scores, depth, keys = calib_score(self.calibration.levels(), self.source, parents, raws, lens, self.grow)
        else:
            scores, depth, keys = self._score_py(parents, raws, lens)
        self._outcomes.add(tokens, parents, depth, keys)
        return DraftTree.trusted(tree.tokens, tree.parents, np.array(scores, np.float64),
                                 np.full(n, source_id, np.int16), depth=depth)

    def record(self, tokens: list[int], parents: list[int], depth: list[int], keys: list[tuple]) -> None:
        """Remember a tree scored elsewhere (``context_propose``, ext/context.pxi) until ``learn``."""
        self._outcomes.add(tokens, parents, depth, keys)

    def _score_py(self, parents: list[int], raws: list[float], lens: list[int]) -> tuple[list, list, list]:
        """Per node its path score, depth and key, in Python (any ``prior``)."""
        n = len(parents)
        cal, src, prior, grow = self.calibration, self.source, self.prior, self.grow
        depth = [0] * n
        keys: list[tuple] = [()] * n
        scores = [0.0] * n  # plain floats: numpy item access costs more than this loop's work
        rate = cal.rate
        for i, p in enumerate(parents):
            d = 1 if p < 0 else depth[p] + 1
            depth[i] = d
            r = raws[i]
            m = lens[i] + d - 1 if grow else lens[i]
            key = (src, bucket(RAW_EDGES, r), bucket(MATCH_EDGES, m), bucket(DEPTH_EDGES, d))
            keys[i] = key
            c = rate(key, prior(r, m, d))
            scores[i] = c if p < 0 else scores[p] * c
        return scores, depth, keys

    def learn(self, new_tokens: Sequence[int]) -> None:
        """Record what the tokens that followed reveal of the scored trees (``Outcomes``)."""
        self._outcomes.learn(new_tokens)

    def restart(self) -> None:
        """Forget the scored trees still waiting (a new sequence begins)."""
        self._outcomes.clear()


def conditional(tree: DraftTree) -> np.ndarray:
    """Each node's score divided by its parent's (root children: their own score).

    For a tree scored with shares of occurrences (``from_sequences``) this is
    the share of the parent's occurrences that continue with the node.

    Example:
        >>> conditional(DraftTree.from_sequences([[1, 2], [1, 3], [4]])).tolist()
        [0.6666666666666666, 0.5, 0.5, 0.3333333333333333]
    """
    if len(tree) == 0:
        return tree.scores.copy()
    s = tree.scores.tolist()  # plain floats: a few dozen nodes, where each numpy call costs more
    out = []
    for x, p in zip(s, tree.parents.tolist()):
        ps = s[p] if p >= 0 else 1.0
        out.append(x / ps if ps > 0 else 0.0)
    return np.array(out, np.float64)
