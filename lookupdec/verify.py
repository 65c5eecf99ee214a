"""Verify a DraftTree with one forward pass of the target, then accept a path.

Layout of one verify forward (``W`` rows on top of ``past`` cached rows):

- row 0 is the root (the last committed token, not yet in the cache);
- row ``1 + i`` is tree node ``i``;
- rows ``1 + n .. 1 + n + m - 1`` are a drafter's extra rows (``ExtraRows``,
  e.g. Lookahead's Jacobi window), if any;
- the remaining rows up to ``W - 1`` are padding (the width is rounded up to a multiple of
  ``pad_multiple``, because transformers' oneDNN/MKL matrix products are slow
  for odd widths); they attend to the past and the root only and their outputs are
  discarded.

Position of row ``r`` is ``past + depth`` (the root has depth 0). The float
attention bias is 0 where a row may attend and the dtype's minimum elsewhere:
every row sees the whole past and the root, a node also sees itself and its
ancestors. With these, every node's logits equal those of its root-to-node
chain run causally (tested in tests/test_verify.py). An extra row sees the
past, the root and the extra rows its ``visible`` row names, never a tree
node, and no tree node sees it: tree rows' logits are the same with or
without extra rows (up to the float rounding of the wider products), and
the commit keeps only the root's and accepted nodes' rows, never extra ones.

On request (``topk > 0``) the result gives the top-k ids and probabilities
(softmax of the raw logits) of verified rows, deferred (``VerifyResult.topk_of``):
after the acceptance walk, over the rows it computed, so Token Recycling's
top-k adds no ``lm_head`` row (on the embedded model, ``lm_head`` over 32 rows
cost ~10 ms against ~4 ms over the ~7 a walk needs). The argmax of each extra
row comes with the forward.

Tree masks need an attention implementation that takes a custom 4D mask:
``sdpa`` and ``eager`` do (transformers passes a 4D mask through unchanged);
others (flash attention, linear attention, sliding-window layers) get chain
verification: the tree is cut to its longest root-to-leaf path and verified
with the ordinary causal mask. The choice is made from the model's config
(``supports_tree_mask``), once per model.

Two backends run the forward: transformers' own model forward (``hf``: any
model, any device), and, when asked with ``fast=True`` and the model
qualifies (a Llama-family float32 model on the CPU), the lean forward of
``lookupdec.fast_forward`` (``fast``) with its own flat KV cache. Every call
of one verifier (prefill, plain steps, tree steps) goes through the same
backend, so plain decoding and tree decoding share their kernels.

The fast backend computes ``lm_head`` lazily (``LazyLogits``): the root's and
the most likely path's rows in the forward, any other row only when the
acceptance walk visits it; transformers' backend returns every row.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import time
from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np
import torch

from lookupdec.batch_cache import padded_forward
from lookupdec.fast_steps import plain_step, tree_step
from lookupdec.accept import Acceptance, greedy_accept, main_path, sample_accept  # noqa: F401  (re-exported)
from lookupdec.logit_rows import LazyLogits, subtree  # noqa: F401  (re-exported)
from lookupdec.fast_forward_support import fast_forward_unsupported_reason, supports_fast_forward
from lookupdec.kvcache import all_full_attention, check_kv_dtype, keep_rows, new_cache, uniform_layers, with_cache
from lookupdec.inference import inference
from lookupdec.release import held_parameter
from lookupdec.tree import DraftTree
from lookupdec.tree_rows import (argmax_rows, best_path_nodes, clip_depth, longest_path, longest_path_nodes,  # noqa: F401
                                 topk_of_rows, topk_rows, tree_attention_bias, tree_inputs)  # (re-exported)
from lookupdec.drafters.base import VerifierSignals

if TYPE_CHECKING:
    from lookupdec.drafters.base import ExtraRows

_TREE_MASK_ATTENTION = ("sdpa", "eager")


def supports_tree_mask(model) -> bool:
    """Whether ``model`` verifies a tree in one pass (else: chain verification).

    True when its attention implementation takes a custom 4D float mask
    (``sdpa`` or ``eager``) and every layer is full attention.
    """
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    return impl in _TREE_MASK_ATTENTION and all_full_attention(model.config)


@dataclass(frozen=True)
class VerifyResult(VerifierSignals):
    """Logits of one verify forward, and its signals (``VerifierSignals``, shared with ``StepOutcome``).

    Attributes:
        rows: the logit rows, computed on use (row 0 for the root, row ``1 + i`` for node ``i``).
        tree: the tree actually verified (its best-scored path under chain verification,
            ``best_path_nodes``).
        kept: for each node of ``tree``, its index in the tree passed to ``forward``
            (None: the same tree, nothing cut).
        row_tokens, topk_ids, topk_probs: left empty by ``forward``: the top-k asked for is
            deferred (``signals()``/``topk_of``), so it costs no ``lm_head`` row beyond those
            the acceptance walk computes.
        extra_argmax: int64 ``(m,)`` argmax of each extra row (empty without extra rows).
        topk: top-k per row the caller asked for (0: none): ``topk_of`` gives it.
        root: the root token (row 0's input).
    """

    rows: LazyLogits
    tree: DraftTree
    kept: np.ndarray | None = None
    topk: int = 0
    root: int = -1

    def signals(self) -> VerifierSignals:
        """The step's signals for the drafter: the deferred top-k of the rows computed so far
        (``topk_of()``; after the acceptance walk, the rows it visited) and the extra rows' argmax.

        Example:
            >>> res = VerifyResult(LazyLogits.of(torch.tensor([[0.0, 2.0, 1.0]])), DraftTree.empty(), topk=1, root=7)
            >>> _ = res.row(0)  # the walk computed row 0
            >>> res.signals().topk_ids.tolist()
            [[1]]
        """
        if self.topk <= 0:
            return VerifierSignals(extra_argmax=self.extra_argmax)
        row_tokens, ids, probs = self.topk_of()
        return VerifierSignals(row_tokens=row_tokens, topk_ids=ids, topk_probs=probs, extra_argmax=self.extra_argmax)

    def topk_of(self, rows=None, k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Deferred top-k: the input token, top-k ids and probabilities of ``rows``.

        Args:
            rows: row indices (0 = root, ``1 + i`` = node ``i``); None: the rows computed so
                far (after an acceptance walk: the rows it visited, no ``lm_head`` row more).
            k: how many per row (default: the ``topk`` asked for in the forward).
        Returns:
            ``(row_tokens (R,), ids (R, k), probs (R, k))``, rows ascending; empty when k is 0.
        Example:
            >>> res = VerifyResult(LazyLogits.of(torch.tensor([[0.0, 2.0, 1.0]])), DraftTree.empty(), topk=1, root=7)
            >>> [a.tolist() for a in res.topk_of()[:2]]
            [[7], [[1]]]
        """
        k = self.topk if k is None else int(k)
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.int64), np.zeros((0, 0), np.float32)
        if rows is None:
            rows = self.rows.computed_rows()  # (computed: nothing to prefetch)
        else:
            rows = sorted(int(r) for r in rows)
            self.rows.prefetch(rows)
        ids, probs = topk_of_rows([self.rows.row(r) for r in rows], k)
        node_tokens = self.tree.tokens
        tokens = np.array([int(self.root) if r == 0 else int(node_tokens[r - 1]) for r in rows], np.int64)
        return tokens, ids, probs

    @property
    def logits(self) -> torch.Tensor:
        """All ``(1 + n, vocab)`` logits (computes every missing row)."""
        return self.rows.full()

    def row(self, r: int) -> torch.Tensor:
        """Logits ``(vocab,)`` of row ``r`` (0 = root, ``1 + i`` = node ``i``)."""
        return self.rows.row(r)


