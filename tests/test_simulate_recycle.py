"""The simulator's replay of Token Recycling from recorded top-k, on hand-made records."""
import json

import numpy as np
import pytest

from lookupdec.tree import DraftTree
from tests.conftest import load_benchmark

sim = load_benchmark("simulate")


def _periodic_record(qid=1):
    """Output 20 21 22 23 repeated; the recorded top-1 at each position is the token that follows."""
    out = [20, 21, 22, 23] * 10
    ids = np.array([[t, 99] for t in out])
    probs = np.tile(np.array([0.9, 0.05], np.float32), (len(out), 1))
    return sim.Record(qid, "qa", 0, (5, 6, 23), tuple(out), (), ids, probs)


class Spy:
    """Asks for top-k, drafts nothing, and keeps every outcome."""

    name = "spy"
    topk = 2

    def __init__(self):
        self.outcomes = []

    def begin(self, prompt_ids):
        pass

    def propose(self, request):
        return DraftTree.empty()

    def commit(self, outcome):
        self.outcomes.append(outcome)


def test_replay_hands_each_step_the_rows_of_its_committed_positions():
    rec = _periodic_record()
    spy = Spy()
    sim.simulate(lambda: spy, [rec])
    context = list(rec.prompt_ids) + list(rec.output_ids)
    # One token per step: step j's row is the distribution of output j, after input token context[3 + j - 1].
    assert len(spy.outcomes) == len(rec.output_ids)
    for j, o in enumerate(spy.outcomes):
        assert o.row_tokens.tolist() == [context[2 + j]]
        assert o.topk_ids.tolist() == [rec.topk_ids[j].tolist()]


def test_recycle_replay_accepts_once_the_table_holds_the_cycle():
    rec = _periodic_record()
    res = sim.simulate(sim.drafter_factory("recycle", {}, [rec]), [rec])
    assert res.overall.tau > 2.0  # after the first cycle, whole chains of the cycle are accepted
    assert sim.simulate(sim.drafter_factory("auto", {}, [rec]), [rec]).overall.tau > 1.0


def test_recycle_replay_refuses_records_without_topk_and_topk_round_trips(tmp_path):
    bare = sim.Record(1, "qa", 0, (1, 2), (3, 4))
    with pytest.raises(ValueError, match="--topk"):
        sim.drafter_factory("recycle", {}, [bare])
    p = tmp_path / "r.jsonl"
    rec = _periodic_record()
    p.write_text(json.dumps({"question_id": 1, "task": "qa", "prompt_ids": list(rec.prompt_ids),
                             "output_ids": list(rec.output_ids), "topk_ids": rec.topk_ids.tolist(),
                             "topk_probs": rec.topk_probs.tolist()}) + "\n")
    back = sim.load_records(p)[0]
    assert back.topk_ids.tolist() == rec.topk_ids.tolist()
    np.testing.assert_allclose(back.topk_probs, rec.topk_probs)


def test_recorder_topk_rows_are_the_causal_forward_at_each_output_position():
    import torch

    from tests.conftest import batch_of, tiny_model

    rec_mod = load_benchmark("record_outputs")
    model = tiny_model(0)

    def logits(ids, rows):
        with torch.no_grad():
            return model(batch_of(model, ids)).logits[0, rows]

    g = rec_mod.Greedy(None, (2,), None, "tiny", logits)
    prompt, out = [5, 6, 7], [8, 9, 10, 11]
    ids, probs = rec_mod.output_topk(g, prompt, out, 3)
    for j in range(len(out)):
        with torch.no_grad():
            row = model(batch_of(model, prompt + out[:j])).logits[0, -1].cpu()
        assert ids[j] == torch.topk(row, 3).indices.tolist()
        np.testing.assert_allclose(probs[j], torch.topk(torch.softmax(row, -1), 3).values.numpy(), atol=1e-4)
    assert rec_mod.output_topk(g, prompt, [], 3) == ([], [])
