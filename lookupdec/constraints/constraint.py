"""One request's grammar state: token masks, draft pruning, forced tokens, commits.

The state advances only on ``commit`` (tokens appended to the output). Every
other call (a path's mask, pruning, forced tokens) moves the engine's matcher
along a drafted path and rolls it back before returning, so the committed state
is never changed by looking ahead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from lookupdec.constraints.engine import ll_tokenizer
from lookupdec.constraints.spec import ConstraintError, GrammarText, grammar_text
from lookupdec.tree import DraftTree


@dataclass(frozen=True)
class Joined:
    """A draft tree with the grammar's forced tokens joined in.

    Attributes:
        tree: the joined tree.
        origin: for each node of ``tree``, its id in the tree given (-1: a forced token added).
    """

    tree: DraftTree
    origin: np.ndarray


class Constraint:
    """A compiled ``grammar=`` constraint bound to a tokenizer, with its committed state.

    Args:
        grammar: a JSON Schema dict, a choice list, or a ``JsonSchema``/``Regex``/``Lark``/``Choice``
            (see ``lookupdec.constraints.spec``), or an already translated ``GrammarText``.
        tokenizer: the model's fast tokenizer.
        vocab_size: the model's vocabulary size (the length of every mask).
        eos_ids: the model's end-of-sequence ids: allowed exactly when the grammar is complete.
    Raises:
        ConstraintError: the grammar is malformed or the engine cannot compile it.

    Attributes:
        kind: "json_schema", "regex", "lark" or "choice".
        schema: the JSON Schema (kind "json_schema"), else None.
        mask_s: seconds spent in the engine so far (masks, pruning, forced tokens, commits).
    """

    def __init__(self, grammar: Any, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        import llguidance

        text = grammar if isinstance(grammar, GrammarText) else grammar_text(grammar)
        self.kind = text.kind
        self.schema = text.schema
        self.vocab_size = int(vocab_size)
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self._lltok = ll_tokenizer(tokenizer, self.vocab_size, self.eos_ids)
        self._m = llguidance.LLMatcher(self._lltok, text.grammar)
        if self._m.is_error():
            raise ConstraintError(f"cannot compile the {text.kind} constraint: {self._m.get_error()}")
        self._eos_only = np.zeros(self.vocab_size, bool)
        self._eos_only[[e for e in self.eos_ids if 0 <= e < self.vocab_size]] = True
        self.mask_s = 0.0
        self.tokens: list[int] = []
        self._ended = False

    # -- the committed state -------------------------------------------------------------------

    @property
    def is_complete(self) -> bool:
        """Whether the output so far is a complete match (an EOS would be accepted)."""
        return self._ended or bool(self._m.is_accepting())

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the state by tokens appended to the output (an EOS ends it).

        Raises:
            ConstraintError: a token the grammar forbids (the decoder never commits one).
        """
        t0 = time.perf_counter()
        toks = [int(t) for t in tokens]
        cut = next((i for i, t in enumerate(toks) if t in self.eos_ids), len(toks))
        body = toks[:cut]
        if self._ended and toks:
            raise ConstraintError("the output already ended with EOS; nothing may follow it")
        if body:
            n = self._m.try_consume_tokens(body)
            if n != len(body):
                raise ConstraintError(f"token {body[n]} is not allowed by the grammar here "
                                      f"({self._m.get_error() or 'rejected'})")
        if cut < len(toks):
            if not self._m.is_accepting():
                raise ConstraintError("EOS before the grammar is complete")
            self._ended = True
        self.tokens.extend(toks[: cut + 1])
        self.mask_s += time.perf_counter() - t0

    def mask(self) -> np.ndarray:
        """Allowed next tokens at the committed state: bool ``(vocab_size,)``."""
        return self.mask_after(())

    def mask_after(self, path: Sequence[int]) -> np.ndarray:
        """Allowed tokens after the committed output followed by ``path`` (the state is unchanged).

        Args:
            path: drafted tokens (each allowed in turn; a path the grammar rejects gets
                the EOS-only mask, which no exact walk ever reaches).
        Returns:
            bool ``(vocab_size,)``; never all False (EOS ids at worst).
        """
        t0 = time.perf_counter()
        m = self._m
        path = [int(t) for t in path]
        cut = next((i for i, t in enumerate(path) if t in self.eos_ids), None)
        if cut is not None or self._ended:
            # After an EOS nothing follows; the row's token is cut anyway.
            self.mask_s += time.perf_counter() - t0
            return self._eos_only
        n = m.try_consume_tokens(path) if path else 0
        if n == len(path):
            bits = np.frombuffer(m.compute_bitmask(), np.uint8)
            allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
            if len(allowed) < self.vocab_size:
                allowed = np.concatenate([allowed, np.zeros(self.vocab_size - len(allowed), bool)])
        else:
            allowed = self._eos_only
        if n:
            m.rollback(n)
        if not allowed.any():
            allowed = self._eos_only
        self.mask_s += time.perf_counter() - t0
        return allowed

    # -- drafts --------------------------------------------------------------------------------

    def prune(self, tree: DraftTree) -> np.ndarray:
        """Node ids of ``tree`` whose whole path the grammar allows (parents before children).

        Args:
            tree: a draft under the last committed token.
        Returns:
            int64 sorted node ids; ``tree.subset`` of them is a valid tree.
        """
        t0 = time.perf_counter()
        n = len(tree)
        keep = np.zeros(n, bool)
        if n:
            toks = tree.tokens.tolist()
            for leaf in tree.leaves().tolist():
                path = tree.path(leaf)
                if keep[path[-1]]:
                    continue
                ok = 0 if self._ended else self._m.validate_tokens([toks[i] for i in path])
                keep[path[:ok]] = True
        self.mask_s += time.perf_counter() - t0
        return np.flatnonzero(keep).astype(np.int64)

    def forced(self, max_len: int) -> list[int]:
        """Tokens the grammar forces next (its fast-forward tokens, at most ``max_len``).

        They are a draft, verified like any other: the grammar forces the bytes, and
        the model may still pick another tokenization of them.
        """
        return self.forced_after((), max_len)

    def forced_after(self, path: Sequence[int], max_len: int) -> list[int]:
        """``forced`` after the committed output followed by ``path`` (the state is unchanged).

        Returns:
            The forced tokens (empty when ``path`` is not allowed, ends the output, or nothing is forced).
        """
        if max_len <= 0 or self._ended:
            return []
        t0 = time.perf_counter()
        m = self._m
        path = [int(t) for t in path]
        ff: list[int] = []
        if not any(t in self.eos_ids for t in path):
            n = m.try_consume_tokens(path) if path else 0
            if n == len(path):
                ff = [int(t) for t in m.compute_ff_tokens()][:max_len]
                ff = [t for t in ff if t < self.vocab_size]
                if ff:
                    ff = ff[: m.validate_tokens(ff)]
            if n:
                m.rollback(n)
        self.mask_s += time.perf_counter() - t0
        return ff

    def row_masks(self, tree: DraftTree) -> Callable[[int], np.ndarray]:
        """Allowed tokens of each verified row: the state after the path leading to it.

        Args:
            tree: the verified tree (row 0 = the root, row ``1 + i`` = node ``i``).
        Returns:
            ``mask(row) -> bool (vocab_size,)``, computed on first use and cached.
        """
        cache: dict[int, np.ndarray] = {}
        toks = tree.tokens

        def mask(row: int) -> np.ndarray:
            got = cache.get(row)
            if got is None:
                path = [] if row == 0 else toks[tree.path(row - 1)].tolist()
                got = cache[row] = self.mask_after(path)
            return got

        return mask


