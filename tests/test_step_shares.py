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


def test_step_shares_equals_the_oracle_on_random_merges_with_ties_and_empty_sources():
    rng = np.random.default_rng(3)
    for trial in range(200):
        n_src = int(rng.integers(1, 5))
        # A small vocabulary makes sources propose the same paths; some sources propose nothing.
        trees = [_random_tree(rng, int(rng.integers(0, 12)), 3) for _ in range(n_src)]
        merged = merge_trees(trees)
        n = len(merged.tree)
        chosen = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)) if n else np.zeros(0, np.int64)
        # Equal drafting costs in some trials: the stable order decides ownership.
        draft = rng.integers(0, 3, n_src).astype(np.float64) if trial % 2 else rng.random(n_src)
        window = [0.0 if rng.random() < 0.6 else float(rng.random()) for _ in range(n_src)]
        costs = np.concatenate([[np.inf], np.cumsum(rng.random(n + 2) + 1.0)])
        got = step_shares(merged, draft, chosen, costs, window)
        rows, forward, owner = _oracle(merged, draft, chosen, costs, window)
        assert got.owner.tolist() == owner
        assert got.forward_ms == forward
        np.testing.assert_allclose(got.rows_ms, rows, rtol=0, atol=1e-12)
