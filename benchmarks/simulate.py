"""Offline acceptance simulator: replay recorded greedy outputs through a drafter.

Greedy speculative decoding is deterministic given the target's greedy output:
at each step the verifier accepts the longest draft path that agrees with the
output, plus one bonus token. So a recorded output (``benchmarks/record_outputs.py``)
replays exactly without the model: start the drafter on the prompt, ask for a
tree, accept against the recording, commit, repeat until the output is consumed.
The mean accepted tokens per step (tau) and the accepted-length histogram are
what a real run gives, in a fraction of a second per question.

Usage::

    python benchmarks/simulate.py benchmarks/out/greedy_pc2_128.jsonl --drafter pld
    python benchmarks/simulate.py RECORDS.jsonl --drafter pld -s min_n=1 -s max_width=16
    python benchmarks/simulate.py A.jsonl B.jsonl --cost hf          # transformers' cost curve
    python benchmarks/simulate.py A.jsonl --cost 1:34.3,16:40,64:90  # a measured curve of your own
    python benchmarks/simulate.py A.jsonl --drafter auto --index datastore/sample/stdlib.index --cost xeon
    # as a real run on this machine: the decoder's cached curve, 0.34 ms of host time a step
    # (ar's overhead in spec_bench.py), the drafter's own time as measured here, auto's gate
    python benchmarks/simulate.py A.jsonl --drafter auto --cost ~/.cache/lookupdec/costs/KEY.json --as-run 0.34

Library::

    from simulate import load_records, simulate
    res = simulate(lambda: PLDDrafter(), load_records(path))
    res.overall.tau, res.by_task["rag"].tau, res.histogram
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a script: make the checkout's package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lookupdec.drafters.base import DraftRequest, Drafter, NoDrafter, StepOutcome, as_drafter  # noqa: E402
from lookupdec.drafters.state import DrafterState  # noqa: E402
from lookupdec.costs import CostCurve  # noqa: E402
from lookupdec.tree import DraftTree  # noqa: E402


@dataclass(frozen=True)
class Record:
    """One recorded greedy generation (``references``: token ids of the documents in its prompt)."""

    question_id: int
    task: str
    turn: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    references: tuple[tuple[int, ...], ...] = ()
    # The target's top-k ids / probabilities at each output position (record_outputs.py --topk);
    # None when not recorded. Row j: the distribution of output_ids[j].
    topk_ids: np.ndarray | None = field(default=None, compare=False)
    topk_probs: np.ndarray | None = field(default=None, compare=False)


def load_records(path: str | Path) -> list[Record]:
    """Read the JSONL written by ``record_outputs.py``.

    Raises:
        ValueError: naming the file and line of a record that lacks a field.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            try:
                top = r.get("topk_ids")
                out.append(Record(int(r["question_id"]), str(r["task"]), int(r.get("turn", 0)),
                                  tuple(r["prompt_ids"]), tuple(r["output_ids"]),
                                  tuple(tuple(d) for d in r.get("references", ())),
                                  None if top is None else np.asarray(top, np.int64).reshape(len(top), -1),
                                  None if top is None else np.asarray(r["topk_probs"], np.float32)
                                  .reshape(len(top), -1)))
            except KeyError as e:
                raise ValueError(f"{path}:{lineno}: record lacks field {e}; re-record with record_outputs.py") from None
    return out


