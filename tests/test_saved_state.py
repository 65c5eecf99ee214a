"""A decoder's drafting state saved to disk and read back (``lookupdec/drafters/saved.py``)."""
from __future__ import annotations

import io
import json
import logging
import math

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec import Decoder
from lookupdec.drafters.saved import FORMAT, VERSION, StateFileError, read_state
from tests.conftest import FLAT, TINY_VOCAB, save_tiny, tiny_loaded

PROMPT = "abcdabcdabcdxyzabcdab"


def learned_decoder() -> Decoder:
    """A decoder that has drafted greedily and sampled at 0.8 with ``auto`` (rates, tables, ledgers)."""
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    dec.generate(PROMPT, max_new_tokens=40, chat_template=False)
    dec.generate(PROMPT, max_new_tokens=40, temperature=0.8, seed=3, chat_template=False)
    return dec


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the decoder that learned, the path its state was saved to)."""
    dec = learned_decoder()
    path = tmp_path_factory.mktemp("state") / "state.npz"
    assert dec.save_state(path)
    return dec, path


def ledger_view(led) -> dict:
    return {"totals": (led.n, led.tokens, led.ms, led.budget_ms, led.probe_spent_ms, led.total_ms),
            "keep": sorted(led._keep), "accounts": sorted(map(repr, led.accounts))}


def test_round_trip_restores_rates_tables_and_ledgers(saved):
    dec, path = saved
    fresh = Decoder(tiny_loaded(0), cost_curve=FLAT)
    assert fresh.state.calibration._fine == {}
    assert fresh.load_state(path)
    src, got = dec.state.calibration, fresh.state.calibration
    assert got is fresh.calibration  # filled in place: drafters holding it see the rates
    assert got._fine == src._fine and got._coarse == src._coarse and len(src._fine) > 0
    assert set(got._bands) == set(src._bands) == {2}  # 0.8 is band 2
    assert got._bands[2]._fine == src._bands[2]._fine and len(src._bands[2]._fine) > 0
    assert got.band(0.8) is got._bands[2] and got._bands[2]._parent is got
    assert set(fresh.state.recycle_tables) == set(dec.state.recycle_tables) != set()
    for key, table in dec.state.recycle_tables.items():
        mine = fresh.state.recycle_tables[key]
        rows = len(mine.ids)  # the table grows by doubling; rows past the vocabulary are never written
        assert mine.k == table.k and rows == min(len(table.ids), TINY_VOCAB) and (table.ids[rows:] == -1).all()
        assert np.array_equal(mine.ids, table.ids[:rows]) and np.array_equal(mine.probs, table.probs[:rows])
        assert (table.ids >= 0).any()  # something was learned
    assert set(fresh.state.ledgers) == set(dec.state.ledgers) != set()
    for key, led in dec.state.ledgers.items():
        assert ledger_view(fresh.state.ledgers[key]) == ledger_view(led)


def test_a_decoder_started_from_a_saved_state_decodes_exactly(saved):
    dec, path = saved
    loaded = Decoder(tiny_loaded(0), cost_curve=FLAT)
    assert loaded.load_state(path)
    source = next(iter(dec.state.calibration._fine))[0]
    assert loaded.state.calibration.observations(source) == dec.state.calibration.observations(source) > 0
    cold = Decoder(tiny_loaded(0), cost_curve=FLAT)
    prompt = "xyzabcdabcdabcdxyzab"
    for settings in ({}, {"temperature": 0.8, "seed": 11}, {"temperature": 1.0, "seed": 5}):
        ar = cold.generate(prompt, method="ar", max_new_tokens=48, chat_template=False, **settings)
        warm = loaded.generate(prompt, max_new_tokens=48, chat_template=False, **settings)
        assert warm.token_ids == ar.token_ids, settings
        if not settings:  # greedy on this repetitive model: it drafted, and drafts were accepted
            assert sum(warm.accepted_by_source.values()) > 0


def _rewrite(path, out, edit=None, arrays_edit=None):
    """A copy of the state file at ``path`` written to ``out``, its header or arrays edited."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes().decode())
    if edit is not None:
        edit(meta)
    if arrays_edit is not None:
        arrays_edit(arrays)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(out, "wb") as f:
        np.savez(f, **arrays)


