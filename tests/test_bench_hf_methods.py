"""The transformers peers of the Spec-Bench harness on a tiny random Llama.

Checks the step counting of ``HFGenerate`` (a streamer sees one ``put()`` per
forward pass) against a forward hook that counts the model's forward calls.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import torch  # noqa: E402  (imported, not importorskip: a broken torch must fail, never skip)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from specbench.exactness import ExactnessCheck  # noqa: E402
from specbench.methods import HFGenerate  # noqa: E402
from specbench.runner import RunConfig, run_benchmark  # noqa: E402
from specbench.tasks import Question  # noqa: E402

EOS = 2


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=EOS, pad_token_id=EOS, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


def count_forwards(model, fn):
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = fn()
    finally:
        handle.remove()
    return out, len(calls)


# A repetitive prompt gives prompt lookup something to match.
PROMPT = [5, 6, 7, 8, 9, 10, 11] * 4 + [5, 6, 7]


def test_plain_greedy_counts_one_token_per_forward(tiny_model):
    m = HFGenerate("hf", tiny_model, [EOS])
    out, forwards = count_forwards(tiny_model, lambda: m.generate(PROMPT, 20, ()))
    assert out.steps == forwards == len(out.token_ids)
    assert set(out.step_lengths) == {1}


def test_prompt_lookup_steps_equal_forward_calls(tiny_model):
    plain = HFGenerate("hf", tiny_model, [EOS]).generate(PROMPT, 20, ())
    m = HFGenerate("hf_pld", tiny_model, [EOS], prompt_lookup_num_tokens=10)
    out, forwards = count_forwards(tiny_model, lambda: m.generate(PROMPT, 20, ()))
    assert out.steps == forwards == len(out.step_lengths)
    assert sum(out.step_lengths) == len(out.token_ids)
    # With this seed the model repeats itself (63 63 63 ...), so some steps accept drafts.
    assert max(out.step_lengths) > 1 and out.steps < len(out.token_ids)
    assert out.token_ids == plain.token_ids  # transformers' prompt lookup is lossless here too


def test_peers_through_the_runner(tiny_model):
    # Token ids as a 'chat template': the runner only needs encode/decode.
    class Codec:
        def encode(self, messages):
            return [int(c) % 90 + 3 for m in messages for c in m["content"].split()]

        def decode(self, ids):
            return " ".join(str(i) for i in ids)

    q = Question(1, "writing", "mt_bench", ("5 6 7 8 9 5 6 7 8 9 5 6 7", "9 8 7"))
    methods = {"ar": HFGenerate("ar", tiny_model, [EOS]),
               "hf_pld": HFGenerate("hf_pld", tiny_model, [EOS], prompt_lookup_num_tokens=10)}
    recs = run_benchmark([q], methods, Codec(), ExactnessCheck("ar", (EOS,)), RunConfig(max_new_tokens=16))
    assert [(r.method, r.turn) for r in recs] == [("ar", 1), ("hf_pld", 1), ("ar", 2), ("hf_pld", 2)]
    assert recs[0].token_ids == recs[1].token_ids


@pytest.mark.slow
def test_spec_bench_end_to_end_on_a_tiny_model(tmp_path, capsys):
    """The harness's whole path with the real Decoder (ar, pld) and the transformers peers."""
    import json

    from lookupdec.decoder import Decoder
    from specbench.cli import build_setup, main
    from tests.conftest import tiny_loaded

    qfile = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["abc abc abc", "ab ab"]},
        {"question_id": 241, "category": "summarization", "turns": ["Summarize: one two one two"]},
        {"question_id": 481, "category": "rag", "turns": ["doc a b c\ndoc b c d\nq?"]},
    ]
    qfile.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    # Same seed, same weights: the peers' copy keeps transformers' default kernels.
    decoder, peer = Decoder(tiny_loaded(0)), tiny_loaded(0)

    def setup(args, names):
        return build_setup(decoder, peer, names)

    out = tmp_path / "out"
    rc = main(["--questions", str(qfile), "--out", str(out), "--max-new-tokens", "24",
               "--methods", "hf,hf_pld,ar,pld", "--warmup-tokens", "4"], setup=setup)
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "spec_bench.json").read_text())
    assert len(doc["records"]) == 4 * 4  # 4 methods x (2 + 1 + 1) turns
    by = {(r["method"], r["question_id"], r["turn"]): r for r in doc["records"]}
    for (method, qid, turn), r in by.items():
        assert r["token_ids"] == by[("ar", qid, turn)]["token_ids"]
        assert sum(int(k) * v for k, v in r["accept_hist"].items()) == r["committed_tokens"]
        assert r["steps"] == sum(r["accept_hist"].values())
    assert doc["summary"]["hf"]["hf"]["overall"]["speedup"] == 1.0
    assert doc["summary"]["hf"]["ar"]["overall"]["mean_accepted"] == pytest.approx(1.0)
    assert (out / "accepted_hist.png").stat().st_size > 0


def _observations(decoder) -> float:
    return sum(t for _, t in decoder.state.calibration._coarse.values())


def test_each_lookupdec_call_starts_from_the_state_its_method_name_asks_for(tmp_path):
    """``auto`` keeps what earlier calls taught the decoder; ``auto@fresh`` starts from nothing and
    ``auto@saved`` from the state file, each call anew; every output is ``ar``'s."""
    from lookupdec import Decoder
    from lookupdec.costs import CostCurve
    from specbench.cli import build_setup
    from tests.conftest import tiny_loaded

    decoder = Decoder(tiny_loaded(0), cost_curve=CostCurve((1, 128), (10.0, 10.5), 0, (0.0, 0.0), "test", "flat"))
    path = tmp_path / "state.npz"
    methods = build_setup(decoder, None, ["ar", "auto", "auto@fresh", "auto@saved"], state_file=path).methods
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 5, 6, 7]
    at_start = []  # what each call's decoder had learned when the call began
    generate = decoder.generate
    decoder.generate = lambda *a, **kw: (at_start.append(_observations(decoder)), generate(*a, **kw))[1]
    ar = methods["ar"].generate(ids, 30).token_ids
    assert methods["auto"].generate(ids, 30).token_ids == ar
    first = _observations(decoder)
    assert methods["auto"].generate(ids, 30).token_ids == ar
    second = _observations(decoder)
    assert at_start[-1] == first > 0 and second > first  # kept: the second call began where the first ended
    decoder.save_state(path)
    assert methods["auto@fresh"].generate(ids, 30).token_ids == ar
    assert at_start[-1] == 0  # from nothing learned
    assert methods["auto@saved"].generate(ids, 30).token_ids == ar
    assert at_start[-1] == second  # from the file
    methods["auto"].generate(ids, 30)
    assert at_start[-1] == second  # kept again: where the last kept call ended, untouched by the others
    path.write_bytes(b"damaged")
    with pytest.raises(ValueError, match="cannot read the drafting state"):
        methods["auto@saved"].generate(ids, 30)
