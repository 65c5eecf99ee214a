"""The Spec-Bench harness (benchmarks/spec_bench.py) without a real model.

Fake methods implement the same interface as the real ones, so the whole
harness path (questions -> prompts -> methods -> exactness -> metrics ->
JSON/Markdown/PNG) runs here in well under a second.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from specbench.cli import Setup, choose_methods, main  # noqa: E402
from specbench.documents import extract_documents  # noqa: E402
from specbench.exactness import ExactnessCheck, OutputMismatch, canonical, first_difference  # noqa: E402
from specbench.methods import MethodOutput, step_lengths_from_stats  # noqa: E402
from specbench.metrics import question_speeds, summarize  # noqa: E402
from specbench.report import markdown_table  # noqa: E402
from specbench.runner import RunConfig, TurnRecord, run_benchmark  # noqa: E402
from specbench.tasks import load_questions, task_of  # noqa: E402

EOS = 2


# ---------------------------------------------------------------- fakes

class FakeCodec:
    """Chat 'template': each message's characters as ids, with role markers."""

    def encode(self, messages):
        ids = []
        for m in messages:
            ids.append(1000 if m["role"] == "user" else 1001)
            ids.extend(ord(c) % 997 + 3 for c in m["content"])
        return ids + [1002]

    def decode(self, token_ids):
        return "".join(chr(97 + t % 26) for t in token_ids)


def fake_greedy(prompt_ids, max_new_tokens):
    """A deterministic 'model': output depends on the whole prompt; stops with EOS when short."""
    seed = sum((i + 1) * t for i, t in enumerate(prompt_ids)) % 1009
    n = min(max_new_tokens, 6 + seed % 9)
    out = [3 + (seed + 7 * i) % 40 for i in range(n)]
    if n < max_new_tokens:
        out.append(EOS)
    return out


class FakeMethod:
    """Greedy by ``fake_greedy``, committed ``chunk`` tokens per step; optionally broken.

    Args:
        break_at: change the token at this position (an exactness bug).
        truncate: drop this many final tokens (the bug ``zip()`` misses).
        broken_turn: only break generations whose prompt holds this many user turns.
        break_on_call: only break the n-th call (a nondeterministic method).
        drop_eos: return the output without its EOS (as a decoder may).
    """

    same_draws = False  # sampled, not checked against the reference unless a test says so

    def __init__(self, name, chunk=1, takes_references=False, break_at=None, truncate=0, broken_turn=None,
                 break_on_call=None, drop_eos=False):
        self.name, self.chunk, self.takes_references = name, chunk, takes_references
        self.break_at, self.truncate, self.broken_turn = break_at, truncate, broken_turn
        self.break_on_call, self.drop_eos = break_on_call, drop_eos
        self.calls = []

    def snapshot(self):
        return None

    def restore(self, snapshot):
        pass

    def generate(self, prompt_ids, max_new_tokens, references=()):
        self.calls.append((list(prompt_ids), max_new_tokens, tuple(references)))
        out = fake_greedy(prompt_ids, max_new_tokens)
        turn = list(prompt_ids).count(1000)
        broken = self.broken_turn is None or turn == self.broken_turn
        if self.break_on_call is not None:
            broken = len(self.calls) == self.break_on_call
        if broken and self.break_at is not None:
            out[self.break_at] = 999
        if broken and self.truncate:
            out = out[:-self.truncate]
        if self.drop_eos and out and out[-1] == EOS:
            out = out[:-1]
        lengths = [min(self.chunk, len(out) - i) for i in range(0, len(out), self.chunk)]
        return MethodOutput(tuple(out), len(lengths), tuple(lengths))


QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem about tea.", "Now make it rhyme."]},
    {"question_id": 82, "category": "writing", "turns": ["Write a haiku.", "Shorter."]},
    {"question_id": 111, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
    {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Guten Tag"]},
    {"question_id": 241, "category": "summarization", "turns": ["Summarize: The fox ran. The dog slept."]},
    {"question_id": 321, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": 401, "category": "math_reasoning", "turns": ["Jen pays $4 twice. Total?"]},
    {"question_id": 481, "category": "rag", "turns": ["Tea A tea is a drink.\nCoffee Coffee is too.\nWhat is tea?"]},
]


@pytest.fixture
def qfile(tmp_path):
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return p


def fake_setup(methods):
    def setup(args, names):
        return Setup({n: methods[n] for n in names}, FakeCodec(), (EOS,), {"model": "fake"})
    return setup


def run_main(qfile, out, methods, extra=()):
    """main() on the tiny question file with ``methods`` (name -> fake) behind the CLI."""
    argv = ["--questions", str(qfile), "--out", str(out), "--methods", ",".join(methods),
            "--max-new-tokens", "12", *extra]
    return main(argv, setup=fake_setup(methods), available=["hf", "hf_pld", "ar", "pld", "llma"])


# ---------------------------------------------------------------- tasks and documents

def test_task_grouping_from_a_tiny_questions_file(qfile):
    qs = load_questions(qfile)
    assert [q.task for q in qs] == ["mt_bench"] * 3 + ["translation", "summarization", "qa", "math_reasoning", "rag"]
    assert qs[0].turns == ("Write a poem about tea.", "Now make it rhyme.")
    # per_category counts categories, not tasks: one 'writing' and one 'math' question both stay.
    assert [q.question_id for q in load_questions(qfile, per_category=1)] == [81, 111, 161, 241, 321, 401, 481]
    # --tasks keeps whole tasks (every MT-bench category for mt_bench).
    assert [q.task for q in load_questions(qfile, tasks=["summarization", "rag"])] == ["summarization", "rag"]
    assert len(load_questions(qfile, tasks=["mt_bench"])) == 3
    with pytest.raises(ValueError, match="poetry"):
        load_questions(qfile, tasks=["poetry"])


def test_offset_takes_held_out_questions_per_category(qfile):
    first = [q.question_id for q in load_questions(qfile, per_category=1)]
    held = load_questions(qfile, per_category=1, offset=1)
    # Only the writing category has a second question in the tiny file.
    assert [q.question_id for q in held] and not set(q.question_id for q in held) & set(first)
    assert all(q.category == "writing" for q in held)
    with pytest.raises(ValueError, match="offset"):
        load_questions(qfile, offset=-1)


@pytest.mark.parametrize("bad", ["0", "-2", "x", "most:2", "all:"])
def test_a_bad_cost_scale_is_refused_before_any_work(qfile, tmp_path, capsys, bad):
    methods = {"ar": FakeMethod("ar")}
    assert run_main(qfile, tmp_path / "o", methods, ("--cost-scale", bad)) == 2
    assert "--cost-scale" in capsys.readouterr().err


def test_task_of_rejects_unknown_category():
    assert task_of("humanities") == "mt_bench"
    with pytest.raises(ValueError, match="poetry"):
        task_of("poetry")
    with pytest.raises(ValueError):
        task_of("mt_bench")  # a task name, not a category of the file


def test_bad_question_file_names_the_line(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"q.jsonl:2"):
        load_questions(p)
    with pytest.raises(ValueError, match="per_category"):
        load_questions(p, per_category=0)


def test_extract_documents():
    assert extract_documents("summarization", "Summarize: A long article.\nSecond line.") == (
        "A long article.\nSecond line.",)
    # rag: every line but the last is a passage; blank lines are skipped.
    assert extract_documents("rag", "P1 text.\n\nP2 text.\nWhat is P?") == ("P1 text.", "P2 text.")
    assert extract_documents("qa", "Who?") == ()
    assert extract_documents("mt_bench", "Summarize: this is a writing prompt") == ()
    with pytest.raises(ValueError, match="Summarize"):
        extract_documents("summarization", "Condense: text")
    with pytest.raises(ValueError, match="passage"):
        extract_documents("rag", "Only a question?")


def test_extract_documents_on_the_real_file_shape():
    path = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
    if not path.is_file():
        pytest.fail(f"Spec-Bench question file missing at {path}")
    qs = load_questions(path)
    for q in qs:
        docs = extract_documents(q.task, q.turns[0])
        if q.task == "rag":
            assert len(docs) >= 2 and not q.turns[0].endswith(docs[-1])  # the question is not a document
            assert all(d in q.turns[0] for d in docs)
        elif q.task == "summarization":
            assert len(docs) == 1 and len(docs[0]) > 200
        else:
            assert docs == ()


# ---------------------------------------------------------------- exactness

def test_canonical_and_first_difference():
    assert canonical([4, 5, EOS], [EOS]) == (4, 5)
    assert canonical([4, EOS, EOS], [EOS]) == (4, EOS)  # only one trailing EOS goes
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2, 3], [1, 2]) == 2  # truncated: zip() would call these equal
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [7]) == 0


def test_check_raises_with_position():
    chk = ExactnessCheck("ar", (EOS,))
    chk.check("pld", 5, 1, [1, 2, 3, EOS], [1, 2, 3])  # EOS dropped by one method: equal
    with pytest.raises(OutputMismatch) as ei:
        chk.check("pld", 5, 2, [1, 2, 3], [1, 9, 3])
    assert (ei.value.question_id, ei.value.turn, ei.value.position) == (5, 2, 1)
    assert "question 5" in str(ei.value) and "position 1" in str(ei.value)
    with pytest.raises(OutputMismatch, match="truncated"):
        chk.check("pld", 5, 1, [1, 2, 3, 4], [1, 2, 3, EOS])


# ---------------------------------------------------------------- speed arithmetic by hand

def rec(method, qid, task, tokens, seconds, steps, committed=None, turn=1):
    return TurnRecord(method, qid, task, task, turn, tokens, seconds, (seconds,), steps,
                      tokens if committed is None else committed)


