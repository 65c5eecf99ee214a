"""PLD drafter rules, each pinned by a tiny hand-computed case."""
import numpy as np
import pytest

from lookupdec.drafters.base import SOURCES, DraftRequest, Drafter, StepOutcome
from lookupdec.drafters.pld import PLDConfig, PLDDrafter, lookup_tree
from lookupdec.index.live import LiveIndex


def drafter(prompt, **settings):
    d = PLDDrafter(**settings)
    d.begin(prompt)
    return d


def req(budget, max_depth=1000):
    return DraftRequest(budget, max_depth)


def step(new_tokens, accepted):
    """The outcome of a step that accepted the first ``accepted`` nodes of a chain draft."""
    return StepOutcome(tuple(range(accepted)), tuple(new_tokens))


def test_is_a_drafter():
    assert isinstance(PLDDrafter(), Drafter) and PLDDrafter.name == "pld"


def test_no_match_gives_empty_tree():
    # No 2-token suffix of [1..6] occurred earlier.
    assert len(drafter([1, 2, 3, 4, 5, 6]).propose(req(16))) == 0


def test_context_shorter_than_n():
    # One token: no suffix of length min_n=2 exists.
    assert len(drafter([7], fallback_width=0).propose(req(16))) == 0
    # Two tokens: the only 2-gram is the suffix itself, whose continuation is unknown.
    assert len(drafter([7, 7], fallback_width=0).propose(req(16))) == 0
    # Empty prompt.
    assert len(drafter([]).propose(req(16))) == 0


def test_one_token_matches_need_min_n_1():
    # [9] occurred before (followed by 4), but a 1-token match only counts with min_n=1.
    assert len(drafter([9, 4, 5, 9], min_n=2, fallback_width=0).propose(req(16))) == 0
    assert drafter([9, 4, 5, 9], min_n=1, min_depth=1, init_depth=2).propose(req(16)).tokens.tolist() == [4, 5]


def test_longest_match_wins_over_most_recent_shorter_one():
    # [1, 2, 3] occurred once (then 7); the shorter [2, 3] more recently (then 8).
    d = drafter([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3], min_depth=1, init_depth=1)
    assert d.propose(req(16)).tokens.tolist() == [7]


def test_several_occurrences_merged_most_recent_first():
    # [1, 2] continued with 5, then 6 later, then 6 again: the most recent (6) comes first,
    # and its count says two occurrences agree.
    t = drafter([1, 2, 5, 7, 1, 2, 6, 8, 1, 2, 6, 9, 1, 2], min_depth=1, init_depth=1).propose(req(16))
    assert (t.tokens.tolist(), t.parents.tolist()) == ([6, 5], [-1, -1])
    # Two of three occurrences agree on 6: it scores higher, and every node is stamped as PLD's.
    assert t.scores[0] > t.scores[1] > 0 and t.sources.tolist() == [SOURCES["pld"]] * 2


def test_max_occurrences_keeps_the_most_recent():
    # Only the most recent occurrence (continuing with 6) is read.
    t = drafter([1, 2, 5, 7, 1, 2, 6, 8, 1, 2], min_depth=1, init_depth=1, max_occurrences=1).propose(req(16))
    assert t.tokens.tolist() == [6]


def test_draft_clipped_to_budget_and_width():
    d = drafter([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], init_depth=8, max_depth=8)
    # The decoder's budget caps the tree...
    assert d.propose(req(3)).tokens.tolist() == [3, 4, 5]
    # ...and so does the request's max_depth.
    assert d.propose(req(16, max_depth=2)).tokens.tolist() == [3, 4]
    # ...and so does max_width, whatever the budget.
    d = drafter([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], init_depth=8, max_depth=8, max_width=2)
    assert d.propose(req(64)).tokens.tolist() == [3, 4]
    # A zero budget drafts nothing.
    assert len(d.propose(req(0))) == 0


