"""The drafter interface: the request says what the verifier runs, the chain fallback keeps the
best-scored path, every drafter subclasses ``Drafter``, and drafting state is per decoder."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec import Decoder
from lookupdec.drafters.base import DraftRequest, Drafter, ExtraRows, NoDrafter, as_drafter
from lookupdec.drafters.state import DrafterState
from lookupdec.methods import METHODS
from lookupdec.tree import DraftTree
from lookupdec.verify import TreeVerifier, best_path_nodes
from tests.conftest import tiny_loaded, tiny_model

PROMPT = "the cat the cat the cat"  # without the chat template: the tiny model does not stop at once


def _random_tree(rng, n: int) -> DraftTree:
    parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)], np.int32) if n else np.zeros(0, np.int32)
    # Scores on a coarse grid: equal path sums happen, so the tie rules are exercised.
    scores = rng.integers(1, 5, n) / 4.0
    return DraftTree(rng.integers(3, 100, n), parents, scores)


def _best_path_reference(tree: DraftTree) -> list[int]:
    """Slow oracle: every leaf's root-to-leaf path, scored by the sum of its nodes' path scores;
    the best sum wins, then the deepest path, then the first leaf."""
    scores = tree.path_scores()
    parents = tree.parents.tolist()
    best = None
    for leaf in range(len(tree)):
        if leaf in parents:
            continue  # not a leaf
        path, i = [], leaf
        while i >= 0:
            path.append(i)
            i = parents[i]
        path.reverse()
        key = (-round(float(sum(scores[j] for j in path)), 12), -len(path), leaf)
        if best is None or key < best[0]:
            best = (key, path)
    return best[1] if best else []


def test_best_path_equals_the_brute_force_choice_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = _random_tree(rng, int(rng.integers(0, 12)))
        assert best_path_nodes(tree) == _best_path_reference(tree)


def test_best_path_is_not_the_deepest_when_a_shallow_branch_is_likelier():
    # Three unlikely nodes in a row against one likely node: keep the likely one.
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, 0, 1, -1]), np.array([0.1, 0.1, 0.1, 0.9]))
    assert best_path_nodes(tree) == [3]
    # Equal sums: the deeper path.
    tie = DraftTree(np.array([5, 6, 8]), np.array([-1, 0, -1]), np.array([0.5, 0.5, 1.0]))
    assert best_path_nodes(tie) == [0, 1]


def test_the_chain_verifier_verifies_the_best_scored_path():
    model = tiny_model(7)
    verifier = TreeVerifier(model, fast=True, tree_masks=False)
    tree = DraftTree(np.array([40, 41, 42, 50]), np.array([-1, 0, 1, -1]), np.array([0.1, 0.1, 0.1, 0.9]))
    cache = verifier.new_cache(16)
    verifier.prefill(cache, [5, 6, 7])
    res = verifier.forward(cache, 3, 8, tree)
    assert res.kept.tolist() == [3] and res.tree.tokens.tolist() == [50]
    # Extra rows cannot run under chain verification: refused, not silently dropped.
    with pytest.raises(ValueError, match="tree masks"):
        verifier.forward(cache, 3, 8, DraftTree.empty(), extra=_one_extra_row())


def test_a_request_says_tree_or_chain_and_whether_extra_rows_may_run():
    assert DraftRequest(8, 10).tree and DraftRequest(8, 10).extra_rows  # tree verifier: both
    chain = DraftRequest(8, 10, tree=False)
    assert chain.extra_rows is False  # extra rows need tree masks
    assert DraftRequest(8, 10, tree=True, extra_rows=False).extra_rows is False
    with pytest.raises(ValueError, match="chain"):
        DraftRequest(8, 10, tree=False, extra_rows=True)
    sub = chain.sub(3)
    assert (sub.budget, sub.max_depth, sub.tree, sub.extra_rows) == (3, 10, False, False)


class _Spy(Drafter):
    """Records the requests it gets and proposes a branching tree with a window."""

    name = "spy"

    def __init__(self):
        self.requests, self.windows = [], 0

    def propose(self, request):
        self.requests.append(request)
        return DraftTree(np.array([40, 41, 42]), np.array([-1, -1, 1]), np.array([0.9, 0.5, 0.4]))

    def window(self, request):
        self.windows += 1
        return _one_extra_row()

    def window_rows(self):
        return 1


@pytest.mark.parametrize("tree_masks", [True, False])
def test_the_decoder_tells_drafters_what_its_verifier_runs(tree_masks):
    dec = Decoder(tiny_loaded(0), hf_kernels=not tree_masks, tree_masks=tree_masks)
    spy = _Spy()
    res = dec.generate("abcabc", drafter=spy, max_new_tokens=6, chat_template=False)
    ar = dec.generate("abcabc", method="ar", max_new_tokens=6, chat_template=False)
    assert res.token_ids == ar.token_ids
    assert spy.requests and all(r.tree is tree_masks and r.extra_rows is tree_masks for r in spy.requests)
    # The window is asked for only where extra rows can run.
    assert (spy.windows > 0) is tree_masks


def test_auto_prices_a_chain_when_the_request_says_chain(monkeypatch):
    from lookupdec.costs import CostCurve
    from lookupdec.drafters.auto import AutoDrafter
    from lookupdec.pricing import CostModel

    # A flat curve held fixed (no correction from this machine's step times): drafting pays,
    # so the proposals below are not empty by chance of the timing.
    monkeypatch.setattr(CostModel, "observe", lambda self, timing: None)
    flat = CostCurve((1, 64), (10.0, 10.5), 0, (0.0, 0.0), "test", "flat")
    dec = Decoder(tiny_loaded(0), hf_kernels=True, tree_masks=False, cost_curve=flat)
    seen = []
    original = AutoDrafter.propose

    def spy(self, request):
        tree = original(self, request)
        seen.append((request.tree, tree))
        return tree

    monkeypatch.setattr(AutoDrafter, "propose", spy)
    res = dec.generate(PROMPT, method="auto", max_new_tokens=24, chat_template=False)
    assert res.token_ids == dec.generate(PROMPT, method="ar", max_new_tokens=24, chat_template=False).token_ids
    assert seen and all(tree_flag is False for tree_flag, _ in seen)
    for _, tree in seen:  # every proposal is one chain: nothing priced that will not run
        assert tree.parents.tolist() == list(range(-1, len(tree) - 1))
    assert any(len(t) for _, t in seen)  # and it did draft


def test_every_method_subclasses_drafter_and_the_defaults_are_none(tmp_path):
    from lookupdec.drafters.base import _Wrapped

    dec = Decoder(tiny_loaded(0), history=tmp_path / "h")
    inputs = {"llma": {"references": ["the cat sat"]}}
    built = {m: dec.new_sequence(PROMPT, method=m, **inputs.get(m, {})).drafter
             for m in METHODS if m not in ("rest", "draft")}  # rest needs an index, draft a draft model
    assert len(built) == len(METHODS) - 2
    for m, drafter in built.items():  # a Drafter subclass, not a wrapped stranger
        assert isinstance(drafter, Drafter) and not isinstance(drafter, _Wrapped), m
    d = NoDrafter()
    assert d.topk == 0 and d.window(DraftRequest(4, 4)) is None and d.window_rows() == 0
    assert len(d.propose(DraftRequest(4, 4))) == 0


def test_a_plain_object_is_wrapped_with_the_default_hooks_and_an_incomplete_one_refused():
    class Plain:
        name = "plain"
        topk = 3

        def begin(self, ids):
            self.began = list(ids)

        def propose(self, request):
            return DraftTree.chain([7])

        def commit(self, outcome):
            pass

    p = Plain()
    d = as_drafter(p)
    assert isinstance(d, Drafter) and d.name == "plain" and d.topk == 3 and d.window(DraftRequest(1, 1)) is None
    d.begin([1, 2])
    assert p.began == [1, 2] and d.propose(DraftRequest(1, 1)).tokens.tolist() == [7]
    assert as_drafter(NoDrafter()).__class__ is NoDrafter  # a subclass is used as it is

    class NoCommit:
        def begin(self, ids): ...
        def propose(self, request): ...

    with pytest.raises(TypeError, match="commit"):
        as_drafter(NoCommit())


def test_drafting_state_is_per_decoder_and_kept_across_its_requests():
    from lookupdec.drafters.recycle import RecycleDrafter

    a, b = DrafterState(), DrafterState()
    assert RecycleDrafter(state=a).table is RecycleDrafter(state=a).table  # one decoder: one table
    assert RecycleDrafter(state=a).table is not RecycleDrafter(state=b).table  # two decoders: never shared
    assert RecycleDrafter(state=a, table_key="auto").table is not RecycleDrafter(state=a).table
    assert RecycleDrafter().table is not RecycleDrafter().table  # no state: a private table
    # Through the decoder: its recycle requests warm one table, another decoder's stays cold.
    d1, d2 = Decoder(tiny_loaded(0)), Decoder(tiny_loaded(0))
    d1.generate(PROMPT, method="recycle", max_new_tokens=8, chat_template=False)
    t1 = d1.state.recycle_table(RecycleDrafter().config.topk, "recycle")
    t2 = d2.state.recycle_table(RecycleDrafter().config.topk, "recycle")
    assert t1 is not t2 and _learnt(t1) and not _learnt(t2)


def _learnt(table) -> bool:
    """Whether a RecycleTable holds any candidate (-1: none yet)."""
    return bool((table.ids >= 0).any())


def _one_extra_row() -> ExtraRows:
    return ExtraRows(np.array([9]), np.array([1]), np.ones((1, 1), bool))


def test_a_second_stage_source_is_asked_only_where_it_says_it_pays():
    from lookupdec.drafters.auto import AutoDrafter
    from lookupdec.drafters.pld import PLDDrafter

    class Late(Drafter):
        """Proposes one fixed node; pays on every other step."""

        name = "late"
        second_stage = True

        def __init__(self):
            self.asked, self.proposed, self.lookup_sizes = 0, 0, []

        def pays(self, selection, max_depth, margin):
            self.asked += 1
            self.lookup_sizes.append(len(selection.nodes))  # it sees the first stage's choice
            return self.asked % 2 == 0

        def propose(self, request):
            self.proposed += 1
            return DraftTree.chain([99], [0.9])  # a token the lookup never drafts

    late = Late()
    auto = AutoDrafter(sources=[PLDDrafter(), late], gate=False)
    auto.begin([5, 6, 7, 5, 6, 7, 5, 6])
    trees = [auto.propose(DraftRequest(8, 8)) for _ in range(6)]
    assert late.asked == 6 and late.proposed == 3  # only the steps where it paid
    # On those steps its node is in the merged tree; on the others it is not.
    has_late = [bool((t.tokens == 99).any()) for t in trees]
    assert has_late == [False, True] * 3
    assert all(n > 0 for n in late.lookup_sizes)  # pld's match was selected first


def test_a_copied_drafting_state_learns_apart_and_shares_the_hardware_and_draft_model():
    """``DrafterState.copy``: what the copy learns (tables, calibration, accounts) never reaches the
    original or back; the cost provider and the draft model are the same objects."""
    dec = Decoder(tiny_loaded(0))
    dec.generate(PROMPT, method="auto", max_new_tokens=8, chat_template=False)
    original = dec.state
    copy = original.copy()
    assert copy.cost is original.cost and copy.draft_model is original.draft_model
    assert copy.calibration is not original.calibration and copy.ledgers.keys() == original.ledgers.keys()
    before = {key: table.ids.copy() for key, table in original.recycle_tables.items()}
    assert before and all(key[1] == "auto" for key in before)
    dec.state = copy
    dec.generate(PROMPT[::-1] * 2, method="recycle", max_new_tokens=16, chat_template=False)
    dec.generate(PROMPT[::-1] * 2, method="auto", max_new_tokens=16, chat_template=False)
    assert any(key[1] == "recycle" for key in copy.recycle_tables)
    assert not any(key[1] == "recycle" for key in original.recycle_tables)

    def same(a, b):
        return a.shape == b.shape and bool((a == b).all())

    assert all(same(original.recycle_tables[key].ids, ids) for key, ids in before.items())  # as they were
    assert not all(same(copy.recycle_tables[key].ids, ids) for key, ids in before.items())  # the copy learnt