# Measured verify-forward costs, (tokens in the forward, ms), of the embedded
# model on this project's 2-core CPU with a ~500-token cache.
COST_CURVES: dict[str, tuple[tuple[int, float], ...]] = {
    # The decoder's own verifier (fast backend, benchmarks/RESULTS.md "Verification
    # cost curve", logits for the root and the tree's main path): below one
    # transformers step (~54 ms) up to ~23 tokens.
    "fast": ((1, 29.4), (2, 31.0), (4, 29.9), (8, 34.9), (12, 41.2), (16, 43.5), (24, 55.8), (32, 65.2),
             (48, 93.7), (64, 111.5)),
    # The same verifier before its weights took oneDNN's blocked layout (what the
    # current PLD defaults were tuned against).
    "fast-v1": ((1, 34.3), (2, 39.9), (4, 41.5), (8, 48.3), (12, 54.3), (16, 61.2), (24, 74.7), (32, 86.5),
                (48, 118.6), (64, 143.9)),
    # transformers' forward (what the PLD defaults were first tuned against).
    "hf": ((1, 47.0), (8, 75.0), (16, 90.0)),
    # The fast verifier on a 2-core Intel Xeon (Ice Lake, AVX-512) VM whose forward is bound by
    # memory bandwidth: dearer at one row, flatter in w (RESULTS.md "Verification cost curve").
    "xeon": ((1, 66.2), (2, 68.8), (4, 64.0), (8, 75.0), (12, 78.8), (16, 89.6), (24, 105.6), (32, 133.6),
             (48, 162.5), (64, 196.2)),
    # The 2-core AMD EPYC with AVX-512, quiet, 257 cached rows (RESULTS.md "Drafts from the target
    # itself", issue 9; the four widths that section gives).
    "amd-avx512": ((1, 29.2), (8, 33.6), (16, 40.5), (32, 59.8)),
    # The same AMD EPYC with AVX-512, quantized weights (the GGUF's Q8_0 blocks), head-major cache,
    # lm_head timed after a body (RESULTS.md "Pricing lm_head as steps pay it", issue 17): steep.
    "amd-avx512-q8": ((1, 8.22), (2, 9.93), (4, 12.69), (8, 21.29), (12, 28.68), (16, 33.17), (24, 43.15),
                      (32, 56.02), (48, 75.05), (64, 98.2)),
    # The 2-core AMD EPYC with AVX2 only, the curve `make demo` cached (issue 17): noisy, c(4) < c(1).
    "amd-avx2-demo": ((1, 67.6), (2, 73.3), (4, 60.1), (8, 82.8), (16, 87.5), (32, 122.4), (64, 226.3)),
    # The 2-core Intel Xeon with AVX-512 and AMX, float16 weights, one-row products unpadded
    # (RESULTS.md "Weight formats", issue 18; benchmarks/out/curve_fp16_nopad.txt).
    "xeon-amx-fp16": ((1, 21.7), (2, 23.6), (4, 26.9), (8, 32.6), (12, 36.9), (16, 43.6), (24, 50.9), (32, 59.8),
                      (48, 75.2), (64, 86.3)),
}


def curve_from_points(points: Sequence[tuple[int, float]], name: str = "simulated") -> CostCurve:
    """A ``lookupdec.costs.CostCurve`` through measured ``(tokens in the forward, ms)`` points.

    The simulator prices with the same class ``auto`` sizes its trees by: linear
    interpolation between widths, the last slope continued beyond the last width,
    no cache-length slope. A first width above 1 gets its cost held down to 1.

    Raises:
        ValueError: for fewer than 2 points, widths not increasing from >= 1, or non-positive times.

    Example:
        >>> curve_from_points(((1, 10.0), (3, 20.0))).ms_at(2)
        15.0
    """
    pts = tuple((int(w), float(ms)) for w, ms in points)
    if len(pts) < 2 or pts[0][0] < 1 or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        raise ValueError(f"cost points need >= 2 widths, increasing from >= 1; got {points!r}")
    if pts[0][0] != 1:
        pts = ((1, pts[0][1]),) + pts
    return CostCurve(tuple(w for w, _ in pts), tuple(m for _, m in pts), 0, (0.0,) * len(pts), name, name)