def test_tree_pruned_to_width_keeps_best_supported_nodes():
    idx = LiveIndex(max_n=4, min_n=2)
    # [1, 2] continues with 5 5 once and with 6 6 twice (most recent 6 6).
    idx.extend([1, 2, 5, 5, 7, 1, 2, 6, 6, 8, 1, 2, 6, 6, 9, 1, 2])
    d = lookup_tree(idx, depth=2, width=3, max_occurrences=8)
    # The two-vote path [6, 6] survives whole; the single-vote branch keeps its first node.
    # Scores are the shares of the three occurrences behind each path.
    t = d.tree
    assert (t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()) == ([6, 6, 5], [-1, 0, -1], [2 / 3, 2 / 3, 1 / 3])
    assert d.match_len == 2


def test_repeating_pattern_drafted_to_full_depth():
    # The suffix [3, 3] last occurred one token back: the continuation repeats 3s.
    assert drafter([3, 3, 3], init_depth=4).propose(req(16)).tokens.tolist() == [3, 3, 3, 3]


def test_depth_grows_after_full_acceptance():
    d = drafter([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], min_depth=1, init_depth=2, grow=2, max_depth=5)
    t = d.propose(req(16))
    assert t.tokens.tolist() == [3, 4]
    d.commit(step([3, 4, 5], 2))
    # Both drafted tokens accepted: depth 2 + grow 2 = 4.
    assert d.depth == 4
    assert d.propose(req(16)).tokens.tolist() == [6, 7, 8, 9]
    d.commit(step([6, 7, 8, 9, 1], 4))
    # Capped at max_depth.
    assert d.depth == 5


def test_depth_shrinks_after_rejection():
    d = drafter([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], init_depth=6, min_depth=1)
    assert len(d.propose(req(16))) == 6
    d.commit(step([3, 0], 1))
    # One of six accepted: next depth is accepted + 1 = 2.
    assert d.depth == 2
    d.propose(req(16))  # suffix [3, 0] never occurred: empty draft
    d.commit(step([4], 0))
    # An empty draft says nothing about acceptance: depth stays.
    assert d.depth == 2
    d2 = drafter([1, 2, 3, 4, 1, 2], init_depth=3, min_depth=2)
    d2.propose(req(16))
    d2.commit(step([0], 0))
    # Nothing accepted: accepted + 1 = 1, held at min_depth 2.
    assert d2.depth == 2


def test_begin_resets_state():
    d = drafter([1, 2, 3, 1, 2], min_depth=1, init_depth=3)
    d.propose(req(16))
    d.commit(step([3, 1, 2, 3], 3))
    d.begin([4, 5, 6])
    # A new sequence: the old one's matches and the adapted depth are gone.
    assert len(d.propose(req(16))) == 0 and d.depth == 3


def test_commit_indexes_generated_tokens():
    d = drafter([1, 2, 3], min_depth=1, init_depth=2)
    d.propose(req(16))
    d.commit(step([4, 1, 2], 0))
    # [1, 2] now recurs: the prompt's continuation [3, 4] is drafted.
    assert d.propose(req(16)).tokens.tolist() == [3, 4]


@pytest.mark.parametrize("bad", [dict(min_n=0), dict(min_n=3, max_n=2), dict(max_width=0), dict(max_occurrences=0),
                                 dict(min_depth=3, init_depth=2), dict(init_depth=9, max_depth=8), dict(grow=-1)])
def test_bad_config_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        PLDConfig(**bad)


def test_config_or_settings_not_both():
    with pytest.raises(TypeError):
        PLDDrafter(PLDConfig(), min_n=1)


def test_random_trees_are_valid_and_within_width():
    rng = np.random.default_rng(0)
    for _ in range(50):
        d = drafter(rng.integers(0, 4, size=60).tolist(), min_n=1, max_width=int(rng.integers(1, 10)))
        for _ in range(5):
            t = d.propose(req(int(rng.integers(0, 12))))
            assert t.check() == "" and len(t) <= d.config.max_width
            new = rng.integers(0, 4, size=int(rng.integers(1, 4))).tolist()
            d.commit(step(new, len(new) - 1))