def hand_records():
    # hf: q1 (two turns: 60 tok/6 s + 40 tok/4 s = 10 tok/s), q2 60/3 = 20, q3 50/5 = 10
    # pld: q1 100/5 = 20, q2 60/2 = 30, q3 50/2 = 25 (q3 committed an EOS too: 51 tokens)
    return [
        rec("hf", 1, "qa", 60, 6.0, 61, turn=1), rec("hf", 1, "qa", 40, 4.0, 40, turn=2),
        rec("hf", 2, "qa", 60, 3.0, 60), rec("hf", 3, "rag", 50, 5.0, 51, 51),
        rec("pld", 1, "qa", 60, 3.0, 25, turn=1), rec("pld", 1, "qa", 40, 2.0, 15, turn=2),
        rec("pld", 2, "qa", 60, 2.0, 20), rec("pld", 3, "rag", 50, 2.0, 17, 51),
    ]


def test_speed_arithmetic_by_hand():
    s = summarize(hand_records(), baseline="hf")
    assert question_speeds(hand_records())[("hf", 1)].tokens_per_s == pytest.approx(10.0)
    qa = s[("pld", "qa")]
    # Mean of per-question tokens/s: hf (10+20)/2 = 15, pld (20+30)/2 = 25 -> 25/15.
    # (Total tokens / total time would give (160/5)/(160/13) = 2.6: not Spec-Bench's arithmetic.)
    assert qa.tokens_per_s == pytest.approx(25.0) and qa.baseline_tokens_per_s == pytest.approx(15.0)
    assert qa.speedup == pytest.approx(5 / 3)
    # Per-question speedups 2.0 and 1.5: sample std = 0.5/sqrt(2).
    assert qa.speedup_std == pytest.approx(0.5 / math.sqrt(2))
    assert (qa.speedup_min, qa.speedup_max) == (pytest.approx(1.5), pytest.approx(2.0))
    assert qa.mean_accepted == pytest.approx(160 / 60)  # committed tokens / steps
    rag = s[("pld", "rag")]
    assert rag.speedup == pytest.approx(2.5) and rag.speedup_std == 0.0 and rag.n_questions == 1
    assert rag.mean_accepted == pytest.approx(51 / 17)
    overall = s[("pld", "overall")]
    assert overall.tokens_per_s == pytest.approx(25.0)
    assert overall.baseline_tokens_per_s == pytest.approx(40 / 3)
    assert overall.speedup == pytest.approx(1.875)
    assert overall.speedup_std == pytest.approx(0.5)  # std of 2.0, 1.5, 2.5
    assert overall.mean_accepted == pytest.approx(211 / 77)
    base = s[("hf", "overall")]
    assert base.speedup == 1.0 and base.speedup_std == 0.0
    assert base.mean_accepted == pytest.approx(211 / 212)
    # The same run against pld as the baseline: the reciprocal of the ratio of means.
    assert summarize(hand_records(), baseline="pld")[("hf", "qa")].speedup == pytest.approx(3 / 5)


def test_speed_table_numbers():
    table = markdown_table(summarize(hand_records(), "hf"), ["hf", "pld"])
    pld_row = next(line for line in table.splitlines() if line.startswith("| `pld`"))
    cells = [c.strip() for c in pld_row.strip("|").split("|")]
    # Method | QA | RAG | Overall | Mean accepted | Tokens/s | Overhead | Overhead, decode (none reported: "–")
    assert cells == ["`pld`", "1.67×±0.35", "2.50×±0.00", "1.88×±0.50", "2.74", "25.0", "–", "–"]
    assert "QA (n=2)" in table and "RAG (n=1)" in table and "Overall (n=3)" in table


def test_overhead_share_by_hand():
    # pld reports forward / outside-forward times: q1 900/100 ms + 450/50 ms, q2 570/30 ms.
    timed = {(1, 1): (900.0, 100.0), (1, 2): (450.0, 50.0), (2, 1): (570.0, 30.0), (3, 1): (380.0, 20.0)}
    recs = [dataclasses.replace(r, forward_ms=timed[(r.question_id, r.turn)][0],
                                overhead_ms=timed[(r.question_id, r.turn)][1]) if r.method == "pld" else r
            for r in hand_records()]
    s = summarize(recs, "hf")
    assert s[("pld", "qa")].overhead_pct == pytest.approx(100 * 180 / 2100)  # (100+50+30) / (1920+180)
    assert s[("pld", "overall")].overhead_pct == pytest.approx(100 * 200 / 2500)
    assert math.isnan(s[("hf", "overall")].overhead_pct)  # the peers report no split
    pld_row = next(line for line in markdown_table(s, ["hf", "pld"]).splitlines() if line.startswith("| `pld`"))
    assert pld_row.rstrip(" |").endswith("8.0% | –")  # no prompt forward reported: no decode-only share
    # The decoding steps alone: each turn's prompt forward (prefill_ms) taken out of the total.
    recs = [dataclasses.replace(r, prefill_ms=400.0) if r.method == "pld" else r for r in recs]
    s = summarize(recs, "hf")
    assert s[("pld", "qa")].decode_overhead_pct == pytest.approx(100 * 180 / (2100 - 3 * 400))
    assert s[("pld", "overall")].decode_overhead_pct == pytest.approx(100 * 200 / (2500 - 4 * 400))
    assert math.isnan(s[("hf", "overall")].decode_overhead_pct)
    pld_row = next(line for line in markdown_table(s, ["hf", "pld"]).splitlines() if line.startswith("| `pld`"))
    assert pld_row.rstrip(" |").endswith(f"8.0% | {100 * 200 / 900:.1f}%")