def named_curve(name: str = "fast") -> CostCurve:
    """The measured curve called ``name`` (a key of ``COST_CURVES``) as a ``CostCurve``.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in COST_CURVES:
        raise ValueError(f"unknown cost curve {name!r}; expected one of {sorted(COST_CURVES)}")
    return curve_from_points(COST_CURVES[name], name)


def parse_curve(text: str) -> CostCurve:
    """A curve name, a curve file the decoder cached (``.json``: with its cache-length slope),
    or explicit points as ``"1:34.3,8:48.3,16:61.2"``.

    Raises:
        ValueError: for text that is none of these.
    """
    if text.endswith(".json"):
        try:
            return CostCurve.from_json(Path(text).read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"cannot read the cost curve {text}: {e.strerror}") from None
    if ":" not in text:
        return named_curve(text)
    try:
        pts = tuple((int(w), float(ms)) for w, ms in (item.split(":") for item in text.split(",")))
    except ValueError:
        raise ValueError(f"cost points must look like '1:34.3,8:48.3', got {text!r}") from None
    return curve_from_points(pts, text)


@dataclass(frozen=True)
class TaskStats:
    """Totals over a group of records.

    Attributes:
        records: generations replayed.
        tokens: output tokens produced (sum of the recordings' lengths).
        steps: verify steps taken.
        tau: mean accepted tokens per step, bonus included (tokens / steps,
            pooled over the group as the decoder's ``mean_accepted`` is per generation).
        mean_draft: mean draft tree size per step.
        est_speedup: tokens per unit of modelled verify time, relative to plain
            decoding (``ar``: one 1-token forward per token, under the same cost
            curve); drafting time not counted, unless the replay was given a
            ``RunModel`` (then plain decoding is priced with the same host time).
    """

    records: int
    tokens: int
    steps: int
    tau: float
    mean_draft: float
    est_speedup: float


@dataclass(frozen=True)
class SimResult:
    """What a replay measured.

    Attributes:
        overall: totals over every record.
        by_task: the same per task, in first-seen order.
        histogram: ``histogram[k]`` = steps that accepted ``k`` draft tokens.
        seconds: wall time of the replay.
    """

    overall: TaskStats
    by_task: Mapping[str, TaskStats]
    histogram: tuple[int, ...]
    seconds: float = field(compare=False)


@dataclass(frozen=True)
class RunModel:
    """What a real run adds to the modelled forwards, so that a replay's speed can be set beside a measured one.

    Without it (``simulate(run=None)``) a replay prices forwards only, at the curve's own cache length,
    and ``auto`` proposes on every step. A real ``Decoder.generate`` also spends host time and, for
    ``auto``, lets a ``BatchGate(min_size=1)`` pause the drafting while drafting steps deliver less
    than plain ones (``lookupdec.batch``); the replay models both when given this.

    Attributes:
        step_host_ms: the decoder's own time per step outside the forward and the drafter (acceptance,
            cache commit, bookkeeping); take ``ar``'s overhead per step from a real run on the machine.
        gate: pause the drafting as ``Decoder.generate`` does for ``auto`` (one gate for all the records,
            as one decoder keeps one per temperature band): paused steps propose nothing.
        past: price each forward at its cache length (prompt and tokens so far), with the curve's slope.
        drafter_scale: the drafter's own wall time (its ``propose`` and ``commit``, as run in the
            replay) is added to each step this many times: 1 as measured, 0 not at all, 0.5 what
            halving it would buy.

    Example:
        >>> run = RunModel(step_host_ms=1.0, drafter_scale=0.0)   # plain decoding priced as plain decoding
        >>> r = simulate(NoDrafter, [Record(1, "qa", 0, (5, 6), (7, 8, 2))], run=run)
        >>> r.overall.est_speedup
        1.0
    """

    step_host_ms: float = 0.0
    gate: bool = True
    past: bool = True
    drafter_scale: float = 1.0


def accepted_path(tree: DraftTree, target: Sequence[int]) -> list[int]:
    """Nodes of the longest root-to-node path of ``tree`` whose tokens are a prefix of ``target``.

    Example:
        >>> accepted_path(DraftTree.from_sequences([[1, 2, 9], [1, 3]]), [1, 3, 4])
        [0, 3]
    """
    if not len(tree) or not len(target):
        return []
    children: dict[tuple[int, int], int] = {}
    for i, (tok, par) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
        children.setdefault((par, tok), i)  # a trie holds each (parent, token) once
    node, path = -1, []
    while len(path) < len(target):
        nxt = children.get((node, int(target[len(path)])))
        if nxt is None:
            break
        node = nxt
        path.append(nxt)
    return path


def accepted_length(tree: DraftTree, target: Sequence[int]) -> int:
    """Length of the longest root-to-node path of ``tree`` that is a prefix of ``target``.

    Example:
        >>> accepted_length(DraftTree.from_sequences([[1, 2, 9], [1, 3]]), [1, 3, 4])
        2
    """
    return len(accepted_path(tree, target))


def accepted_length_reference(tree: DraftTree, target: Sequence[int]) -> int:
    """Slow accepted_length: the deepest node whose whole path equals the target's prefix."""
    best = 0
    for i in range(len(tree)):
        path = tree.path_tokens(i)
        if list(target[:len(path)]) == path:
            best = max(best, len(path))
    return best