@dataclass(frozen=True)
class VerifyItem:
    """One sequence's part of a batched verify forward (``TreeVerifier.forward_batch``).

    Attributes:
        cache, past: the sequence's own cache and committed length.
        root: its last committed token.
        tree: its draft.
        extra: its drafter's extra rows, or None.
        topk: top-k per tree row it asks for (0: none).
    """

    cache: object
    past: int
    root: int
    tree: DraftTree
    extra: "ExtraRows | None" = None
    topk: int = 0


class TreeVerifier:
    """Runs verify forwards of one model and commits accepted rows to its cache.

    Args:
        model: a transformers causal LM.
        tree_masks: verify whole trees (True), only the best-scored path (False),
            or decide from the model's attention implementation (None).
        pad_multiple: round widths above 1 up to a multiple of this; None =
            4 for transformers' forward (its oneDNN/MKL products are slow for
            odd widths), 1 for the fast forward (its cost grows linearly with
            the width, so padding only adds work).
        fast: use the lean CPU forward (``lookupdec.fast_forward``) when the
            model qualifies; otherwise (and when False) transformers' forward.
        release: let the fast forward free the model's own linear weights once
            packed (only for a model nothing else uses; see ``FastForward``).
        weights, blocks, kv_dtype: the fast forward's weight format (``WEIGHT_FORMATS``), the file's
            quantized blocks (None: recovered) and KV cache elements (see ``FastForward``);
            transformers' forward ignores the first two and takes only kv_dtype "float32".

    Attributes:
        backend: "fast" or "hf", the forward actually used.
    """

    def __init__(self, model, *, tree_masks: bool | None = None, pad_multiple: int | None = None, fast: bool = False,
                 release: bool = False, weights: str = "float32", blocks=None, kv_dtype: str = "float32") -> None:
        self.model = model
        self.fast = None
        if fast:
            from lookupdec.fast_forward import FastForward

            if supports_fast_forward(model):
                self.fast = FastForward(model, release=release, weights=weights, blocks=blocks, kv_dtype=kv_dtype)
        if self.fast is None:  # transformers' forward: its own float32 cache only
            check_kv_dtype(kv_dtype, (fast and fast_forward_unsupported_reason(model)) or "hf_kernels=True")
        self.backend = "hf" if self.fast is None else "fast"
        if tree_masks is None:
            # The fast forward takes a float bias on every supported model.
            tree_masks = True if self.fast is not None else supports_tree_mask(model)
        self.tree_masks = bool(tree_masks)
        if pad_multiple is None:
            pad_multiple = 4 if self.fast is None else 1
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
        self.pad_multiple = int(pad_multiple)
        param = held_parameter(model)
        self.device, self.dtype = param.device, param.dtype

    @property
    def pads_batches(self) -> bool:
        """Whether ``forward_batch`` pads every sequence to the widest one's rows (transformers'
        padded batch; the fast forward's batch has no padding, chain verification no batch)."""
        return self.fast is None and self.tree_masks

    def new_cache(self, capacity: int):
        """An empty KV cache for this verifier's backend, for up to ``capacity`` rows (it grows)."""
        if self.fast is not None:
            return self.fast.new_cache(capacity)
        return new_cache(self.model.config, capacity)

    def width(self, n_nodes: int) -> int:
        w = 1 + n_nodes
        if w > 1 and w % self.pad_multiple:
            w += self.pad_multiple - w % self.pad_multiple
        return w

    @inference
    def prefill(self, cache, prompt_ids: list[int]) -> torch.Tensor:
        """Run the prompt into the cache; return the last row's logits ``(vocab,)``.

        The cache is empty, or (the fast forward only) already holds the rows of the prompt's first
        ``cache.length`` tokens (a prefix reused by ``lookupdec.prefix_cache``): then only the rest runs.
        """
        if self.fast is not None:
            n, past = len(prompt_ids), cache.length
            if not past < n:
                raise ValueError(f"a prefill needs a prompt token beyond the cache's {past} rows, got {n} tokens")
            ids = torch.tensor(prompt_ids[past:], dtype=torch.long)
            return self.fast.forward(cache, ids, torch.arange(past, n), None, [n - past - 1], causal=True)[0]
        if cache.get_seq_length():
            raise ValueError("transformers' forward prefills an empty cache only")
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, **with_cache(self.model, cache), use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    @inference
    def forward(self, cache, past: int, root: int, tree: DraftTree, extra: "ExtraRows | None" = None,
                topk: int = 0) -> VerifyResult:
        """One forward over ``[root] + tree (+ extra rows)`` on top of ``past`` cached rows.

        Afterwards the cache holds ``past + width`` rows; call ``commit`` next.

        Args:
            cache, past: the sequence's cache and its committed length.
            root: the last committed token (row 0).
            tree: the draft (rows ``1 .. n``).
            extra: rows after the tree's, never seen by tree rows and never
                committed; their argmax come back in ``extra_argmax``.
            topk: when > 0, the top-k asked for, given by ``VerifyResult.topk_of`` (deferred).
        Raises:
            ValueError: extra rows under chain verification (they need a custom mask).
        """
        if extra is not None and not len(extra):
            extra = None
        if extra is not None and not self.tree_masks:
            raise ValueError("extra rows need tree masks; this verifier verifies chains (tree_masks=False)")
        if not self.tree_masks and len(tree):
            kept = np.asarray(best_path_nodes(tree), np.int64)
            if len(kept) < len(tree):
                res = self.forward(cache, past, root, tree.subset(kept), topk=topk)
                return replace(res, kept=kept)
        n = len(tree)
        m = 0 if extra is None else len(extra)
        if self.fast is not None:
            return self._fast_forward(cache, past, root, tree, extra, topk)
        if n == 0 and m == 0:
            # Plain decoding step: exactly what transformers' generate() runs.
            ids = torch.tensor([[root]], dtype=torch.long, device=self.device)
            pos = torch.tensor([[past]], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, position_ids=pos, **with_cache(self.model, cache), use_cache=True)
            return self._result(LazyLogits.of(out.logits[0]), tree, root, None, topk)
        is_chain = not self.tree_masks
        width = (1 + n) if is_chain else self.width(n + m)
        ids, pos = tree_inputs(root, tree, past, width, extra)
        ids_t, pos_t = ids.to(self.device).unsqueeze(0), pos.to(self.device).unsqueeze(0)
        if is_chain:
            mask = None  # the ordinary causal mask is the chain's tree mask
        else:
            mask = tree_attention_bias(tree, past, width, self.dtype, self.device, extra)
        keep = 0 if width == 1 + n + m else torch.arange(1 + n + m, device=self.device)
        out = self.model(input_ids=ids_t, position_ids=pos_t, attention_mask=mask, **with_cache(self.model, cache),
                         use_cache=True, logits_to_keep=keep)
        logits = out.logits[0, : 1 + n + m]
        return self._result(LazyLogits.of(logits[: 1 + n]), tree, root, logits[1 + n:] if m else None, topk)

    def _result(self, rows: LazyLogits, tree: DraftTree, root: int, extra_logits: torch.Tensor | None,
                topk: int) -> VerifyResult:
        """A VerifyResult with the extra rows' argmax; the top-k asked for is deferred (``topk_of``)."""
        res = VerifyResult(rows, tree, topk=max(int(topk), 0), root=int(root))
        if extra_logits is not None:
            res = replace(res, extra_argmax=argmax_rows(extra_logits))
        return res

    def _fast_forward(self, cache, past: int, root: int, tree: DraftTree, extra: "ExtraRows | None",
                      topk: int) -> VerifyResult:
        n = len(tree)
        m = 0 if extra is None else len(extra)
        assert cache.length == past, (cache.length, past)
        if n == 0 and m == 0:
            # Plain step: one row attends to the whole cache and itself, no mask needed. Its
            # lm_head is timed apart, as a tree step's is: the cost model fits the forward's body
            # and lm_head separately, and a plain step's body taken with its lm_head (~2.3 of 8.7
            # ms here) made the first draft row look a quarter as dear as it is.
            logits, head_s = plain_step(self.fast, cache, root, past)
            rows = LazyLogits.of(logits)
            rows.compute_s = head_s
            return self._result(rows, tree, root, None, topk)
        width = self.width(n + m)
        fast = self.fast
        # One lm_head product for the rows needed now: the root and the most likely path
        # (the rows a walk that stays on that path needs; other rows only if the walk leaves
        # it), plus the extra rows. A top-k asked for is taken later from the rows the walk
        # computed (``VerifyResult.topk_of``): it costs no row more.
        want = [0] + [1 + i for i in main_path(tree)]
        hidden, out, head_s = tree_step(fast, cache, root, tree, extra, width, want + list(range(1 + n, 1 + n + m)))
        rows = LazyLogits(1 + n, tree, lambda idx: fast.logits(hidden.index_select(0, idx)))
        rows.compute_s += head_s
        rows.store(want, out[: len(want)])
        return self._result(rows, tree, root, out[len(want):] if m else None, topk)

    @inference
    def forward_batch(self, items: "Seq[VerifyItem]") -> list[VerifyResult]:
        """Several sequences' verify forwards as one (continuous batching).

        On the fast backend every linear product runs once over the rows of all the items
        and attention runs per sequence over its own cache (``FastForward.forward_batch``):
        each row sees only its own sequence's past, its root and its tree ancestors (and an
        extra row the rows its ``visible`` names), so every item's result equals its own
        ``forward`` up to the float rounding of the wider products. The first ``lm_head``
        product is shared too. On transformers' backend the items run as one padded batch
        (``lookupdec.batch_cache.BatchView``: each sequence's cached rows copied into the batch's
        cache, its new rows written back to its own), with the same isolation; under chain
        verification (no 4D masks), or where a cache's layers differ in shape, they run one
        after another.

        Args:
            items: one ``VerifyItem`` per sequence, each with its own cache.
        Returns:
            One ``VerifyResult`` per item, in order; afterwards call ``commit`` per item.
        Raises:
            ValueError: the same cache in two items; extra rows under chain verification.

        Example:
            >>> res = verifier.forward_batch([VerifyItem(c1, p1, r1, t1), VerifyItem(c2, p2, r2, t2)])  # doctest: +SKIP
        """
        items = list(items)
        if len({id(it.cache) for it in items}) != len(items):
            raise ValueError("forward_batch got the same cache in two items; every sequence needs its own")
        # transformers' forward batches only under tree masks (4D masks) and over caches whose layers stack.
        if len(items) <= 1 or (self.fast is None and not (self.pads_batches and
                                                          all(uniform_layers(it.cache) for it in items))):
            return [self.forward(it.cache, it.past, it.root, it.tree, extra=it.extra, topk=it.topk) for it in items]
        prepared = []
        for it in items:
            extra = it.extra if it.extra is not None and len(it.extra) else None
            if extra is not None and not self.tree_masks:
                raise ValueError("extra rows need tree masks; this verifier verifies chains (tree_masks=False)")
            tree, kept = it.tree, None
            if not self.tree_masks and len(tree):
                nodes = np.asarray(best_path_nodes(tree), np.int64)
                if len(nodes) < len(tree):
                    tree, kept = tree.subset(nodes), nodes
            assert it.cache.get_seq_length() == it.past, (it.cache.get_seq_length(), it.past)
            prepared.append((it, tree, kept, extra))
        if self.fast is None:
            return self._hf_forward_batch(prepared)
        ids_list, pos_list, bias_list = [], [], []
        for it, tree, _, extra in prepared:
            n, m = len(tree), 0 if extra is None else len(extra)
            if n == 0 and m == 0:
                ids_list.append(torch.tensor([it.root]))
                pos_list.append(torch.tensor([it.past]))
                bias_list.append(None)
                continue
            width = self.width(n + m)
            ids, pos = tree_inputs(it.root, tree, it.past, width, extra)
            ids_list.append(ids)
            pos_list.append(pos)
            bias_list.append(tree_attention_bias(tree, it.past, width, torch.float32, "cpu", extra)[0, 0])
        fast = self.fast
        hiddens = fast.forward_batch([it.cache for it, *_ in prepared], ids_list, pos_list, bias_list)
        # One lm_head product for the rows every item needs now (as in ``_fast_forward``).
        wants, picks = [], []
        for (it, tree, _, extra), hidden in zip(prepared, hiddens):
            n, m = len(tree), 0 if extra is None else len(extra)
            want = [0] if n == 0 else [0] + [1 + i for i in main_path(tree)]
            wants.append(want)
            picks.append(hidden.index_select(0, torch.tensor(want + list(range(1 + n, 1 + n + m)))))
        t = time.perf_counter()
        out = fast.logits(torch.cat(picks))
        share = (time.perf_counter() - t) / max(out.shape[0], 1)
        results, at = [], 0
        for (it, tree, kept, extra), hidden, want, pick in zip(prepared, hiddens, wants, picks):
            n, m = len(tree), 0 if extra is None else len(extra)
            mine = out[at:at + pick.shape[0]]
            at += pick.shape[0]
            if n == 0 and m == 0:
                rows = LazyLogits.of(mine)
            else:
                rows = LazyLogits(1 + n, tree, lambda idx, h=hidden: fast.logits(h.index_select(0, idx)))
                rows.store(want, mine[: len(want)])
            rows.compute_s += share * pick.shape[0]
            res = self._result(rows, tree, it.root, mine[len(want):] if m else None, it.topk)
            results.append(res if kept is None else replace(res, kept=kept))
        return results

    def _hf_forward_batch(self, prepared) -> list[VerifyResult]:
        """transformers' forward over every item at once (``batch_cache.padded_forward``); under tree
        masks no tree was cut, so no result carries ``kept``."""
        shapes = [(len(tree), 0 if extra is None else len(extra)) for _, tree, _, extra in prepared]
        logits = padded_forward(self.model, [(it.cache, it.past, it.root, tree, extra) for it, tree, _, extra in prepared],
                                [1 if n + m == 0 else self.width(n + m) for n, m in shapes], self.dtype, self.device)
        return [self._result(LazyLogits.of(rows[: 1 + n]), tree, it.root, rows[1 + n: 1 + n + m] if m else None, it.topk)
                for (it, tree, _, _), (n, m), rows in zip(prepared, shapes, logits)]

    @inference
    def commit(self, cache, past: int, nodes: tuple[int, ...]) -> None:
        """Keep the root's and the accepted nodes' rows; drop the rest."""
        keep_rows(cache, past, [past] + [past + 1 + i for i in nodes])
