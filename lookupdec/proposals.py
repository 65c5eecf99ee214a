"""What a drafter hands the decoder, checked before it reaches the verifier.

A drafter's tree must be a ``DraftTree`` of ids in the model's vocabulary; a
sampled tree must carry ``q`` and is cut only by its shape; a window must be
``ExtraRows`` of ids in the vocabulary. Anything else is a ``DraftError``
naming the drafter, never a crash inside the forward.
"""
from __future__ import annotations

import numpy as np

from lookupdec.drafters.base import DraftRequest, Drafter, ExtraRows
from lookupdec.errors import DraftError
from lookupdec.tree import DraftTree


def _name(drafter) -> str:
    return drafter.name if isinstance(drafter, Drafter) else str(drafter)


def check_tree(drafter, tree, vocab_size: int, budget: int, max_depth: int,
               tree_masks: bool) -> tuple[DraftTree, np.ndarray | None]:
    """The proposal cut to ``budget`` nodes and ``max_depth``, with its nodes' ids in the proposal (None: uncut).

    The returned tree's ``ids`` (``DraftTree.node_ids()``) are those same ids, so every
    later cut (the verifier's chain fallback, a batch's shared budget) still names
    the proposal's nodes.

    Args:
        drafter: the drafter that proposed ``tree`` (named in errors).
        tree: its proposal.
        vocab_size: ids must lie in ``[0, vocab_size)``.
        budget, max_depth: the step's request.
        tree_masks: whether the verifier verifies whole trees (else its best-scored path, ``best_path_nodes``).
    Raises:
        DraftError: not a DraftTree, an id outside the vocabulary, a sampled tree
            without q or over budget.
    Example:
        >>> check_tree("d", DraftTree.chain([5, 6, 7]), 10, budget=2, max_depth=5, tree_masks=True)[1]
        array([0, 1])
    """
    if not isinstance(tree, DraftTree):
        raise DraftError(f"drafter {_name(drafter)!r} returned {type(tree).__name__}, not a DraftTree")
    # Provenance is counted from the proposal: the drafter's own numbering (a merging drafter
    # may return a cut of a larger tree; its nodes are still numbered as it returned them).
    tree = tree.with_ids(None)
    if tree.sampled and tree.q is None:
        raise DraftError(f"drafter {_name(drafter)!r} proposed a sampled tree without q, the distributions its "
                         "tokens were drawn from; exact acceptance needs them: set DraftTree.q, or draft "
                         "deterministic nodes")
    n = len(tree)
    # Builtins over plain ints: numpy's reductions cost ~30 us each right after a forward.
    if n:
        toks = tree.tokens.tolist()
        hi, lo = max(toks), min(toks)
        if hi >= vocab_size or lo < 0:
            raise DraftError(f"drafter {_name(drafter)!r} proposed token id {hi if hi >= vocab_size else lo}, "
                             f"outside the model's vocabulary [0, {vocab_size}); check that its datastore or "
                             "references were tokenized with this model's tokenizer")
    if tree.sampled and n:
        return _cut_sampled(drafter, tree, budget, max_depth, tree_masks)
    if n <= budget and (n == 0 or max(tree.depth.tolist()) <= max_depth):
        return tree, None
    kept = tree.best(budget, max_depth)
    return tree.subset(kept), kept


def _cut_sampled(drafter, tree: DraftTree, budget: int, max_depth: int, tree_masks: bool):
    """A sampled tree, cut only by its shape, never by its drawn tokens' scores (that would bias them).

    Without tree masks the verifier would keep the tree's best-scored path, whose choice
    can depend on drawn tokens; the path of first children is taken here instead.
    """
    if len(tree) > budget:
        raise DraftError(f"drafter {_name(drafter)!r} proposed a sampled tree of {len(tree)} nodes for a budget "
                         f"of {budget}; a cut chosen after its tokens were drawn could bias the output, so a "
                         "sampling drafter must respect the request's budget")
    keep = np.flatnonzero(tree.depth <= max_depth)
    if not tree_masks:
        first: dict[int, int] = {}
        for i, p in enumerate(tree.parents.tolist()):
            first.setdefault(p, i)
        path, node = [], -1
        while node in first:
            node = first[node]
            path.append(node)
        keep = np.intersect1d(keep, np.array(path, np.int64))
    if len(keep) == len(tree):
        return tree, None
    return tree.subset(keep), keep.astype(np.int64)


def check_window(drafter: Drafter, request: DraftRequest, vocab_size: int) -> ExtraRows | None:
    """The drafter's extra rows for this step, checked; None when it has none.

    Not asked for unless ``request.extra_rows`` (never under chain verification: extra
    rows need a custom mask).

    Raises:
        DraftError: not ExtraRows, or an id outside the vocabulary.
    """
    if not request.extra_rows:
        return None
    extra = drafter.window(request)
    if extra is None or not len(extra):
        return None
    if not isinstance(extra, ExtraRows):
        raise DraftError(f"drafter {_name(drafter)!r} window() returned {type(extra).__name__}, not ExtraRows")
    top = max(extra.tokens.tolist())
    if top >= vocab_size:
        raise DraftError(f"drafter {_name(drafter)!r} window() has token id {top}, outside "
                         f"the model's vocabulary [0, {vocab_size})")
    return extra


def topk_of(drafter: Drafter) -> int:
    """How many top-k candidates per verified row the drafter asks for (0: none)."""
    return max(int(drafter.topk or 0), 0)