def _stats(records: int, tokens: int, steps: int, drafted: int, cost_ms: float, plain_ms: float) -> TaskStats:
    return TaskStats(records, tokens, steps, tokens / steps if steps else 0.0, drafted / steps if steps else 0.0,
                     plain_ms / cost_ms if cost_ms else 0.0)


def simulate(drafter_factory: Callable[..., Drafter], records: Iterable[Record], *, budget: int = 64,
             cost: CostCurve | None = None, run: RunModel | None = None) -> SimResult:
    """Replay ``records`` through fresh drafters and measure acceptance.

    Each step: ``tree = drafter.propose(DraftRequest(budget, tokens left))``;
    the accepted draft tokens are the longest tree path that the recorded
    output continues with; the step yields those plus the recorded next token
    (the bonus), except when the draft covers the rest of the output; the
    drafter's ``commit`` gets the accepted nodes and the new tokens. A drafter
    that asks for top-k (``topk``, protocol v3: Token Recycling) also gets the
    recorded top-k of the step's committed rows (the root and the accepted
    nodes; the rejected nodes' rows are not recorded, so the replay's table
    learns from fewer rows than a real run's).

    Args:
        drafter_factory: returns a drafter for a record (called with the record, or with no
            argument if it takes none), once per record: state kept across records (a
            shared calibration, a history store) is the factory's choice.
        records: recorded generations (``load_records``).
        budget: node budget offered to ``propose`` each step.
        cost: verify-time model for ``est_speedup`` (default: ``named_curve("fast")``).
        run: also model a real run's host time and ``auto``'s gate (``RunModel``); ``est_speedup``
            is then against plain decoding priced the same way (its forwards at their cache
            lengths, plus ``step_host_ms`` a token).

    Returns:
        SimResult with per-task and overall tau and the accepted-length histogram.

    Raises:
        ValueError: when a drafter proposes more than ``budget`` nodes.

    Example:
        >>> r = simulate(NoDrafter, [Record(1, "qa", 0, (5, 6), (7, 8, 2))])
        >>> r.overall.tau, r.histogram
        (1.0, (3,))
    """
    cost = cost or named_curve()
    cost1 = cost.ms_at(1)
    t0 = time.perf_counter()
    hist: list[int] = []
    # task -> [records, tokens, steps, drafted nodes, modelled ms, plain decoding's modelled ms]
    acc: dict[str, list[float]] = {}
    cost_cache: dict[int, float] = {}
    takes_record = _takes_an_argument(drafter_factory)
    gate = None
    if run is not None and run.gate:
        from lookupdec.batch import BatchGate
        from lookupdec.drafters.state import SINGLE_MAX_PAUSE

        gate = BatchGate(min_size=1, max_pause=SINGLE_MAX_PAUSE)  # what Decoder.generate gives ``auto``

    def forward_ms(width: int, past: int) -> float:
        if run is not None and run.past:
            return cost.ms_at(width, past)
        if width not in cost_cache:
            cost_cache[width] = cost.ms_at(width)
        return cost_cache[width]

    for rec in records:
        drafter = as_drafter(drafter_factory(rec) if takes_record else drafter_factory())
        drafter.begin(rec.prompt_ids)
        out = rec.output_ids
        # Records without top-k replay without it (``auto``'s recycle source then drafts nothing).
        k_top = int(drafter.topk or 0) if rec.topk_ids is not None else 0
        context = list(rec.prompt_ids) + list(out)
        gated = gate is not None and drafter.name == "auto"
        pos = steps = drafted = 0
        ms = 0.0
        while pos < len(out):
            step_budget = gate.budget(1, budget) if gated else budget
            t_draft = time.perf_counter()
            tree = drafter.propose(DraftRequest(step_budget, len(out) - pos)) if step_budget else DraftTree.empty()
            draft_s = time.perf_counter() - t_draft
            if len(tree) > budget:
                raise ValueError(f"drafter {drafter.name!r} proposed {len(tree)} nodes "
                                 f"for a budget of {budget}")
            path = accepted_path(tree, out[pos:])
            k = len(path)
            new = out[pos:pos + k + 1]  # accepted draft + bonus (none when the draft reached the end)
            outcome = StepOutcome(tuple(path), tuple(new), tree, np.arange(len(tree)))
            if k_top and step_budget:  # a step that drafts nothing asks for no top-k (Sequence.plan)
                # Rows of the root and the accepted nodes: row j of the record is the
                # distribution after input token context[len(prompt) + j - 1].
                rows = np.arange(pos, pos + len(new))
                outcome = StepOutcome(outcome.accepted, outcome.new_tokens, tree, outcome.origin,
                                      row_tokens=np.asarray([context[len(rec.prompt_ids) + j - 1] for j in rows],
                                                            np.int64),
                                      topk_ids=rec.topk_ids[rows, :k_top], topk_probs=rec.topk_probs[rows, :k_top])
            t_commit = time.perf_counter()
            drafter.commit(outcome)
            draft_s += time.perf_counter() - t_commit
            past = len(rec.prompt_ids) + pos
            step_ms = forward_ms(len(tree) + 1, past)  # the forward scores the root token and every node
            if run is not None:
                step_ms += run.step_host_ms + draft_s * 1e3 * run.drafter_scale
            if gated:
                gate.record(1, step_budget != 0, len(tree) > 0, len(new), step_ms / 1e3)
            pos += len(new)
            steps += 1
            drafted += len(tree)
            ms += step_ms
            if k >= len(hist):
                hist.extend([0] * (k + 1 - len(hist)))
            hist[k] += 1
        if run is None:
            plain = len(out) * cost1
        else:  # plain decoding priced as the run: one forward a token at its cache length, plus the host time
            plain = sum(forward_ms(1, len(rec.prompt_ids) + j) for j in range(len(out))) + len(out) * run.step_host_ms
        a = acc.setdefault(rec.task, [0, 0, 0, 0, 0.0, 0.0])
        a[0] += 1
        a[1] += len(out)
        a[2] += steps
        a[3] += drafted
        a[4] += ms
        a[5] += plain
    by_task = {t: _stats(int(a[0]), int(a[1]), int(a[2]), int(a[3]), a[4], a[5]) for t, a in acc.items()}
    tot = [sum(a[i] for a in acc.values()) for i in range(6)]
    overall = _stats(int(tot[0]), int(tot[1]), int(tot[2]), int(tot[3]), tot[4], tot[5])
    return SimResult(overall, by_task, tuple(hist), time.perf_counter() - t0)


