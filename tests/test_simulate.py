"""The offline acceptance simulator, on hand-made records with hand-computed results."""
import json

import numpy as np
import pytest

from lookupdec.costs import CostCurve
from lookupdec.drafters.base import DraftRequest, NoDrafter
from lookupdec.drafters.pld import PLDDrafter
from lookupdec.tree import DraftTree

from tests.conftest import load_benchmark

sim = load_benchmark("simulate")  # benchmarks/ is a folder of scripts, not a package


class Oracle:
    """Drafts the recorded output itself, ``budget`` tokens at a time (knows it by the prompt)."""

    name = "oracle"

    def __init__(self, answers):
        self.answers = answers

    def begin(self, prompt_ids):
        self.rest = list(self.answers[tuple(prompt_ids)])

    def propose(self, request):
        budget = request.budget
        return DraftTree.chain(self.rest[:budget])

    def commit(self, outcome):
        new = list(outcome.new_tokens)
        assert self.rest[:len(new)] == new
        self.rest = self.rest[len(new):]


RECORDS = [
    sim.Record(1, "qa", 0, (10, 11), tuple(range(100, 110))),  # 10 output tokens
    sim.Record(2, "rag", 0, (12,), tuple(range(200, 207))),  # 7 output tokens
]


def write_records(path):
    """RECORDS as record_outputs.py writes them."""
    path.write_text("".join(json.dumps({"question_id": r.question_id, "task": r.task, "turn": r.turn,
                                        "prompt_ids": list(r.prompt_ids), "output_ids": list(r.output_ids)}) + "\n"
                            for r in RECORDS))
    return path


def test_empty_drafter_gives_tau_one():
    r = sim.simulate(NoDrafter, RECORDS)
    # One token per step, exactly; every step accepted 0 draft tokens.
    assert r.overall.tau == 1.0 and r.overall.steps == 17 and r.histogram == (17,)
    # Plain decoding is the cost model's baseline.
    assert r.overall.est_speedup == pytest.approx(1.0)


def test_oracle_gives_the_maximum():
    answers = {r.prompt_ids: r.output_ids for r in RECORDS}
    r = sim.simulate(lambda: Oracle(answers), RECORDS, budget=3)
    # Each step accepts 3 drafted + 1 bonus: 10 tokens take 3 steps (4 + 4 + 2), 7 take 2 (4 + 3).
    assert (r.by_task["qa"].steps, r.by_task["rag"].steps) == (3, 2)
    assert r.overall.tau == pytest.approx(17 / 5)
    # Accepted draft tokens: 3, 3, 2 (last step covers the end: no bonus) and 3, 3.
    assert r.histogram == (0, 0, 1, 4)


def test_pld_on_a_hand_computed_record():
    rec = sim.Record(3, "summarization", 0, (1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2), (3, 4, 5, 6, 7, 8, 9))
    r = sim.simulate(lambda: PLDDrafter(min_n=2, init_depth=4, grow=2, max_depth=8), [rec])
    # Step 1: [1, 2] matches, [3, 4, 5, 6] accepted + bonus 7; depth grows to 6.
    # Step 2: [6, 7] matches; the draft [8, 9, 0, 1, 2, 3] is cut to the 2 tokens left,
    # as the decoder cuts it; [8, 9] accepted and the output ends.
    assert (r.overall.steps, r.overall.tau) == (2, 3.5)
    assert r.histogram == (0, 0, 1, 0, 1)
    # Mean draft size: (4 + 2) / 2.
    assert r.overall.mean_draft == 3.0


def test_over_budget_drafter_is_refused():
    class Greedy(Oracle):
        def propose(self, request):
            budget = request.budget
            return DraftTree.chain(self.rest[:budget + 1])

    answers = {r.prompt_ids: r.output_ids for r in RECORDS}
    with pytest.raises(ValueError, match="budget"):
        sim.simulate(lambda: Greedy(answers), RECORDS, budget=2)


