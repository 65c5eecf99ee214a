"""The decoder checks every drafter's tree before the model sees it."""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.decoder import Decoder
from lookupdec.errors import DraftError
from lookupdec.tree import DraftTree
from tests.conftest import TINY_VOCAB, tiny_loaded


class Fixed:
    """Proposes the same object every step."""

    name = "fixed"

    def __init__(self, proposal):
        self.proposal = proposal

    def begin(self, prompt_ids):
        pass

    def propose(self, request):
        return self.proposal

    def commit(self, outcome):
        pass


@pytest.mark.parametrize("bad_id", [TINY_VOCAB, TINY_VOCAB + 1000, 2**40])
def test_a_drafted_id_outside_the_vocabulary_is_refused_with_the_drafter_named(bad_id):
    dec = Decoder(tiny_loaded(0))
    with pytest.raises(DraftError, match=rf"drafter 'fixed' proposed token id {bad_id}.*\[0, {TINY_VOCAB}\)"):
        dec.generate([5, 6, 7], max_new_tokens=8, drafter=Fixed(DraftTree.chain([7, bad_id])))


def test_a_proposal_that_is_not_a_tree_is_refused():
    dec = Decoder(tiny_loaded(0))
    with pytest.raises(DraftError, match="returned list, not a DraftTree"):
        dec.generate([5, 6, 7], max_new_tokens=8, drafter=Fixed([1, 2, 3]))


def test_oversized_and_too_deep_trees_are_cut_and_accepted_ids_map_back():
    """A tree over the budget is cut to its best nodes; the drafter still hears its own node ids."""
    lm = tiny_loaded(0)
    dec = Decoder(lm, draft_budget=3)
    ref = dec.generate([5, 6, 7], method="ar", max_new_tokens=12)
    truth = list(ref.token_ids)
    seen = []

    class Wide:
        name = "wide"

        def begin(self, prompt_ids):
            self.pos = 0

        def propose(self, request):
            # The root is the last token generated; the truth continues at truth[pos].
            # Node 0 is a poor branch (scored low), nodes 1.. the truth, 6 deep, scored high.
            true = truth[self.pos:self.pos + 6]
            tokens = [(true[0] + 1) % TINY_VOCAB] + true
            parents = [-1, -1] + list(range(1, len(true)))
            scores = [0.1] + [0.9] * len(true)
            self.tree = DraftTree(np.array(tokens), np.array(parents[:len(tokens)]), np.array(scores))
            return self.tree

        def commit(self, outcome):
            for k, i in enumerate(outcome.accepted):
                seen.append((i, int(self.tree.tokens[i]), truth[self.pos + k]))
            self.pos += len(outcome.new_tokens)

    out = dec.generate([5, 6, 7], max_new_tokens=12, drafter=Wide())
    assert out.token_ids == ref.token_ids
    # The budget of 3 keeps the three best nodes (the truth's first three), never the poor branch.
    assert all(s.draft_size <= 3 for s in out.step_stats) and out.steps <= 4
    # Accepted ids are the drafter's own numbering (the truth chain is nodes 1..), naming the right tokens.
    assert len(seen) >= 6 and all(i >= 1 and tok == want for i, tok, want in seen)


@pytest.mark.parametrize("bad", [[5, TINY_VOCAB], [-1, 5], [5, 2**40]])
def test_token_id_prompts_outside_the_vocabulary_are_refused(bad):
    dec = Decoder(tiny_loaded(0))
    with pytest.raises(ValueError, match=f"prompt token id {bad[0] if bad[0] < 0 else bad[1]}.*outside") as caught:
        dec.generate(bad, max_new_tokens=4)
    from lookupdec import PromptError

    assert isinstance(caught.value, PromptError)  # the server answers it as a 400 on the prompt by its type


def test_cli_token_id_prompts_are_checked_before_generating(tmp_path):
    import json

    from click.testing import CliRunner

    from lookupdec.cli import main
    from tests.conftest import save_tiny

    d = save_tiny(tmp_path / "m", 0)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps([5, 6, 7]) + "\n" + json.dumps([5, 999]) + "\n")
    r = CliRunner().invoke(main, ["generate", "--model", str(d), "--input", str(inp), "--json", "--max-new-tokens", "4"])
    assert r.exit_code != 0 and "prompt 2" in r.output and "999" in r.output and "vocabulary" in r.output
    assert "Traceback" not in r.output and "{" not in r.stdout  # nothing generated for prompt 1 either