def _set(path_in_meta, value):
    def edit(meta):
        node = meta
        for k in path_in_meta[:-1]:
            node = node[k]
        node[path_in_meta[-1]] = value
    return edit


def _first_fine(meta, value_at, value):
    meta["calibration"]["rates"]["fine"][0][value_at] = value


def _object_array(arrays):
    arrays["ids0"] = np.array([["x"]], dtype=object)


DAMAGED = {
    "empty file": lambda p, out: out.write_bytes(b""),
    "not an archive": lambda p, out: out.write_bytes(b"lookupdec? no: random bytes \x00\xff" * 10),
    "truncated archive": lambda p, out: out.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "flipped byte": lambda p, out: out.write_bytes(p.read_bytes()[:200] + bytes([p.read_bytes()[200] ^ 0xFF])
                                                   + p.read_bytes()[201:]),
    "another format": lambda p, out: _rewrite(p, out, _set(["format"], "something-else")),
    "another version": lambda p, out: _rewrite(p, out, _set(["version"], VERSION + 1)),
    "another vocabulary": lambda p, out: _rewrite(p, out, _set(["vocab_size"], TINY_VOCAB + 1)),
    "header not JSON": lambda p, out: _rewrite(p, out, arrays_edit=lambda a: None) or _corrupt_header(out),
    "no calibration": lambda p, out: _rewrite(p, out, lambda m: m.pop("calibration")),
    "a count that is negative": lambda p, out: _rewrite(p, out, lambda m: _first_fine(m, -1, -3.0)),
    "hits above the total": lambda p, out: _rewrite(p, out, lambda m: _first_fine(m, -2, 1e9)),
    "a key of the wrong type": lambda p, out: _rewrite(p, out, lambda m: _first_fine(m, 1, "deep")),
    "a count that is not a number": lambda p, out: _rewrite(p, out, lambda m: _first_fine(m, -1, None)),
    "an unknown band": lambda p, out: _rewrite(p, out, _set(["calibration", "bands", "9"],
                                                            {"fine": [], "coarse": []})),
    "a token id out of range": lambda p, out: _rewrite(p, out, arrays_edit=lambda a: a["ids0"].__setitem__(
        (0, 0), TINY_VOCAB)),
    "a probability that is NaN": lambda p, out: _rewrite(p, out, arrays_edit=lambda a: a["probs0"].__setitem__(
        (0, 0), math.nan)),
    "a table of the wrong shape": lambda p, out: _rewrite(p, out, arrays_edit=lambda a: a.__setitem__(
        "ids0", a["ids0"][:, :1].copy())),
    "a table's arrays missing": lambda p, out: _rewrite(p, out, arrays_edit=lambda a: a.pop("probs0")),
    "a pickled object array": lambda p, out: _rewrite_raw(p, out, _object_array),
    "a ledger account malformed": lambda p, out: _rewrite(p, out, lambda m: m["ledgers"][0]["accounts"][0].pop("ms")),
    "a ledger total negative": lambda p, out: _rewrite(p, out, lambda m: m["ledgers"][0]["totals"].update(ms=-1.0)),
    "a boolean where a band goes": lambda p, out: _rewrite(p, out, lambda m: m["ledgers"][0].update(band=True)),
}