def test_accepted_length_matches_reference_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(300):
        seqs = [rng.integers(0, 3, size=int(rng.integers(0, 5))).tolist() for _ in range(int(rng.integers(0, 5)))]
        tree = DraftTree.from_sequences(seqs)
        target = rng.integers(0, 3, size=int(rng.integers(0, 6))).tolist()
        assert sim.accepted_length(tree, target) == sim.accepted_length_reference(tree, target)


def test_cost_model_interpolates_and_extrapolates():
    c = sim.curve_from_points(((1, 10.0), (3, 20.0)))
    assert isinstance(c, CostCurve)  # the simulator prices with auto's own class, not a copy of it
    assert (c.ms_at(1), c.ms_at(2), c.ms_at(5)) == (10.0, 15.0, 30.0)
    # A first width above 1 holds its cost down to width 1 (CostCurve needs a point at 1).
    held = sim.curve_from_points(((4, 12.0), (8, 20.0)))
    assert held.widths == (1, 4, 8) and held.ms_at(2) == 12.0 and held.ms_at(6) == 16.0


def test_named_curves_are_the_table_entries_and_the_default_is_fast():
    # Each name gives its table entry (the measured numbers live in COST_CURVES, not here).
    for name, points in sim.COST_CURVES.items():
        c = sim.named_curve(name)
        assert all(c.ms_at(w) == pytest.approx(m) for w, m in points)
    fast = sim.named_curve()
    assert tuple(zip(fast.widths, fast.ms)) == sim.COST_CURVES["fast"]
    # Interpolation between two table points lies between their costs.
    (w0, m0), (w1, m1) = sim.COST_CURVES["fast"][3], sim.COST_CURVES["fast"][4]
    assert min(m0, m1) <= fast.ms_at((w0 + w1) // 2) <= max(m0, m1)
    assert sim.parse_curve("fast") == fast
    parsed = sim.parse_curve("1:10,3:20")
    assert (parsed.widths, parsed.ms) == ((1, 3), (10.0, 20.0))
    with pytest.raises(ValueError, match="nope"):
        sim.parse_curve("nope")
    with pytest.raises(ValueError, match="increasing"):
        sim.curve_from_points(((4, 1.0), (2, 2.0)))
    with pytest.raises(ValueError, match="1:34.3"):
        sim.parse_curve("1:a,3:20")


def test_est_speedup_counts_the_tree_width():
    # The oracle's 5 steps verify root + 3 nodes (width 4), except qa's last, which has 2 tokens
    # left to draft (width 3, 20 ms); ar takes 17 width-1 steps of 10 ms.
    answers = {r.prompt_ids: r.output_ids for r in RECORDS}
    cost = sim.curve_from_points(((1, 10.0), (4, 25.0)))
    r = sim.simulate(lambda: Oracle(answers), RECORDS, budget=3, cost=cost)
    assert r.overall.est_speedup == pytest.approx(17 * 10.0 / (4 * 25.0 + 20.0))


def test_load_records_round_trip_and_errors(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"question_id": 7, "task": "qa", "turn": 1, "prompt_ids": [1], "output_ids": [2, 3]}) + "\n\n")
    assert sim.load_records(p) == [sim.Record(7, "qa", 1, (1,), (2, 3))]
    p.write_text(json.dumps({"question_id": 7, "task": "qa", "prompt_ids": [1]}) + "\n")
    with pytest.raises(ValueError, match=r"r.jsonl:1.*output_ids"):
        sim.load_records(p)


def test_cli_prints_table(tmp_path, capsys):
    p = write_records(tmp_path / "r.jsonl")
    out_json = tmp_path / "res.json"
    assert sim.main([str(p), "--drafter", "ar", "--json", str(out_json)]) == 0
    assert "| **overall** | 2 | 17 | 17 | 1.000 |" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["overall"]["steps"] == 17
    with pytest.raises(ValueError, match="unknown drafter"):
        sim.drafter_factory("nope", {})
    # Several record files are replayed together; --cost picks the curve.
    assert sim.main([str(p), str(p), "--drafter", "ar", "--cost", "hf"]) == 0
    out = capsys.readouterr().out
    assert "| **overall** | 4 | 34 | 34 | 1.000 |" in out and "cost hf" in out