def test_decode_only_speed_by_hand():
    """Each turn's first step leaves the decode-only figures: its time and the tokens it gave."""
    # (first step ms, its tokens) per (method, question, turn); hf leaves q3 unreported at first.
    first = {("hf", 1, 1): (1000.0, 1), ("hf", 1, 2): (1000.0, 1), ("hf", 2, 1): (1000.0, 1),
             ("hf", 3, 1): (1000.0, 1), ("pld", 1, 1): (1000.0, 1), ("pld", 1, 2): (1000.0, 1),
             ("pld", 2, 1): (500.0, 4), ("pld", 3, 1): (1000.0, 1)}
    recs = [dataclasses.replace(r, prefill_ms=first[(r.method, r.question_id, r.turn)][0],
                                prefill_tokens=first[(r.method, r.question_id, r.turn)][1]) for r in hand_records()]
    s = summarize(recs, "hf")
    # hf: q1 (100 - 2) / (10 - 2) s, q2 59 / 2, q3 49 / 4; pld: q1 98 / 3, q2 56 / 1.5, q3 49 / 1.
    hf = [98 / 8, 59 / 2, 49 / 4]
    pld = [98 / 3, 56 / 1.5, 49 / 1]
    assert s[("pld", "qa")].decode_tokens_per_s == pytest.approx((pld[0] + pld[1]) / 2)
    assert s[("pld", "qa")].decode_speedup == pytest.approx((pld[0] + pld[1]) / (hf[0] + hf[1]))
    assert s[("pld", "overall")].decode_speedup == pytest.approx(sum(pld) / sum(hf))
    # Leaving out what every method pays alike moves the ratio away from 1: here above the whole calls'.
    assert s[("pld", "overall")].decode_speedup > s[("pld", "overall")].speedup
    table = markdown_table(s, ["hf", "pld"])
    assert "Decode only: speedup over `hf`" in table
    row = [line for line in table.splitlines() if line.startswith("| `pld`")][-1]
    assert row.split("|")[-2].strip() == f"{sum(pld) / sum(hf):.2f}× / {sum(pld) / 3:.1f}"
    # A method that does not report its first step gets no decode-only figure, and a run where
    # none does gets no such table.
    unreported = [dataclasses.replace(r, prefill_ms=math.nan) if r.method == "hf" and r.question_id == 3 else r
                  for r in recs]
    # Against a second baseline the decode-only table gets its overall column too.
    table = markdown_table(s, ["hf", "pld"], summarize(recs, "pld"))
    row = [line for line in table.splitlines() if line.startswith("| `hf`")][-1]
    assert row.split("|")[-2].strip() == f"{sum(hf) / sum(pld):.2f}×"
    s = summarize(unreported, "pld")
    assert math.isnan(s[("hf", "overall")].decode_speedup) and not math.isnan(s[("hf", "qa")].decode_speedup)
    assert "Decode only" not in markdown_table(summarize(hand_records(), "hf"), ["hf", "pld"])


def test_both_kinds_of_method_time_their_first_step(tiny, monkeypatch):
    """transformers' peer times its prefill from the prompt's streamer put to the first token's;
    lookupdec's method reports its first step's forward, the drafter's ``begin`` left out."""
    import specbench.methods as methods_module
    import torch
    from specbench.methods import HFGenerate, LookupdecMethod

    from lookupdec import Decoder
    from tests.conftest import FLAT

    prompt = list(range(5, 25))
    hf = HFGenerate("hf", tiny.model, tiny.eos_ids).generate(prompt, 8)
    assert hf.step_lengths[0] == 1 and 0 < hf.prefill_ms < math.inf

    dec = Decoder(tiny, cost_curve=FLAT)
    seen = []
    real = dec.generate
    monkeypatch.setattr(dec, "generate", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    out = LookupdecMethod(dec, "pld").generate(prompt, 8)
    first = seen[0].step_stats[0]
    assert out.prefill_ms == pytest.approx(first.verify_ms + first.other_ms) and out.step_lengths[0] == 1

    # The streamer's clock: puts at 10.0 s (the prompt), 10.25 s and 10.5 s.
    ticks = iter([10.0, 10.25, 10.5])
    monkeypatch.setattr(methods_module, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(ticks))}))
    rec = methods_module._StepRecorder()
    for value in ([1, 2, 3], [4, 5], [6]):
        rec.put(torch.tensor(value))
    assert rec.prefill_ms == pytest.approx(250.0) and rec.lengths == [2, 1]