class _ReplayHistory:
    """A history store as a server's would be during a replay: each record's output is
    remembered when the next record starts (records replay in order), served from memory."""

    def __init__(self) -> None:
        self._outputs: list[list[int]] = []
        self._last: Record | None = None
        self._indexes: list = []

    def remember_previous(self, rec: Record) -> None:
        if self._last is not None:
            from lookupdec.index.memory import memory_index

            self._outputs.append(list(self._last.output_ids))
            self._indexes = [memory_index(self._outputs)]
        self._last = rec

    def refresh(self) -> None:
        pass

    def indexes(self) -> list:
        return self._indexes


def _takes_an_argument(fn) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


# ------------------------------------------------------------------ drafters by name
class CopyOracle(Drafter):
    """The bound for every drafter that copies from the live context.

    Knows each record's output (by its prompt) and drafts, as one chain, the
    longest prefix of the rest of the output that occurs anywhere in the
    prompt + generated text so far (at most ``budget`` tokens). No drafter
    copying spans of the context can accept more per step.
    """

    name = "copy-oracle"

    def __init__(self, answers: Mapping[tuple[int, ...], Sequence[int]]) -> None:
        self._answers = answers

    @staticmethod
    def _text(tokens: Iterable[int]) -> str:
        # One character per token (offset past the surrogates), so str.find does the substring search.
        return "".join(chr(0xE000 + int(t)) for t in tokens)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._context = self._text(prompt_ids)
        self._rest = list(self._answers[tuple(prompt_ids)])

    def propose(self, request: DraftRequest) -> DraftTree:
        k = 0
        top = min(request.budget, request.max_depth, len(self._rest))
        while k < top and self._context.find(self._text(self._rest[:k + 1])) >= 0:
            k += 1
        return DraftTree.chain(self._rest[:k])

    def commit(self, outcome: StepOutcome) -> None:
        self._context += self._text(outcome.new_tokens)
        self._rest = self._rest[len(outcome.new_tokens):]