def join_forced(tree: DraftTree, forced: Sequence[int], source: int, budget: int, max_depth: int) -> Joined:
    """``tree`` with the chain ``forced`` joined under the root, cut back to ``budget`` nodes.

    Nodes of ``tree`` that spell a prefix of ``forced`` are reused; the rest of the
    chain is added (scored like its parent, with ``source``). Over budget, the best
    nodes by score are kept (``DraftTree.best``).

    Args:
        tree: a (grammar-pruned, deterministic) draft.
        forced: the grammar's forced tokens.
        source: source id of the added nodes.
        budget, max_depth: the step's limits.
    Returns:
        The ``Joined`` tree and each node's id in ``tree`` (-1 for added nodes).

    Example:
        >>> j = join_forced(DraftTree.chain([5, 6]), [5, 7], 8, 8, 8)
        >>> j.tree.tokens.tolist(), j.tree.parents.tolist(), j.origin.tolist()
        ([5, 6, 7], [-1, 0, 0], [0, 1, -1])
    """
    forced = list(forced)[:max_depth]
    n = len(tree)
    origin = np.arange(n, dtype=np.int64)
    if not forced or budget <= 0:
        return Joined(tree, origin)
    children = tree.children()
    toks = tree.tokens.tolist()
    node, k = -1, 0
    while k < len(forced):
        nxt = next((c for c in children.get(node, ()) if toks[c] == forced[k]), None)
        if nxt is None:
            break
        node, k = nxt, k + 1
    add = forced[k:]
    chain = tree.path(node) if node >= 0 else []
    chain = chain + list(range(n, n + len(add)))
    if add:
        base = 1.0 if node < 0 else float(tree.scores[node])
        tokens = np.concatenate([tree.tokens, np.asarray(add, np.int64)])
        parents = np.concatenate([tree.parents, np.asarray([node] + list(range(n, n + len(add) - 1)), np.int32)])
        scores = np.concatenate([tree.scores, np.full(len(add), max(base, 1e-9))])
        # Forced tokens are worth keeping before drafted ones: the grammar allows nothing else.
        scores[n:] = np.maximum(scores[n:], scores.max() if len(scores) else 1.0)
        sources = np.concatenate([tree.sources, np.full(len(add), source, np.int16)])
        tree = DraftTree(tokens, parents, scores, sources)
        origin = np.concatenate([origin, np.full(len(add), -1, np.int64)])
    if len(tree) > budget:
        keep = _chain_first(tree, chain, budget, max_depth)
        tree, origin = tree.subset(keep), origin[keep]
    return Joined(tree, origin)