def test_fallback_drafts_short_matches_without_adapting():
    # No 2-token suffix matched, but [9] did (followed by 4, 5): fallback drafts 1 token deep.
    d = drafter([9, 4, 5, 6, 9], min_n=2, fallback_width=2, fallback_depth=1, min_depth=1, init_depth=3)
    assert d.propose(req(16)).tokens.tolist() == [4]
    d.commit(step([0], 0))
    # A rejected fallback draft leaves the adaptive depth alone.
    assert d.depth == 3
    # A 2-token match takes precedence over the fallback and uses the adaptive depth.
    d2 = drafter([9, 4, 5, 6, 9, 4], min_n=2, fallback_width=2, min_depth=1, init_depth=3)
    assert d2.propose(req(16)).tokens.tolist() == [5, 6, 9]
    # Fallback width 0 drafts nothing on a 1-token match.
    assert len(drafter([9, 4, 5, 6, 9], min_n=2, fallback_width=0).propose(req(16))) == 0


def test_fallback_is_moot_with_min_n_1():
    # With min_n=1 every match gets the full draft; no shorter match is left for the fallback.
    d = drafter([9, 4, 5, 6, 9], min_n=1, fallback_width=2, min_depth=1, init_depth=3)
    assert d.propose(req(16)).tokens.tolist() == [4, 5, 6]


def test_defaults_tuned_for_the_fast_verifier():
    # Pinned: benchmarks/sweep_pld.py under the fast verify-cost curve chose these (see PLDConfig).
    c = PLDConfig()
    assert (c.min_n, c.max_n, c.max_width, c.max_occurrences) == (2, 8, 12, 8)
    assert (c.min_depth, c.max_depth, c.init_depth, c.grow) == (4, 12, 8, 4)
    assert (c.fallback_width, c.fallback_depth) == (3, 3)


def test_default_depth_never_shrinks_below_four():
    # A 12-token run after [1, 2]: the default draft starts 8 deep.
    d = drafter(list(range(1, 15)) + [1, 2])
    assert d.propose(req(64)).tokens.tolist() == list(range(3, 11))
    d.commit(step([3, 0], 1))
    # One accepted: one past it would be 2, but widths up to ~5 cost about the same, so 4.
    assert d.depth == 4
    d.propose(req(64))
    d.commit(step([0], 0))
    assert d.depth == 4


def test_default_fallback_is_three_nodes_three_deep():
    # No 2-token suffix recurs; the 1-token suffix [9] continued with 4 5 6 and with 7 8.
    t = drafter([9, 4, 5, 6, 0, 9, 7, 8, 1, 9]).propose(req(64))
    # Three nodes at most, most recent occurrence first: the chain 7 8 and then 4.
    assert (t.tokens.tolist(), t.parents.tolist()) == ([7, 8, 4], [-1, 0, -1])
    # With one occurrence only, the fallback chain runs 3 deep.
    assert drafter([9, 4, 5, 6, 0, 9]).propose(req(64)).tokens.tolist() == [4, 5, 6]


def test_default_width_caps_long_merged_drafts_at_twelve():
    # [1, 2] recurs twice with different continuations, each read 8 deep (the starting depth):
    # 16 candidate nodes, 12 kept whatever the budget; on equal support the shallower
    # nodes win, so each branch keeps its first 6.
    prompt = [1, 2] + list(range(10, 22)) + [1, 2] + list(range(30, 42)) + [1, 2]
    t = drafter(prompt).propose(req(64))
    assert len(t) == 12 and t.check() == "" and int(t.depth.max()) == 6
    assert sorted(t.tokens.tolist()) == list(range(10, 16)) + list(range(30, 36))
