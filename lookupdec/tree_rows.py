"""The rows of one verify forward: their inputs and positions, the tree attention bias, the
chain fallback's path, and the top-k of computed logit rows (``lookupdec.verify`` runs them).

Layout (``W`` rows on top of ``past`` cached rows): row 0 is the root, row ``1 + i`` tree
node ``i``, then a drafter's extra rows, then padding; row ``r`` sits at position
``past + depth`` (the verify module docstring says what each row may see).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from lookupdec._native import TOPK_MAX, argmax_ptr, topk_rows_at, topk_rows_ptr
from lookupdec.tree import DraftTree

if TYPE_CHECKING:
    from lookupdec.drafters.base import ExtraRows


def longest_path(tree: DraftTree) -> DraftTree:
    """The tree's deepest root-to-leaf path as a chain (the first one on ties)."""
    if len(tree) == 0:
        return tree
    return tree.subset(longest_path_nodes(tree))


def longest_path_nodes(tree: DraftTree) -> list[int]:
    """Node indices of the tree's deepest root-to-leaf path (the first one on ties)."""
    return tree.path(int(np.argmax(tree.depth))) if len(tree) else []


def best_path_nodes(tree: DraftTree) -> list[int]:
    """Node indices of the root-to-leaf path with the most expected accepted tokens.

    A chain verified greedily yields the sum of its nodes' path scores in expectation,
    so the path kept under chain verification is the leaf's path maximising that sum
    (the deepest one among equals, then the first): not merely the deepest path, which
    may be a long run of unlikely nodes.

    Example:
        >>> t = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, 0, 1, -1]), np.array([0.2, 0.2, 0.2, 0.9]))
        >>> best_path_nodes(t), longest_path_nodes(t)
        ([3], [0, 1, 2])
    """
    n = len(tree)
    if n == 0:
        return []
    scores = tree.path_scores()
    total = np.zeros(n)
    parents = tree.parents
    for i in range(n):  # parents precede children
        p = int(parents[i])
        total[i] = scores[i] + (total[p] if p >= 0 else 0.0)
    leaves = tree.leaves()
    depth = tree.depth
    leaf = int(leaves[np.lexsort((leaves, -depth[leaves], -np.round(total[leaves], 12)))[0]])
    return tree.path(leaf)


def clip_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop the nodes deeper than ``max_depth`` (their ancestors stay)."""
    if len(tree) == 0 or max_depth >= int(tree.depth.max()):
        return tree
    if max_depth <= 0:
        return DraftTree.empty()
    return tree.subset(np.flatnonzero(tree.depth <= max_depth))


def tree_attention_bias(tree: DraftTree, past: int, width: int, dtype: torch.dtype, device,
                        extra: "ExtraRows | None" = None) -> torch.Tensor:
    """The float 4D attention bias ``(1, 1, width, past + width)`` of one verify forward.

    Args:
        tree: the draft tree; ``1 + len(tree) + len(extra) <= width``.
        past: number of cached rows.
        width: rows in the forward (root + nodes + extra rows + padding).
        extra: rows after the tree's: each sees the past, the root and the extra
            rows its ``visible`` row names.
    Returns:
        0 where a row attends, ``finfo(dtype).min`` where it does not.
    Example:
        >>> b = tree_attention_bias(DraftTree.chain([4]), past=2, width=2, dtype=torch.float32, device="cpu")
        >>> (b[0, 0] == 0).int().tolist()
        [[1, 1, 1, 0], [1, 1, 1, 1]]
    """
    n = len(tree)
    m = 0 if extra is None else len(extra)
    assert 1 + n + m <= width
    allowed = np.zeros((width, past + width), dtype=bool)
    allowed[:, : past + 1] = True  # the whole past and the root
    if n:
        allowed[1 : 1 + n, past + 1 : past + 1 + n] = tree.attention_mask()
    if m:
        lo = 1 + n
        allowed[lo : lo + m, past + lo : past + lo + m] = extra.visible
    bias = torch.zeros((1, 1, width, past + width), dtype=dtype)
    bias.masked_fill_(torch.from_numpy(~allowed), torch.finfo(dtype).min)
    return bias.to(device)


def tree_inputs(root: int, tree: DraftTree, past: int, width: int,
                extra: "ExtraRows | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and positions ``(width,)`` of one verify forward: the root at
    ``past``, node ``i`` at ``past + depth[i]``, extra row ``j`` after the
    nodes at ``past + extra.depth[j]``, padding rows repeating the root.

    Example:
        >>> ids, pos = tree_inputs(9, DraftTree.from_sequences([[5, 6], [7]]), past=3, width=4)
        >>> ids.tolist(), pos.tolist()
        ([9, 5, 6, 7], [3, 4, 5, 4])
    """
    n = len(tree)
    ids = np.full(width, root, dtype=np.int64)
    ids[1 : 1 + n] = tree.tokens
    pos = np.full(width, past, dtype=np.int64)
    pos[1 : 1 + n] += tree.depth
    if extra is not None and len(extra):
        m = len(extra)
        ids[1 + n : 1 + n + m] = extra.tokens
        pos[1 + n : 1 + n + m] += extra.depth
    return torch.from_numpy(ids), torch.from_numpy(pos)


