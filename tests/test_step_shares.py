"""``step_shares`` (each source's marginal rows and ownership of a step) against a slow oracle."""
import numpy as np

from lookupdec.drafters.ledger import step_shares
from lookupdec.tree import DraftTree, merge_trees


def _oracle(merged, draft_ms, chosen, costs, window_ms):
    """The definition, node by node: sources in order of cost (ties: source order); a merged
    node belongs to the first source in that order that proposed it; a source's rows are its
    window's ms plus, for the u chosen nodes it owns, c(1 + k) - c(1 + k - u)."""
    n_src = len(merged.maps)
    cost_of = [float(draft_ms[i]) + float(window_ms[i]) for i in range(n_src)]
    order = sorted(range(n_src), key=lambda i: (cost_of[i], i))
    owner = []
    for node in range(len(merged.tree)):
        owner.append(next((i for i in order if node in set(merged.maps[i].tolist())), -1))
    k = len(chosen)
    rows = [float(w) for w in window_ms]
    for i in range(n_src):
        u = sum(1 for c in chosen if owner[c] == i)
        if u:
            rows[i] += float(costs[1 + k] - costs[1 + k - u])
    return rows, float(costs[1 + k]), owner


def _random_tree(rng, n, vocab):
    if n == 0:
        return DraftTree.empty()
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, vocab, n), np.array(parents), rng.random(n))


def _random_merge(rng, max_nodes: int):
    """1-4 sources' random trees over a vocabulary of 3 (so they propose the same paths; some
    propose nothing), merged; returns the merge and its number of sources."""
    n_src = int(rng.integers(1, 5))
    return merge_trees([_random_tree(rng, int(rng.integers(0, max_nodes)), 3) for _ in range(n_src)]), n_src


def _random_nodes(rng, n: int) -> np.ndarray:
    """A random ascending subset of ``range(n)``."""
    return np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)) if n else np.zeros(0, np.int64)


def test_step_shares_equals_the_oracle_on_random_merges_with_ties_and_empty_sources():
    rng = np.random.default_rng(3)
    for trial in range(200):
        merged, n_src = _random_merge(rng, 12)
        n = len(merged.tree)
        chosen = _random_nodes(rng, n)
        # Equal drafting costs in some trials: the stable order decides ownership.
        draft = rng.integers(0, 3, n_src).astype(np.float64) if trial % 2 else rng.random(n_src)
        window = [0.0 if rng.random() < 0.6 else float(rng.random()) for _ in range(n_src)]
        costs = np.concatenate([[np.inf], np.cumsum(rng.random(n + 2) + 1.0)])
        got = step_shares(merged, draft, chosen, costs, window)
        rows, forward, owner = _oracle(merged, draft, chosen, costs, window)
        assert got.owner == owner
        assert got.forward_ms == forward
        np.testing.assert_allclose(got.rows_ms, rows, rtol=0, atol=1e-12)


def test_merging_trees_that_are_all_empty_gives_an_empty_tree_and_one_empty_map_each():
    for n_src in (1, 3):
        merged = merge_trees([DraftTree.empty()] * n_src)
        assert len(merged.tree) == 0 and len(merged.maps) == n_src
        assert all(len(m) == 0 and m.dtype == np.int64 for m in merged.maps)
    # the same maps as when one tree is not empty (the general path), for the empty ones
    mixed = merge_trees([DraftTree.empty(), DraftTree.chain([4, 5]), DraftTree.empty()])
    assert [m.tolist() for m in mixed.maps] == [[], [0, 1], []]


def test_ledger_settle_records_what_the_array_formula_gives():
    """``SourceLedger.settle`` (plain lists) hands ``record`` each source's accepted merged nodes it
    owns and its rows plus drafting ms, as the numpy formula (bincount over owners) does."""
    from lookupdec.drafters.ledger import SourceLedger

    rng = np.random.default_rng(5)
    for _ in range(100):
        merged, n_src = _random_merge(rng, 10)
        n = len(merged.tree)
        costs = np.concatenate([[np.inf], np.cumsum(rng.random(n + 2) + 1.0)])
        spent = rng.random(n_src)
        shares = step_shares(merged, spent, list(range(n)), costs, [0.0] * n_src)
        accepted = _random_nodes(rng, n)
        names = [f"s{i}" for i in range(n_src)]
        calls = []
        ledger = SourceLedger(names)
        ledger.record = lambda *a: calls.append(a)
        ledger.settle(shares, accepted, spent, 0.3, len(accepted) + 1, names)
        mine = np.array(shares.owner, np.int64)[accepted]
        want_unique = np.bincount(mine[mine >= 0], minlength=n_src).astype(np.float64)
        (step_ms, tokens, got_names, unique, marginal), = calls
        assert step_ms == shares.forward_ms + float(spent.sum()) + 0.3 and tokens == len(accepted) + 1
        assert list(got_names) == names and list(unique) == want_unique.tolist()
        assert list(marginal) == (np.array(shares.rows_ms) + spent).tolist()