def test_copy_oracle_bound():
    rec = sim.Record(4, "qa", 0, (1, 2, 3, 4), (2, 3, 9, 2, 3, 9))
    r = sim.simulate(sim.drafter_factory("copy-oracle", {}, [rec]), [rec])
    # Step 1: [2, 3] is the longest output prefix found in the context; 9 is the bonus.
    # Step 2: [2, 3, 9] is now in the context and ends the output.
    assert (r.overall.steps, r.histogram) == (2, (0, 0, 1, 1))
    # No PLD setting beats the bound on the same record.
    pld = sim.simulate(lambda: PLDDrafter(min_n=1, max_depth=8, init_depth=8), [rec])
    assert pld.overall.tau <= r.overall.tau


def test_recorder_selects_questions_by_task(tmp_path):
    rec = load_benchmark("record_outputs")
    # The eight MT-bench categories are one task; the others are their own.
    assert (rec.task_of("coding"), rec.task_of("summarization")) == ("mt_bench", "summarization")
    with pytest.raises(ValueError, match="nope"):
        rec.task_of("nope")
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": ["x"]}) + "\n"
                          for i, c in enumerate(["rag", "qa", "rag", "rag", "writing", "qa"])))
    # Questions 1..2 of each category (offset 1), rag and qa only, in file order.
    picked = rec.select_questions(qs, per_category=2, offset=1, tasks=("rag", "qa"))
    assert [q["question_id"] for q in picked] == [2, 3, 5]
    # EOS ends the text carried into the next turn.
    assert rec.strip_eos([5, 6, 2, 7], (2,)) == [5, 6]


def test_transformers_pld_model_takes_the_earliest_occurrence():
    m = sim.TransformersPLDModel(num_tokens=10)
    m.begin([1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    # The last 2 tokens [1, 2] first occur at 0..1: draft from position 2, cut at the sequence end.
    assert m.propose(DraftRequest(64, 100)).tokens.tolist() == [3, 9, 1, 2, 4, 9, 1, 2]
    # The budget caps it too.
    assert m.propose(DraftRequest(3, 100)).tokens.tolist() == [3, 9, 1]


def test_sweep_halves_alternate_questions_and_keep_turns_together(tmp_path, capsys):
    sweep = load_benchmark("sweep_pld")
    recs = [sim.Record(q, t, turn, (q,), (1, 2)) for q, t, turn in
            [(5, "qa", 0), (1, "qa", 0), (3, "qa", 0), (9, "mt", 0), (9, "mt", 1), (8, "mt", 0), (8, "mt", 1)]]
    a, b = sweep.halves(recs)
    # qa questions 1, 3, 5 go A, B, A; mt questions 8, 9 go A, B with both their turns.
    assert sorted((r.task, r.question_id, r.turn) for r in a) == [("mt", 8, 0), ("mt", 8, 1), ("qa", 1, 0), ("qa", 5, 0)]
    assert sorted((r.task, r.question_id, r.turn) for r in b) == [("mt", 9, 0), ("mt", 9, 1), ("qa", 3, 0)]
    p = write_records(tmp_path / "r.jsonl")
    assert sweep.main([str(p), "-g", "fallback_width=0,2", "-s", "max_width=4"]) == 0
    out = capsys.readouterr().out
    # One row per grid point, each with the fixed setting.
    assert out.count("| max_width=4 fallback_width=") == 2


def test_records_carry_references_and_llma_replays_from_them(tmp_path):
    out = list(range(100, 140))
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"question_id": 1, "task": "rag", "turn": 0, "prompt_ids": [1, 2, 3],
                                "output_ids": out, "references": [[7, 8] + out + [9]]}) + "\n")
    recs = sim.load_records(path)
    assert recs[0].references == ((7, 8, *out, 9),)
    flat = sim.curve_from_points(((1, 10.0), (64, 10.5)))
    llma = sim.simulate(sim.drafter_factory("llma", {}, recs, flat), recs)
    pld = sim.simulate(sim.drafter_factory("pld", {}, recs, flat), recs)
    # The answer is in the reference: llma copies it in a few steps; pld has nothing to copy from.
    assert llma.overall.steps <= 8 and pld.overall.steps == len(out)
    # Without references llma drafts nothing.
    bare = [sim.Record(1, "qa", 0, (1, 2, 3), tuple(out))]
    assert sim.simulate(sim.drafter_factory("llma", {}, bare, flat), bare).overall.steps == len(out)