def test_turns_below_the_threshold_by_hand():
    from specbench.metrics import turn_shortfalls
    from specbench.report import turn_table

    # Per turn, pld / hf tokens/s: q1 t1 (60/3)/(60/6) = 2.0, q1 t2 (40/2)/(40/4) = 2.0, q2 1.5, q3 2.5.
    # Against pld, hf's turns are the reciprocals: every one below 0.97, the lowest 0.4 (q3).
    t = turn_shortfalls(hand_records(), "pld")["hf"]
    assert (t.turns, t.below, t.lowest, t.lowest_at) == (4, 4, pytest.approx(0.4), (3, 1))
    assert t.decode_below == -1  # no first steps reported
    slow_q2 = [dataclasses.replace(r, seconds=61.0) if (r.method, r.question_id) == ("pld", 2) else r
               for r in hand_records()]  # pld's q2 now at 60/61 tok/s against hf's 20: 0.049x
    t = turn_shortfalls(slow_q2, "hf")["pld"]
    assert (t.below, t.lowest_at) == (1, (2, 1)) and t.lowest == pytest.approx((60 / 61) / 20)
    # Decode only, each first step taking 1 s and one token: hf q1 turn 1 (59 / 5 s), pld (59 / 2 s).
    timed = [dataclasses.replace(r, prefill_ms=1000.0) for r in hand_records()]
    t = turn_shortfalls(timed, "hf", threshold=2.7)["pld"]
    # Whole calls 2.0, 2.0, 1.5, 2.5; decode only (59/2)/(59/5) = 2.5, (39/1)/(39/3) = 3, (59/1)/(59/2) = 2,
    # (49/1)/(49/4) = 4: all four under 2.7 whole, two decode only.
    assert (t.below, t.decode_below) == (4, 2)
    table = turn_table(turn_shortfalls(hand_records(), "hf"), ["hf", "pld"])
    assert "| `pld` | 4 | 0 | – | 1.50× (q2, turn 1) |" in table and "`hf@fresh`" in table
    assert turn_table({}, ["hf"]) == ""
    with pytest.raises(ValueError, match="baseline 'ar'"):
        turn_shortfalls(hand_records(), "ar")


def test_summarize_refuses_uneven_question_sets():
    recs = hand_records()[:-1]  # pld lacks question 3
    with pytest.raises(ValueError, match="pld"):
        summarize(recs, "hf")
    with pytest.raises(ValueError, match="baseline 'ar'"):
        summarize(recs, "ar")


def test_step_lengths_from_stats():
    from types import SimpleNamespace as S
    assert step_lengths_from_stats([S(accepted=0), S(accepted=3), S(accepted=2)], 6) == (1, 4, 1)
    assert step_lengths_from_stats([S(accepted=1)] * 3, 6) == (2, 2, 2)
    assert step_lengths_from_stats([], 0) == ()


# ---------------------------------------------------------------- the whole harness with fakes

def test_choose_methods():
    assert choose_methods("pld,hf", ["hf", "ar", "pld"]) == ["ar", "pld", "hf"]
    assert choose_methods("all", ["hf", "hf_pld", "ar", "pld"]) == ["ar", "hf", "hf_pld", "pld"]
    with pytest.raises(ValueError, match="medusa.*unknown"):
        choose_methods("ar,medusa", ["ar"])
    with pytest.raises(ValueError, match="llma.*not registered"):
        choose_methods("ar,llma", ["hf", "ar", "pld"])
    assert choose_methods("pld@fresh,pld", ["ar", "pld"]) == ["ar", "pld@fresh", "pld"]
    with pytest.raises(ValueError, match="the state after '@'"):
        choose_methods("ar,pld@warm", ["ar", "pld"])
    with pytest.raises(ValueError, match="hf@fresh"):  # a peer has no drafting state
        choose_methods("ar,hf@fresh", ["hf", "ar"])