def _chain_first(tree: DraftTree, chain: list[int], budget: int, max_depth: int) -> np.ndarray:
    """``budget`` nodes: the forced chain's first, then the best others (ancestor-closed), sorted."""
    keep = list(chain[:budget])
    taken = set(keep)
    depth = tree.depth
    order = np.lexsort((np.arange(len(tree)), depth, -tree.path_scores()))
    parents = tree.parents
    for i in order.tolist():
        if len(keep) >= budget:
            break
        if i in taken or depth[i] > max_depth:
            continue
        if parents[i] < 0 or int(parents[i]) in taken:
            keep.append(i)
            taken.add(i)
    return np.sort(np.asarray(keep, np.int64))


def extend_best_leaf(tree: DraftTree, origin: np.ndarray, forced: Sequence[int], leaf: int, source: int) -> Joined:
    """``tree`` with the chain ``forced`` hung under node ``leaf`` (added nodes get origin -1).

    Example:
        >>> j = extend_best_leaf(DraftTree.chain([5, 6]), np.array([0, 1]), [7, 8], 1, 8)
        >>> j.tree.tokens.tolist(), j.tree.parents.tolist(), j.origin.tolist()
        ([5, 6, 7, 8], [-1, 0, 1, 2], [0, 1, -1, -1])
    """
    forced = list(forced)
    if not forced:
        return Joined(tree, origin)
    n = len(tree)
    base = float(tree.scores[leaf])
    tokens = np.concatenate([tree.tokens, np.asarray(forced, np.int64)])
    parents = np.concatenate([tree.parents, np.asarray([leaf] + list(range(n, n + len(forced) - 1)), np.int32)])
    scores = np.concatenate([tree.scores, np.full(len(forced), base)])
    sources = np.concatenate([tree.sources, np.full(len(forced), source, np.int16)])
    return Joined(DraftTree(tokens, parents, scores, sources),
                  np.concatenate([np.asarray(origin, np.int64), np.full(len(forced), -1, np.int64)]))


def constrain_draft(constraint: Constraint, tree: DraftTree, kept, budget: int, max_depth: int,
                    join: bool = True) -> tuple[DraftTree, np.ndarray | None]:
    """A checked draft cut to the paths the grammar allows, with its forced tokens joined.

    A sampled tree (with q) is left whole: cutting it by its drawn tokens would bias
    it, and the masked acceptance rejects a forbidden token anyway (its mass is 0).

    Args:
        constraint: the request's grammar state.
        tree, kept: the checked draft and its node ids in the drafter's proposal (``check_tree``).
        budget, max_depth: the step's limits.
        join: join the grammar's forced tokens under the root and after the best leaf (False for
            plain ``ar``, which stays one token per forward).
    Returns:
        The tree (its ids naming the proposal's nodes, -1 for forced tokens) and those ids.
    """
    from lookupdec.drafters.base import SOURCES

    if tree.sampled:
        return tree, kept
    if len(tree):
        keep = constraint.prune(tree)
        if len(keep) < len(tree):
            tree = tree.subset(keep)  # its ids still name the proposal's nodes
    base = tree.node_ids()
    if not join:
        return tree, (None if tree.ids is None else base)
    joined = join_forced(tree, constraint.forced(max_depth), SOURCES["grammar"], budget, max_depth)
    tree = joined.tree
    origin = np.where(joined.origin >= 0, base[np.maximum(joined.origin, 0)] if len(base) else -1, -1)
    # The best path's leaf continues with what the grammar forces after it (a closing quote,
    # the next key), in the budget left.
    room = budget - len(tree)
    if len(tree) and room > 0:
        depth = tree.depth
        leaves = tree.leaves()
        leaf = int(leaves[np.lexsort((-depth[leaves], -tree.path_scores()[leaves]))[0]])
        more = constraint.forced_after(tree.tokens[tree.path(leaf)].tolist(), min(room, max_depth - int(depth[leaf])))
        if more:
            ext = extend_best_leaf(tree, origin, more, leaf, SOURCES["grammar"])
            tree, origin = ext.tree, ext.origin
    origin = np.asarray(origin, np.int64)
    return tree.with_ids(origin), origin