def test_auto_trees_follow_the_cost_curve():
    # Random text over 12 symbols: short matches everywhere, rarely right, so what a
    # tree is worth depends on what its rows cost.
    rng = np.random.default_rng(0)
    recs = [sim.Record(i, "qa", 0, tuple(rng.integers(3, 15, 300).tolist()), tuple(rng.integers(3, 15, 120).tolist()))
            for i in range(6)]
    flat = sim.curve_from_points(((1, 10.0), (64, 10.5)))      # wide trees nearly free
    steep = sim.curve_from_points(((1, 10.0), (64, 330.0)))    # each row costs half a plain step
    wide = sim.simulate(sim.drafter_factory("auto", {}, recs, flat), recs, cost=flat)
    narrow = sim.simulate(sim.drafter_factory("auto", {}, recs, steep), recs, cost=steep)
    assert wide.overall.mean_draft > 4 * max(narrow.overall.mean_draft, 0.5)
    # Under either curve auto's modelled speed is at least a plain step's: it drafts what pays.
    assert wide.overall.est_speedup > 1.0 and narrow.overall.est_speedup >= 0.99


def test_history_replays_earlier_records_outputs_in_order():
    out = tuple(range(200, 260))
    recs = [sim.Record(i, "qa", 0, (1, 2, i), out) for i in range(3)]  # three requests with the same answer
    flat = sim.curve_from_points(((1, 10.0), (64, 10.5)))
    r = sim.simulate(sim.drafter_factory("history", {}, recs, flat), recs, cost=flat)
    steps = [sim.simulate(sim.drafter_factory("history", {}, recs[:k], flat), recs[:k], cost=flat).overall.steps
             for k in (1, 2, 3)]
    # The first request has no history to draft from; later ones copy the remembered answer.
    assert steps[0] == len(out) and steps[1] - steps[0] < 10 and r.overall.steps == steps[2]


def test_as_run_prices_host_time_and_each_forward_at_its_cache_length():
    # Forwards cost 10 ms (width 1) to 25 ms (width 4) plus 0.1 ms a cached row; 2 ms of host time a step.
    answers = {r.prompt_ids: r.output_ids for r in RECORDS}
    cost = CostCurve((1, 4), (10.0, 25.0), 0, (0.1, 0.1), "cpu", "k")
    run = sim.RunModel(step_host_ms=2.0, drafter_scale=0.0, gate=False, past=True)
    r = sim.simulate(lambda: Oracle(answers), RECORDS, budget=3, cost=cost, run=run)
    # qa (prompt 2, 10 tokens): steps at 0, 4, 8 (widths 4, 4, 3); rag (prompt 1, 7 tokens): at 0, 4 (widths 4, 4).
    steps = [(25.0, 2), (25.0, 6), (20.0, 10), (25.0, 1), (25.0, 5)]
    ms = sum(base + 0.1 * past + 2.0 for base, past in steps)
    plain = sum(10.0 + 0.1 * (2 + j) + 2.0 for j in range(10)) + sum(10.0 + 0.1 * (1 + j) + 2.0 for j in range(7))
    assert r.overall.est_speedup == pytest.approx(plain / ms)
    # Without the run model the same replay is priced at the curve's own cache length, host time left out.
    bare = sim.simulate(lambda: Oracle(answers), RECORDS, budget=3, cost=cost)
    assert bare.overall.est_speedup == pytest.approx(17 * 10.0 / (4 * 25.0 + 20.0))


