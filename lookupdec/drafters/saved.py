"""A decoder's drafting state on disk, so that a new process starts where the last one left off.

A ``Decoder`` learns as it generates (``drafters/state.py``): acceptance rates per source and
temperature band, Token Recycling's tables, ``auto``'s source accounts. A long-lived decoder
(a server, a pipeline) keeps them; a one-shot call (``lookupdec generate``) starts every time
with nothing learned, and there ``auto`` drafts on prior guesses (measured on 13 Spec-Bench
questions, AMD EPYC with AVX2: each call from nothing 1.12x ``ar``, each call from a state
learned on 26 other questions 1.22x; ``benchmarks/RESULTS.md``). ``save_state`` writes what can be carried over;
``load_state`` reads it back.

What is kept: the calibration (every band), the Token Recycling tables, the ``SourceLedger``
accounts. What is not: the per-request gates (their pauses are about the request that set them)
and the cost provider (the cost curve has its own cache). Nothing here changes an output token:
drafts are verified by the target whatever scored them.

The file is one ``.npz`` (read with ``allow_pickle=False``): a JSON header (``meta``, format name,
version, vocabulary size) and each table's two arrays. It is written to a temporary file and
renamed, so a reader never sees half of one. A file that cannot be read, or whose content does
not check out (another version, another vocabulary, a token id out of range, a count that is not
a count), is not used: ``load_state`` leaves the state as it was and says why (``StateFile.problem``,
which ``Decoder.load_state`` logs and the CLI prints as a warning).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from lookupdec.drafters.calibrate import TEMPERATURE_EDGES, Calibration
from lookupdec.drafters.ledger import SourceAccount, SourceLedger
from lookupdec.drafters.state import DrafterState

FORMAT = "lookupdec-drafting-state"
VERSION = 1
_BANDS = range(1, len(TEMPERATURE_EDGES) + 2)
_LEDGER_TOTALS = ("n", "tokens", "ms", "budget_ms", "probe_spent_ms", "total_ms")
_ACCOUNT_FIELDS = tuple(f.name for f in fields(SourceAccount))


class StateFileError(ValueError):
    """A saved drafting state that cannot be used (the message says why)."""


def default_path(verifier, threads: int, model_name: str) -> Path:
    """Where a decoder's state goes by default: in the cache, keyed like the cost curves (model, dtype,
    weight format, device, backend, threads: ``costs.curve_key``) and by the model's name, but not by
    torch's version or the curve format: the state file carries its own ``VERSION``, so a new curve
    format leaves the learned state where it was."""
    from lookupdec.costs import verifier_key
    from lookupdec.tokenizer import cache_root

    curve = verifier_key(verifier, threads, versioned=False)
    key = hashlib.sha256(f"{curve}|{model_name}".encode()).hexdigest()[:20]
    return cache_root() / "state" / f"{key}.npz"


def save_state(state: DrafterState, path: str | Path, vocab_size: int, warn: bool = False) -> StateFile:
    """Write what ``state`` has learned to ``path`` (atomically: a temporary file, then a rename).

    A file that cannot be written is a ``problem`` of the result (a read-only cache loses only
    itself), logged as a warning (logger ``lookupdec.state``) when ``warn``.
    """
    path = Path(path)
    try:
        _write(state, path, vocab_size)
    except OSError as exc:
        return _said(StateFile(path, False, f"could not save the drafting state to {path}: {exc}"), warn)
    return StateFile(path, True)


def _write(state: DrafterState, path: Path, vocab_size: int) -> None:
    arrays: dict[str, np.ndarray] = {}
    tables = []
    for i, ((k, method), table) in enumerate(sorted(state.recycle_tables.items())):
        tables.append({"k": int(k), "method": str(method)})
        rows = min(len(table.ids), int(vocab_size))  # the table grows by doubling: rows past the vocabulary are empty
        arrays[f"ids{i}"] = table.ids[:rows].astype(np.int32)
        arrays[f"probs{i}"] = table.probs[:rows].astype(np.float32)
    ledgers = []
    for (method, band), led in sorted(state.ledgers.items()):
        ledgers.append({"method": str(method), "band": int(band),
                        "totals": {name: float(getattr(led, name)) for name in _LEDGER_TOTALS},
                        "keep": sorted(led._keep),
                        "accounts": [{name: getattr(a, name) for name in _ACCOUNT_FIELDS} for a in led.accounts]})
    cal = state.calibration.root
    meta = {"format": FORMAT, "version": VERSION, "vocab_size": int(vocab_size),
            "calibration": {"rates": _rates(cal),
                            "bands": {str(b): _rates(c) for b, c in sorted(cal._bands.items())}},
            "tables": tables, "ledgers": ledgers}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_state(path: str | Path, vocab_size: int) -> DrafterState:
    """A ``DrafterState`` holding what the file at ``path`` saved (no cost provider, no draft model).

    Raises:
        OSError: the file cannot be read.
        StateFileError: its content is not a valid drafting state for a vocabulary of ``vocab_size``.
    """
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        raise StateFileError("not a drafting state file (not an .npz archive)")
    try:
        with np.load(Path(path), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise StateFileError(f"not a drafting state file ({exc})") from exc
    if "meta" not in arrays or arrays["meta"].dtype != np.uint8 or arrays["meta"].ndim != 1:
        raise StateFileError("no header")
    try:
        meta = json.loads(arrays["meta"].tobytes().decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise StateFileError(f"its header is not JSON ({exc})") from exc
    _require(isinstance(meta, dict) and meta.get("format") == FORMAT, "its header names another format")
    _require(meta.get("version") == VERSION, f"version {meta.get('version')!r}, this lookupdec reads {VERSION}")
    _require(meta.get("vocab_size") == int(vocab_size),
             f"saved for a vocabulary of {meta.get('vocab_size')!r} tokens, the model has {vocab_size}")
    state = DrafterState()
    cal = meta.get("calibration")
    _require(isinstance(cal, dict) and isinstance(cal.get("bands"), dict), "no calibration")
    _set_rates(state.calibration, cal.get("rates"))
    for b, rates in cal["bands"].items():
        _require(b.isdigit() and int(b) in _BANDS, f"unknown temperature band {b!r}")
        _set_rates(state.calibration._band_of(int(b)), rates)
    tables = meta.get("tables")
    _require(isinstance(tables, list), "no table list")
    for i, t in enumerate(tables):
        _require(isinstance(t, dict) and _is_int(t.get("k")) and 1 <= t["k"] <= 1024
                 and isinstance(t.get("method"), str), f"table {i} has no valid k and method")
        ids, probs = arrays.get(f"ids{i}"), arrays.get(f"probs{i}")
        _require(ids is not None and probs is not None, f"table {i}'s arrays are missing")
        _require(ids.dtype == np.int32 and probs.dtype == np.float32 and ids.ndim == 2
                 and ids.shape == probs.shape and ids.shape[1] == t["k"] and ids.shape[0] <= vocab_size,
                 f"table {i}'s arrays have the wrong type or shape")
        _require(bool(((ids >= -1) & (ids < vocab_size)).all()), f"table {i} holds a token id out of range")
        _require(bool(np.isfinite(probs).all() and ((probs >= 0) & (probs <= 1)).all()),
                 f"table {i} holds a probability outside [0, 1]")
        table = state.recycle_table(t["k"], t["method"])
        table.ids, table.probs = ids.astype(np.int64), probs.copy()
    ledgers = meta.get("ledgers")
    _require(isinstance(ledgers, list), "no ledger list")
    for i, entry in enumerate(ledgers):
        _require(isinstance(entry, dict) and isinstance(entry.get("method"), str) and _is_int(entry.get("band"))
                 and entry["band"] in range(len(TEMPERATURE_EDGES) + 2), f"ledger {i} has no valid method and band")
        state.ledgers[(entry["method"], entry["band"])] = _ledger(entry, i)
    return state


@dataclass(frozen=True)
class StateFile:
    """What became of a load or a save (true when it happened).

    Attributes:
        path: the file.
        done: the state was read from it (load) or written to it (save).
        problem: why not, in words ("" when done, and for a load that found no file: the first run has none).
    """

    path: Path
    done: bool
    problem: str = ""

    def __bool__(self) -> bool:
        return self.done


def load_state(target: DrafterState, path: str | Path, vocab_size: int, warn: bool = False) -> StateFile:
    """Fill ``target`` (a decoder's state, in place) from the file at ``path``, if it is there and valid.

    ``target`` keeps its cost provider and draft model, and its calibration object (drafters
    may hold it already). An unusable file leaves ``target`` as it was; ``problem`` says why
    (logged as a warning, logger ``lookupdec.state``, when ``warn``).
    """
    path = Path(path)
    if not path.exists():
        return StateFile(path, False)
    try:
        saved = read_state(path, vocab_size)
    except (OSError, StateFileError) as exc:
        return _said(StateFile(path, False, f"ignoring the saved drafting state {path}: {exc}; drafting starts "
                                            "from nothing learned (the next save replaces the file)"), warn)
    cal, src = target.calibration.root, saved.calibration
    cal._fine, cal._coarse = src._fine, src._coarse
    for b in set(cal._bands) | set(src._bands):  # bands already made keep their objects
        mine, theirs = cal._band_of(b), src._bands.get(b)
        mine._fine, mine._coarse = (theirs._fine, theirs._coarse) if theirs is not None else ({}, {})
    target.recycle_tables = saved.recycle_tables
    target.ledgers = saved.ledgers
    return StateFile(path, True)


# --------------------------------------------------------------------- internals
def _said(result: StateFile, warn: bool) -> StateFile:
    if warn:
        logging.getLogger("lookupdec.state").warning("%s", result.problem)
    return result


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise StateFileError(why)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _rates(cal: Calibration) -> dict:
    return {"fine": [[*k, h, t] for k, (h, t) in cal._fine.items()],
            "coarse": [[*k, h, t] for k, (h, t) in cal._coarse.items()]}


def _set_rates(cal: Calibration, rates) -> None:
    _require(isinstance(rates, dict), "a calibration without rates")
    for level, table in (("fine", cal._fine), ("coarse", cal._coarse)):
        rows = rates.get(level)
        _require(isinstance(rows, list), f"no {level} rates")
        for row in rows:
            _require(isinstance(row, list) and 3 <= len(row) <= 8 and isinstance(row[0], str)
                     and all(_is_int(x) for x in row[1:-2]), f"a {level} rate with a malformed key: {row!r}"[:200])
            h, t = row[-2], row[-1]
            _require(_is_number(h) and _is_number(t) and 0 <= h <= t,
                     f"a {level} rate that is not a count: {row!r}"[:200])
            table[tuple(row[:-2])] = [float(h), float(t)]


def _ledger(entry: dict, i: int) -> SourceLedger:
    led = SourceLedger()
    totals = entry.get("totals")
    _require(isinstance(totals, dict) and all(_is_number(totals.get(n)) and totals[n] >= 0 for n in _LEDGER_TOTALS),
             f"ledger {i}'s totals are not non-negative numbers")
    for name in _LEDGER_TOTALS:
        setattr(led, name, float(totals[name]))
    keep, accounts = entry.get("keep"), entry.get("accounts")
    _require(isinstance(keep, list) and all(isinstance(n, str) for n in keep), f"ledger {i}'s kept sources")
    _require(isinstance(accounts, list), f"ledger {i} has no accounts")
    for a in accounts:
        _require(isinstance(a, dict) and set(a) == set(_ACCOUNT_FIELDS) and isinstance(a["name"], str)
                 and isinstance(a["on"], bool), f"ledger {i} has a malformed account")
        values = {n: a[n] for n in _ACCOUNT_FIELDS if n not in ("name", "on")}
        _require(all(_is_number(v) and v >= 0 for v in values.values()),
                 f"ledger {i}'s account {a['name']!r}: a negative or non-number total")
        acc = led.account(a["name"])
        acc.on = a["on"]
        for n, v in values.items():
            setattr(acc, n, type(getattr(acc, n))(v))
    for n in keep:
        led.keep_on(n)
    return led