class TransformersPLDModel(Drafter):
    """A model of transformers' prompt lookup (``prompt_lookup_num_tokens``), for comparison.

    As its candidate generator behaves: the last 2 tokens (else the last 1)
    looked up, the EARLIEST occurrence taken, up to ``num_tokens`` tokens
    after it drafted as a chain, cut at the end of the sequence; no adaptation.
    Checked against the real thing: on 8 recorded translation, summarization
    and RAG generations of the embedded model, ``generate(prompt_lookup_num_tokens=10)``
    made exactly as many forward calls as this model's replay takes steps.
    """

    name = "hf-pld"

    def __init__(self, num_tokens: int = 10, max_ngram: int = 2) -> None:
        from lookupdec.index.live import LiveIndex

        self.num_tokens = num_tokens
        self._index = LiveIndex(max_n=max_ngram, min_n=1)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._index.reset(prompt_ids)

    def propose(self, request: DraftRequest) -> DraftTree:
        m = self._index.match(max_occurrences=len(self._index))
        if not m.starts:
            return DraftTree.empty()
        first = m.starts[-1]  # starts are most recent first
        n = min(self.num_tokens, request.budget, request.max_depth)
        return DraftTree.chain(self._index.continuation(first, n, periodic=False))

    def commit(self, outcome: StepOutcome) -> None:
        self._index.extend(outcome.new_tokens)


def _parse_value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def drafter_factory(name: str, settings: Mapping[str, object], records: Sequence[Record] = (),
                    cost: CostCurve | None = None, indexes: Sequence = ()) -> Callable[[Record], Drafter]:
    """A factory for the drafter called ``name`` with keyword ``settings``.

    ``records`` are needed by ``copy-oracle`` only (it reads the answers).
    ``auto``, ``llma``, ``rest`` and ``history`` share one calibration over all
    records, in order, as a server's decoder would (``auto`` its source accounts too), and size their trees by
    ``cost``; ``history`` and ``auto`` draft from the outputs of the records
    replayed before (the history a server would have); ``indexes`` are the
    opened datastores of ``rest`` and ``auto``.

    Raises:
        ValueError: for an unknown drafter name, or ``rest`` without an index.
    """
    if name == "ar":
        return lambda rec: NoDrafter()
    if name == "hf-pld":
        return lambda rec: TransformersPLDModel(**settings)
    if name == "copy-oracle":
        answers = {r.prompt_ids: r.output_ids for r in records}
        return lambda rec: CopyOracle(answers)
    if name == "pld":
        from lookupdec.drafters.pld import PLDConfig, PLDDrafter

        config = PLDConfig(**settings)  # validate once, not per record
        return lambda rec: PLDDrafter(config)
    if name in ("auto", "llma", "rest", "history", "recycle"):
        from lookupdec.drafters.auto import AutoDrafter
        from lookupdec.drafters.single import history_method, llma_method, recycle_method, rest_method
        from lookupdec.drafters.calibrate import Calibration

        if name == "rest" and not indexes:
            raise ValueError("drafter 'rest' needs --index DIR")
        if name == "recycle" and any(r.topk_ids is None for r in records):
            raise ValueError("drafter 'recycle' replays the target's top-k, which these records lack; "
                             "re-record them with record_outputs.py --topk 8")
        calibration = Calibration()
        state = DrafterState(calibration)  # one decoder's: Token Recycling's table warms across records
        curve = cost or named_curve()
        store = _ReplayHistory() if name in ("history", "auto") else None

        def make(rec: Record) -> Drafter:
            refs = [list(d) for d in rec.references] or None
            if store is not None:
                store.remember_previous(rec)
            if name == "llma":  # nothing to draft from without documents
                return llma_method(references=refs, calibration=calibration, cost=curve) if refs else NoDrafter()
            if name == "rest":
                return rest_method(indexes=indexes, calibration=calibration, cost=curve)
            if name == "history":
                return history_method(history=store, calibration=calibration, cost=curve)
            if name == "recycle":
                return recycle_method(calibration=calibration, cost=curve, state=state)
            # One account book for every record, as a decoder keeps one per method and band.
            return AutoDrafter(references=refs, indexes=list(indexes) or None, history=store,
                               calibration=calibration, cost=curve, state=state,
                               ledger=state.ledger("auto", 0.0), **settings)
        return make
    raise ValueError(f"unknown drafter {name!r}; expected one of ar, pld, llma, rest, history, recycle, auto, "
                     "hf-pld, copy-oracle")