class Wrong:
    """Always drafts three tokens the output never has; counts its proposals."""

    def __init__(self, name, sleep_s=0.0, clock=None):
        self.name, self.sleep_s, self.proposals, self.clock = name, sleep_s, 0, clock

    def begin(self, prompt_ids):
        pass

    def propose(self, request):
        import time

        self.proposals += 1
        if self.clock is not None:
            self.clock.now += self.sleep_s  # its drafting time, on the clock the simulator reads
        else:
            time.sleep(self.sleep_s)
        return DraftTree.chain([1, 2, 3][:request.budget])

    def commit(self, outcome):
        assert not outcome.accepted


def test_as_run_gate_pauses_auto_drafting_that_never_pays_and_leaves_other_drafters_alone():
    long = [sim.Record(1, "qa", 0, (10, 11), tuple(range(100, 400)))]
    cost = sim.curve_from_points(((1, 10.0), (4, 20.0)))
    run = sim.RunModel(step_host_ms=0.0, drafter_scale=0.0, gate=True, past=False)
    made = []

    def factory(name):
        def make():
            made.append(Wrong(name))
            return made[-1]
        return make

    gated = sim.simulate(factory("auto"), long, budget=3, cost=cost, run=run)
    other = sim.simulate(factory("pld"), long, budget=3, cost=cost, run=run)
    assert other.overall.steps == 300 and made[1].proposals == 300  # every step drafted, none accepted
    assert gated.overall.steps == 300 and made[0].proposals < 150  # paused on most steps
    assert gated.overall.est_speedup > other.overall.est_speedup


class _Clock:
    """A clock that moves only when a drafter says it spent time (the wall clock of a loaded
    machine once made the quick drafter's own Python look as slow as the sleeping one)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_as_run_adds_the_drafters_own_time(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(sim, "time", clock)
    cost = sim.curve_from_points(((1, 10.0), (4, 20.0)))
    run = sim.RunModel(step_host_ms=0.0, gate=False, past=False)
    quick = sim.simulate(lambda: Wrong("pld", clock=clock), RECORDS, budget=3, cost=cost, run=run)
    slow = sim.simulate(lambda: Wrong("pld", sleep_s=0.005, clock=clock), RECORDS, budget=3, cost=cost, run=run)
    # 17 steps, each at least 5 ms of drafting more: the modelled time grows by at least 85 ms.
    plain = 17 * 10.0
    assert plain / slow.overall.est_speedup >= plain / quick.overall.est_speedup + 17 * 5.0 - 1e-6


def test_cli_as_run_and_a_cached_curve_file(tmp_path, capsys):
    p = write_records(tmp_path / "r.jsonl")
    curve = tmp_path / "curve.json"
    curve.write_text(CostCurve((1, 4), (10.0, 25.0), 0, (0.1, 0.1), "cpu", "k").to_json())
    out_json = tmp_path / "res.json"
    assert sim.main([str(p), "--drafter", "ar", "--cost", str(curve), "--as-run", "0.5", "--json", str(out_json)]) == 0
    assert "as run (host 0.5 ms a step, gate, drafter time x1)" in capsys.readouterr().out
    saved = json.loads(out_json.read_text())
    assert saved["run"]["step_host_ms"] == 0.5 and saved["cost"][0] == [1, 10.0]
    with pytest.raises(SystemExit):
        sim.main([str(p), "--as-run", "-1"])
    with pytest.raises(SystemExit):
        sim.main([str(p), "--as-run", "0.5", "--drafter-scale", "-2"])
    with pytest.raises(ValueError, match="cannot read the cost curve"):
        sim.parse_curve(str(tmp_path / "missing.json"))