def argmax_rows(logits: torch.Tensor) -> np.ndarray:
    """The index of the largest logit in each row of ``logits`` (the first on ties), as int64.

    A CPU float32 tensor goes through numpy: torch's ``argmax`` cost ~44 us a 49,152-long row on
    a CPU against numpy's ~4 us (2-core AMD EPYC VM, the row in cache), and an acceptance walk
    takes one a row (one row at a time: ``argmax_row``, which skips numpy's wrapping too). Anything
    else stays with torch.

    Args:
        logits: ``(vocab,)`` or ``(R, vocab)``.
    Returns:
        ``()`` or ``(R,)`` int64.
    Example:
        >>> argmax_rows(torch.tensor([[0.0, 2.0, 2.0], [3.0, 1.0, 0.0]])).tolist()
        [1, 0]
    """
    if logits.is_cpu and logits.dtype == torch.float32:
        return np.asarray(logits.numpy().argmax(-1), np.int64)
    return logits.argmax(-1).cpu().numpy().astype(np.int64)


def argmax_row(logits: torch.Tensor) -> int:
    """``argmax_rows`` of one ``(vocab,)`` row, as an int.

    A contiguous CPU float32 row is read at its address by one native call with numpy's rule (the
    first maximum, the first NaN if any; ``ext/csrc/rowexp.c``): wrapping it in a numpy array cost
    more than the argmax itself right after a forward (``.numpy()`` ~22-30 us, numpy's argmax ~19-25
    us on a row fresh from ``lm_head``, measured on a 2-core AMD EPYC VM with AVX-512), and a plain
    step makes one such call, an acceptance walk one a row.
    """
    if logits.is_cpu and logits.dtype == torch.float32 and logits.stride() == (1,):
        return argmax_ptr(logits.data_ptr(), logits.shape[0])
    return int(argmax_rows(logits))


def topk_rows(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` ids and probabilities (softmax of the raw logits) of each row of ``logits``.

    Computed where ``logits`` lives; only the ``(R, k)`` results are copied to the CPU. On a CPU, float32
    rows and k up to ``TOPK_MAX`` take one native call (equal values: the lower id first); elsewhere torch's
    ``topk`` and ``logsumexp``.

    Args:
        logits: ``(R, vocab)``.
        k: how many; more than the vocabulary gives the whole vocabulary.
    Returns:
        int64 ids and float32 probabilities, both ``(R, k)``, most likely first.
    Example:
        >>> ids, probs = topk_rows(torch.tensor([[0.0, 2.0, 1.0]]), 2)
        >>> ids.tolist(), [round(p, 3) for p in probs[0].tolist()]
        ([[1, 2]], [0.665, 0.245])
    """
    k = min(int(k), logits.shape[-1])
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and 1 <= k <= TOPK_MAX:
        # Native passes for the top-k and the sum (ext/csrc/topk.c): 3-4x faster than torch's on a CPU.
        x = logits.contiguous()
        ids = np.empty((x.shape[0], k), np.int64)
        probs = np.empty((x.shape[0], k), np.float32)
        topk_rows_ptr(x.data_ptr(), x.shape[0], x.shape[1], k, ids.ctypes.data, probs.ctypes.data)
        return ids, probs
    vals, ids = torch.topk(logits.float(), k, dim=-1)
    probs = torch.exp(vals - torch.logsumexp(logits.float(), dim=-1, keepdim=True))
    return ids.cpu().numpy().astype(np.int64), probs.cpu().numpy().astype(np.float32)


def topk_of_rows(rows: Sequence[torch.Tensor], k: int) -> tuple[np.ndarray, np.ndarray]:
    """``topk_rows`` of separate ``(vocab,)`` rows, as if stacked.

    CPU float32 rows are read where they lie, one native call each: stacking them first copied
    every row once more (~60 us a step for Token Recycling's few rows, 2-core AMD EPYC VM).

    Example:
        >>> ids, _ = topk_of_rows([torch.tensor([0.0, 2.0, 1.0]), torch.tensor([5.0, 0.0, 1.0])], 1)
        >>> ids.tolist()
        [[1], [0]]
    """
    if not rows:
        return np.zeros((0, max(int(k), 0)), np.int64), np.zeros((0, max(int(k), 0)), np.float32)
    n = rows[0].shape[-1]
    k = min(int(k), n)
    if 1 <= k <= TOPK_MAX and all(r.is_cpu and r.dtype == torch.float32 and r.dim() == 1 and r.shape[0] == n
                                  and r.is_contiguous() for r in rows):
        return topk_rows_at([r.data_ptr() for r in rows], n, k)  # one native call for all the rows
    return topk_rows(torch.stack(list(rows)), k)