def test_full_run_writes_json_table_and_plots(qfile, tmp_path, capsys):
    methods = {"hf": FakeMethod("hf"), "ar": FakeMethod("ar", drop_eos=True), "pld": FakeMethod("pld", chunk=3),
               "llma": FakeMethod("llma", chunk=2, takes_references=True)}
    out = tmp_path / "out"
    assert run_main(qfile, out, methods) == 0
    doc = json.loads((out / "spec_bench.json").read_text())
    n_turns = sum(len(q["turns"]) for q in QUESTIONS)
    assert len(doc["records"]) == n_turns * len(methods)
    assert doc["error"] is None and doc["config"]["methods"] == ["ar", "hf", "pld", "llma"]
    r = next(x for x in doc["records"] if x["method"] == "pld" and x["question_id"] == 81 and x["turn"] == 2)
    for key in ("task", "new_tokens", "seconds", "steps", "tokens_per_s", "accept_hist", "token_ids"):
        assert key in r
    assert r["task"] == "mt_bench" and r["new_tokens"] == len(r["token_ids"])
    # The histogram covers every committed token (a final EOS included), in chunks of 3.
    assert sum(int(k) * v for k, v in r["accept_hist"].items()) == r["committed_tokens"]
    assert r["committed_tokens"] == r["new_tokens"] + (r["new_tokens"] < 12) and r["steps"] == -(-r["committed_tokens"] // 3)
    assert set(doc["summary"]) == {"hf", "ar"}  # speedups against hf and against ar
    assert doc["summary"]["hf"]["pld"]["overall"]["mean_accepted"] > 2
    for name in ("spec_bench.md", "speedup.png", "accepted_hist.png"):
        assert (out / name).stat().st_size > 0
    for png in ("speedup.png", "accepted_hist.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "Overall vs ar" in printed
    rows = [line.split("|")[1].strip() for line in printed.splitlines() if line.startswith("| `")]
    # Two tables, each with one row per method, the baseline first; then the turns against ar.
    assert rows == ["`hf`", "`ar`", "`pld`", "`llma`"] * 2 + ["`hf`", "`pld`", "`llma`"]
    assert "Turns below 0.97x `ar`'s tokens/s" in printed
    assert {m: (t["turns"], t["decode_below"]) for m, t in doc["turns"].items()} == \
        {m: (n_turns, -1) for m in ("hf", "pld", "llma")}  # the fakes report no first step


class LearningMethod(FakeMethod):
    """A fake that learns: each call commits ``1 + learnt`` tokens a step, then learns one more."""

    def __init__(self, name):
        super().__init__(name)
        self.learnt = 0
        self.chunks = []  # each call's tokens per step

    def snapshot(self):
        return {"learnt": self.learnt}

    def restore(self, snapshot):
        self.learnt = snapshot["learnt"]

    def generate(self, prompt_ids, max_new_tokens, references=()):
        self.chunk = 1 + self.learnt
        self.chunks.append(self.chunk)
        self.learnt += 1
        return super().generate(prompt_ids, max_new_tokens, references)


def test_repeats_start_from_the_state_the_first_repeat_started_from(qfile):
    """A method that learns from its calls: every repeat of a turn starts where the first did, and
    the next turn starts where the first repeat left it (as with one repeat)."""
    qs = load_questions(qfile, per_category=1)[:2]
    runs = {}
    for repeats in (1, 3):
        learner = LearningMethod("pld")
        recs = run_benchmark(qs, {"ar": FakeMethod("ar"), "pld": learner}, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                             RunConfig(max_new_tokens=12, repeats=repeats, warmup_tokens=0))
        runs[repeats] = (learner.chunks, [r.steps for r in recs if r.method == "pld"], learner.learnt)
    (chunks1, steps1, learnt1), (chunks3, steps3, learnt3) = runs[1], runs[3]
    assert chunks3 == [c for c in chunks1 for _ in range(3)]  # every repeat drafted as the first
    assert steps3 == steps1 and learnt3 == learnt1 == len(chunks1) >= 2  # and the run went on as with one
    assert len(set(chunks1)) == len(chunks1)  # the state mattered: each turn drafted otherwise


def test_a_kept_decoder_repeats_a_call_from_its_snapshot(tiny, monkeypatch):
    """``LookupdecMethod.snapshot``/``restore`` on a real decoder: a call from the snapshot drafts as
    the first did; a call from the learnt state drafts otherwise (Token Recycling learnt the text).
    The cost model, shared by every copy (it measures the machine), is kept from learning the
    steps' wall-clock times here, so that drafting depends on the drafting state alone."""
    from lookupdec.decoder import Decoder
    from specbench.methods import LookupdecMethod
    from tests.conftest import FLAT

    dec = Decoder(tiny, cost_curve=FLAT)
    monkeypatch.setattr(dec.costs(), "observe", lambda timing: None)
    method = LookupdecMethod(dec, "recycle")
    prompt = [5, 6, 7, 8, 9] * 3
    before = method.snapshot()
    first = method.generate(prompt, 40)
    learnt = method.snapshot()
    again = method.generate(prompt, 40)
    method.restore(before)
    repeated = method.generate(prompt, 40)
    assert repeated.step_lengths == first.step_lengths
    assert again.step_lengths != first.step_lengths
    assert again.token_ids == first.token_ids == repeated.token_ids
    method.restore(learnt)
    assert method.generate(prompt, 40).step_lengths == again.step_lengths
    assert LookupdecMethod(dec, "ar").snapshot() is None


def test_turn_two_context_and_references(qfile):
    ar, llma, pld = FakeMethod("ar"), FakeMethod("llma", takes_references=True), FakeMethod("pld")
    qs = load_questions(qfile)
    recs = run_benchmark(qs, {"pld": pld, "ar": ar, "llma": llma}, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                         RunConfig(max_new_tokens=12, warmup_tokens=4))
    # Warm-up: one short call per method, not recorded.
    assert ar.calls[0][1] == 4 and len(recs) == 3 * sum(len(q.turns) for q in qs)
    # Every method got the same prompt ids on every turn; ar ran first.
    assert [c[0] for c in ar.calls] == [c[0] for c in pld.calls] == [c[0] for c in llma.calls]
    # Turn 2 of question 81 holds turn 1's question and ar's answer.
    t1_prompt, t2_prompt = ar.calls[1][0], ar.calls[2][0]
    answer = FakeCodec().decode(canonical(fake_greedy(t1_prompt, 12), (EOS,)))
    assert t2_prompt == FakeCodec().encode([{"role": "user", "content": QUESTIONS[0]["turns"][0]},
                                            {"role": "assistant", "content": answer},
                                            {"role": "user", "content": QUESTIONS[0]["turns"][1]}])
    # References: the rag passages and the summarization article.
    refs = {c[2] for c in llma.calls if c[2]}
    assert ("Tea A tea is a drink.", "Coffee Coffee is too.") in refs
    assert ("The fox ran. The dog slept.",) in refs


@pytest.mark.parametrize("position", [0, 5])
def test_broken_method_fails_loudly(qfile, tmp_path, capsys, position):
    methods = {"ar": FakeMethod("ar"), "hf": FakeMethod("hf"), "pld": FakeMethod("pld", break_at=position)}
    rc = run_main(qfile, tmp_path / "out", methods)
    err = capsys.readouterr().err
    assert rc == 1
    assert "'pld'" in err and "question 81" in err and "turn 1" in err and f"position {position}" in err
    # The figures gathered before the failure are kept, with the error, and no summary.
    doc = json.loads((tmp_path / "out" / "spec_bench.json").read_text())
    assert "position" in doc["error"] and doc["summary"] == {}
    assert not (tmp_path / "out" / "spec_bench.md").exists()


def test_keep_going_finishes_the_run_lists_every_difference_and_still_fails(qfile, tmp_path, capsys):
    """--keep-going: the run ends with its tables, every differing turn is named, the exit status is 1."""
    methods = {"ar": FakeMethod("ar"), "hf": FakeMethod("hf"), "pld": FakeMethod("pld", break_at=2)}
    rc = run_main(qfile, tmp_path / "out", methods, extra=["--keep-going"])
    err = capsys.readouterr().err
    assert rc == 1
    n_turns = sum(len(q.turns) for q in load_questions(qfile))
    listed = [line for line in err.splitlines() if line.startswith("spec_bench: OUTPUT MISMATCH: method 'pld'")]
    assert len(listed) == n_turns and all("position 2" in line for line in listed)
    doc = json.loads((tmp_path / "out" / "spec_bench.json").read_text())
    assert doc["summary"] and doc["error"].count("OUTPUT MISMATCH") == n_turns
    assert (tmp_path / "out" / "spec_bench.md").exists()


def test_truncated_output_is_caught(qfile):
    methods = {"ar": FakeMethod("ar"), "pld": FakeMethod("pld", truncate=2)}
    with pytest.raises(OutputMismatch, match="truncated") as ei:
        run_benchmark(load_questions(qfile), methods, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                      RunConfig(max_new_tokens=12))
    assert ei.value.method == "pld" and ei.value.question_id == 81


def test_mismatch_on_turn_two_is_reported_on_turn_two(qfile):
    methods = {"ar": FakeMethod("ar"), "pld": FakeMethod("pld", break_at=3, broken_turn=2)}
    records = []
    with pytest.raises(OutputMismatch) as ei:
        run_benchmark(load_questions(qfile), methods, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                      RunConfig(max_new_tokens=12), records=records)
    assert (ei.value.question_id, ei.value.turn, ei.value.position) == (81, 2, 3)
    assert len(records) == 2  # turn 1 of both methods was recorded before the failure


def test_mismatch_in_a_later_repeat_is_caught(qfile):
    # Call 1 is the warm-up, call 2 the first timed repeat; call 3 (second repeat) is broken.
    methods = {"ar": FakeMethod("ar"), "pld": FakeMethod("pld", break_at=1, break_on_call=3)}
    with pytest.raises(OutputMismatch) as ei:
        run_benchmark(load_questions(qfile), methods, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                      RunConfig(max_new_tokens=12, repeats=2))
    assert ei.value.position == 1


def test_repeats_take_the_median(qfile):
    methods = {"ar": FakeMethod("ar"), "pld": FakeMethod("pld")}
    recs = run_benchmark(load_questions(qfile, per_category=1)[:1], methods, FakeCodec(),
                         ExactnessCheck("ar", (EOS,)), RunConfig(max_new_tokens=12, repeats=3))
    for r in recs:
        assert len(r.seconds_repeats) == 3 and r.seconds == sorted(r.seconds_repeats)[1]


def test_bad_arguments_exit_2(qfile, tmp_path, capsys):
    assert main(["--questions", str(tmp_path / "missing.jsonl")], setup=fake_setup({})) == 2
    assert main(["--questions", str(qfile), "--methods", "ar,nope"], setup=fake_setup({})) == 2
    assert "nope" in capsys.readouterr().err


def test_llma_on_tasks_without_documents_is_refused_before_loading(qfile, capsys):
    # The real registry decides (available=None); llma needs a prompt's documents, which only
    # summarization and rag carry, so asking for it on mt_bench stops before any model is loaded.
    def no_setup(args, names):
        raise AssertionError("setup must not run")

    assert main(["--questions", str(qfile), "--tasks", "mt_bench,rag", "--methods", "ar,llma"], setup=no_setup) == 2
    assert "llma' needs documents" in capsys.readouterr().err


def test_docstring_examples():
    import doctest

    from specbench import cli, documents, exactness, methods, metrics, tasks
    for mod in (tasks, documents, exactness, methods, metrics, cli):
        result = doctest.testmod(mod, extraglobs={"TurnRecord": TurnRecord})
        assert result.failed == 0, mod.__name__


def test_a_history_learns_each_reference_answer_only_after_every_method_ran_it(qfile):
    """What the store holds while a turn runs: the answers of earlier turns, never this turn's own."""
    store: list[tuple[int, ...]] = []
    seen: list[tuple[int, int]] = []  # (answers stored, method call) at every generate

    class Watching(FakeMethod):
        def generate(self, prompt_ids, max_new_tokens, references=()):
            seen.append((len(store), len(self.calls)))
            return super().generate(prompt_ids, max_new_tokens, references)

    qs = load_questions(qfile)
    run_benchmark(qs, {"ar": Watching("ar"), "pld": Watching("pld")}, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                  RunConfig(max_new_tokens=12, warmup_tokens=0), on_answer=store.append)
    turns = sum(len(q.turns) for q in qs)
    assert len(store) == turns  # one reference answer per turn
    # Both methods of turn k saw exactly k answers stored.
    assert [n for n, _ in seen] == [k for k in range(turns) for _ in range(2)]


def test_sampled_runs_compare_only_methods_that_draw_as_the_reference(qfile):
    # A method that does not draw as the reference does (transformers' sampling, 'draft') may differ
    # in a sampled run, and turn 2 still continues the reference's answer; one that does is checked.
    ar, pld = FakeMethod("ar"), FakeMethod("pld", break_at=1)
    qs = load_questions(qfile)
    recs = run_benchmark(qs, {"ar": ar, "pld": pld}, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                         RunConfig(max_new_tokens=12, warmup_tokens=0, sampled=True))
    assert len(recs) == 2 * sum(len(q.turns) for q in qs)
    assert [c[0] for c in ar.calls] == [c[0] for c in pld.calls]  # same prompts, turn 2 included
    same = FakeMethod("pld", break_at=1)
    same.same_draws = True
    with pytest.raises(OutputMismatch):
        run_benchmark(qs, {"ar": FakeMethod("ar"), "pld": same}, FakeCodec(), ExactnessCheck("ar", (EOS,)),
                      RunConfig(max_new_tokens=12, warmup_tokens=0, sampled=True))
    with pytest.raises(OutputMismatch):  # the same methods greedy: the broken one is caught
        run_benchmark(qs, {"ar": FakeMethod("ar"), "pld": FakeMethod("pld", break_at=1)}, FakeCodec(),
                      ExactnessCheck("ar", (EOS,)), RunConfig(max_new_tokens=12, warmup_tokens=0))


def test_temperature_and_seed_reach_every_method():
    from specbench.cli import build_setup
    from specbench.methods import HFGenerate, LookupdecMethod

    class FakeDecoder:
        loaded = type("L", (), {"eos_ids": (EOS,), "name": "fake"})()
        tokenizer = None

    class FakeLoaded:
        model = type("M", (), {"eval": lambda self: self})()

    setup = build_setup(FakeDecoder(), FakeLoaded(), ["ar", "hf", "pld"], temperature=0.7, seed=3)
    assert isinstance(setup.methods["hf"], HFGenerate) and isinstance(setup.methods["pld"], LookupdecMethod)
    assert all((m.temperature, m.seed) == (0.7, 3) for m in setup.methods.values())
    # Sampled, lookupdec's methods are compared with ar (same draws per position); transformers' are not.
    assert setup.methods["pld"].same_draws and not getattr(setup.methods["hf"], "same_draws", False)