def _corrupt_header(out):
    with np.load(out, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["meta"] = np.frombuffer(b"{not json", np.uint8)
    with open(out, "wb") as f:
        np.savez(f, **arrays)


def _rewrite_raw(path, out, arrays_edit):
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays_edit(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    out.write_bytes(buf.getvalue())


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_state_file_is_ignored_with_a_warning(saved, tmp_path, damage, caplog):
    _, path = saved
    bad = tmp_path / "bad.npz"
    DAMAGED[damage](path, bad)
    with pytest.raises(StateFileError):
        read_state(bad, TINY_VOCAB)
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    with caplog.at_level(logging.WARNING, logger="lookupdec.state"):
        assert not dec.load_state(bad)
    assert str(bad) in caplog.text and "ignoring" in caplog.text
    assert dec.state.calibration._fine == {} and dec.state.recycle_tables == {} and dec.state.ledgers == {}


def test_a_damaged_state_file_still_decodes_exactly(saved, tmp_path):
    _, path = saved
    bad = tmp_path / "bad.npz"
    DAMAGED["a token id out of range"](path, bad)
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    assert not dec.load_state(bad)
    ar = dec.generate(PROMPT, method="ar", max_new_tokens=30, chat_template=False)
    assert dec.generate(PROMPT, max_new_tokens=30, chat_template=False).token_ids == ar.token_ids


def test_a_missing_file_loads_nothing_quietly(tmp_path, caplog):
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    with caplog.at_level(logging.WARNING, logger="lookupdec.state"):
        assert not dec.load_state(tmp_path / "none.npz")
    assert caplog.text == ""


def test_save_replaces_the_file_whole_and_an_unwritable_place_only_loses_the_state(saved, tmp_path, caplog):
    dec, _ = saved
    target = tmp_path / "s" / "state.npz"
    target.parent.mkdir()
    target.write_bytes(b"an older, damaged file")
    assert dec.save_state(target)
    assert [p.name for p in target.parent.iterdir()] == ["state.npz"]  # no temporary file left
    assert read_state(target, TINY_VOCAB).calibration._fine == dec.state.calibration._fine
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="lookupdec.state"):
        assert not dec.save_state(blocker / "state.npz")
    assert "could not save" in caplog.text


def test_the_header_names_format_version_and_vocabulary(saved):
    _, path = saved
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(npz["meta"].tobytes().decode())
    assert (meta["format"], meta["version"], meta["vocab_size"]) == (FORMAT, VERSION, TINY_VOCAB)


def test_the_default_path_depends_on_the_model_and_lives_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    a, b = Decoder(tiny_loaded(0), cost_curve=FLAT), Decoder(tiny_loaded(0, layers=3), cost_curve=FLAT)
    assert a.state_path().parent == tmp_path / "state" and a.state_path().suffix == ".npz"
    assert a.state_path() != b.state_path()


def test_a_new_curve_format_moves_the_curve_but_not_the_state(monkeypatch, tmp_path):
    import lookupdec.costs as costs

    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path))
    dec = Decoder(tiny_loaded(0), cost_curve=FLAT)
    threads = dec._torch.get_num_threads()
    curve, state = costs.curve_path(dec.verifier, threads), dec.state_path()
    monkeypatch.setattr(costs, "FORMAT", costs.FORMAT + 1)
    assert costs.curve_path(dec.verifier, threads) != curve
    assert dec.state_path() == state


def test_cli_generate_saves_the_state_reads_it_back_and_fresh_state_touches_nothing(tmp_path, monkeypatch):
    from lookupdec.cli import main

    model_dir = save_tiny(tmp_path / "model", 0)
    monkeypatch.setenv("LOOKUPDEC_CACHE", str(tmp_path / "cache"))
    state_dir = tmp_path / "cache" / "state"
    args = ["generate", "--model", model_dir, "--prompt", PROMPT, "--no-chat-template", "--max-new-tokens", "24",
            "--json"]
    r = CliRunner().invoke(main, args + ["--fresh-state"])
    assert r.exit_code == 0, r.output
    assert not state_dir.exists()
    first = json.loads(r.stdout)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    (saved_file,) = state_dir.iterdir()
    learned = read_state(saved_file, TINY_VOCAB)
    assert learned.calibration._fine and json.loads(r.stdout)["token_ids"] == first["token_ids"]
    # The next call starts from that state and saves what it added to it.
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    after = read_state(saved_file, TINY_VOCAB).calibration
    assert sum(t for _, t in after._coarse.values()) > sum(t for _, t in learned.calibration._coarse.values())
    assert json.loads(r.stdout)["token_ids"] == first["token_ids"]
    # A damaged file: a warning, the same output, and a good file saved in its place.
    saved_file.write_bytes(b"damaged")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "ignoring the saved drafting state" in r.stderr
    assert json.loads(r.stdout)["token_ids"] == first["token_ids"]
    assert read_state(saved_file, TINY_VOCAB).calibration._fine