def format_table(res: SimResult, title: str) -> str:
    """A Markdown table of per-task and overall figures."""
    lines = [f"### {title}", "", "| task | records | tokens | steps | tau | mean draft | est. speedup |",
             "|---|---|---|---|---|---|---|"]
    for task, s in [*res.by_task.items(), ("**overall**", res.overall)]:
        lines.append(f"| {task} | {s.records} | {s.tokens} | {s.steps} | {s.tau:.3f} | {s.mean_draft:.2f} | "
                     f"{s.est_speedup:.2f} |")
    total = sum(res.histogram) or 1
    lines += ["", "accepted draft tokens per step: " + ", ".join(
        f"{k}: {100 * c / total:.1f}%" for k, c in enumerate(res.histogram) if c)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Replay recorded greedy outputs through a drafter (no model).")
    ap.add_argument("records", type=Path, nargs="+", help="JSONL files from benchmarks/record_outputs.py (concatenated)")
    ap.add_argument("--drafter", default="pld",
                    help="'pld', 'ar', 'llma', 'rest', 'history' (earlier records' outputs), 'recycle' (Token "
                         "Recycling, from records with top-k), 'auto' (every replayable source, history included), "
                         "'hf-pld' (a model of transformers' prompt lookup) or 'copy-oracle' "
                         "(the bound for copy drafters)")
    ap.add_argument("--index", action="append", default=[], metavar="DIR",
                    help="a datastore for 'rest' and 'auto' (repeatable)")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="drafter setting, e.g. -s max_width=16 (repeatable)")
    ap.add_argument("--budget", type=int, default=64, help="node budget offered to the drafter each step")
    ap.add_argument("--cost", default="fast",
                    help="verify-cost curve for est. speedup: " + " | ".join(COST_CURVES)
                         + " (default fast), a curve file the decoder cached (KEY.json), or points as "
                           "'1:34.3,8:48.3,16:61.2' (tokens:ms)")
    ap.add_argument("--as-run", type=float, default=None, metavar="HOST_MS",
                    help="model a real run (RunModel): HOST_MS of the decoder's own time a step (ar's overhead "
                         "per step in a real run), the drafter's measured time, auto's gate, forwards priced at "
                         "their cache length")
    ap.add_argument("--drafter-scale", type=float, default=1.0, metavar="F",
                    help="with --as-run: count the drafter's measured time F times (inside a real run drafting "
                         "measured ~2x its time in a replay; 0.5: what halving it would buy)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    if not args.drafter_scale >= 0:
        ap.error(f"--drafter-scale must be >= 0, got {args.drafter_scale}")
    if args.as_run is not None and not (args.as_run >= 0):
        ap.error(f"--as-run must be a time in ms >= 0, got {args.as_run}")

    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set expects KEY=VALUE, got {item!r}")
        settings[key] = _parse_value(value)
    try:
        cost = parse_curve(args.cost)
    except ValueError as e:
        ap.error(str(e))
    records = [r for path in args.records for r in load_records(path)]
    from lookupdec.index import open_index

    indexes = [open_index(p) for p in args.index]
    run = None if args.as_run is None else RunModel(step_host_ms=args.as_run, drafter_scale=args.drafter_scale)
    res = simulate(drafter_factory(args.drafter, settings, records, cost, indexes), records, budget=args.budget,
                   cost=cost, run=run)
    desc = " ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
    print(format_table(res, f"{args.drafter} ({desc}), {len(records)} records, budget {args.budget}, "
                            f"cost {args.cost}" + ("" if run is None else f", as run (host {run.step_host_ms} ms a step, gate, drafter time x{run.drafter_scale:g})")))
    print(f"\nreplayed in {res.seconds:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"drafter": args.drafter, "settings": settings, "budget": args.budget,
                                         "run": None if run is None else asdict(run),
                                         "cost": [[w, m] for w, m in zip(cost.widths, cost.ms)],
                                         "overall": asdict(res.overall),
                                         "by_task": {t: asdict(s) for t, s in res.by_task.items()},
                                         "histogram": list(res.histogram)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
