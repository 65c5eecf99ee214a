"""Spec-Bench's speed arithmetic, over ``TurnRecord``s.

As Spec-Bench's ``evaluation/speed.py`` computes it, for one method and one
task (or all questions, "overall"):

- a question's speed is its new tokens summed over its turns divided by its
  wall time summed over its turns;
- the method's tokens/s is the MEAN of its per-question speeds;
- speedup = method tokens/s / baseline tokens/s (a ratio of means, not a
  mean of per-question ratios);
- mean accepted tokens = the mean over all steps of the tokens each step
  committed = total committed tokens / total steps.

Decode-only figures leave out every turn's first step (the prompt's forward up to
its first new token), which every method pays alike and which pulls every ratio
towards 1 on long prompts: a question's decode speed is its new tokens after
those first steps divided by its wall time less theirs, and ``decode_speedup``
is the same ratio of means over those speeds. They are NaN where a method does
not report its first step.

"overall" averages over questions, as speed.py does over its whole file: on
the full benchmark every task has 80 questions, but with ``--per-category N``
MT-bench (8 categories) holds 8N of the 13N questions and weighs accordingly.

The spread shown next to a speedup is the sample standard deviation
(ddof=1; 0 for one question) of the per-question ratios
speed_q(method) / speed_q(baseline), with their min and max kept as well.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .runner import TurnRecord, decode_rate
from .tasks import TASKS

OVERALL = "overall"


@dataclass(frozen=True)
class QuestionSpeed:
    """One method's totals on one question (turns summed)."""

    method: str
    question_id: int
    task: str
    new_tokens: int
    seconds: float
    committed_tokens: int
    steps: int
    forward_ms: float = math.nan
    overhead_ms: float = math.nan
    prefill_ms: float = math.nan
    prefill_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens/s after each turn's first step (NaN when that step's time is unknown)."""
        return decode_rate(self.new_tokens, self.seconds, self.prefill_ms, self.prefill_tokens)


@dataclass(frozen=True)
class TaskSummary:
    """One method on one task (or ``"overall"``) against one baseline.

    Attributes:
        method, task, baseline: what is compared.
        n_questions: questions in the task.
        tokens_per_s: mean of the method's per-question tokens/s.
        baseline_tokens_per_s: the same for the baseline.
        speedup: tokens_per_s / baseline_tokens_per_s.
        speedup_std: sample std of the per-question speedups (0 for one question).
        speedup_min, speedup_max: extremes of the per-question speedups.
        mean_accepted: committed tokens / steps over the task.
        overhead_pct: share of the step time spent outside the target's
            forward passes (drafting, acceptance, cache commit), in percent;
            NaN for methods that do not report it (the transformers peers).
        decode_tokens_per_s, decode_speedup: the same without each turn's first
            step (module docstring); NaN where either side does not report it.
        decode_overhead_pct: ``overhead_pct`` of the decoding steps alone: the time
            outside forwards over the turns' time after the prompt's forward (whose
            length says nothing of a method's steps); NaN where not reported.
    """

    method: str
    task: str
    baseline: str
    n_questions: int
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    speedup_std: float
    speedup_min: float
    speedup_max: float
    mean_accepted: float
    overhead_pct: float = math.nan
    decode_tokens_per_s: float = math.nan
    decode_speedup: float = math.nan
    decode_overhead_pct: float = math.nan


def question_speeds(records: Iterable[TurnRecord]) -> dict[tuple[str, int], QuestionSpeed]:
    """Sum each (method, question)'s turns.

    Example:
        >>> r = [TurnRecord("ar", 7, "math", "mt_bench", t, 10, 2.0, (2.0,), 10, 10) for t in (1, 2)]
        >>> question_speeds(r)[("ar", 7)].tokens_per_s
        5.0
    """
    acc: dict[tuple[str, int], list] = {}
    for r in records:
        key = (r.method, r.question_id)
        if key not in acc:
            acc[key] = [r.task, 0, 0.0, 0, 0, 0.0, 0.0, 0.0, 0]
        a = acc[key]
        a[1] += r.new_tokens
        a[2] += r.seconds
        a[3] += r.committed_tokens
        a[4] += r.steps
        a[5] += r.forward_ms
        a[6] += r.overhead_ms
        a[7] += r.prefill_ms
        a[8] += r.prefill_tokens
    return {k: QuestionSpeed(k[0], k[1], *a) for k, a in acc.items()}


def _sample_std(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(records: Sequence[TurnRecord], baseline: str) -> dict[tuple[str, str], TaskSummary]:
    """Per-method, per-task and overall figures against ``baseline``.

    Args:
        records: every ``TurnRecord`` of a run.
        baseline: the method whose tokens/s is the denominator (``"hf"`` or ``"ar"``).

    Returns:
        ``(method, task) -> TaskSummary`` for every method, every task present
        (in ``TASKS`` order) and ``"overall"``.

    Raises:
        ValueError: when ``baseline`` has no records, or a method did not run
            the same questions as the baseline.

    Example:
        >>> s = summarize(records, baseline="hf")  # doctest: +SKIP
        >>> s[("pld", "overall")].speedup  # doctest: +SKIP
        1.87
    """
    speeds = question_speeds(records)
    by_method: dict[str, dict[int, QuestionSpeed]] = defaultdict(dict)
    for (method, qid), s in speeds.items():
        by_method[method][qid] = s
    if baseline not in by_method:
        raise ValueError(f"baseline {baseline!r} has no records; methods run: {sorted(by_method)}")
    base = by_method[baseline]
    tasks = [t for t in TASKS if any(s.task == t for s in base.values())] + [OVERALL]
    out: dict[tuple[str, str], TaskSummary] = {}
    for method, qs in by_method.items():
        if set(qs) != set(base):
            raise ValueError(f"method {method!r} ran questions {sorted(set(qs) ^ set(base))} "
                             f"that baseline {baseline!r} did not (or vice versa)")
        for task in tasks:
            ids = sorted(q for q, s in base.items() if task == OVERALL or s.task == task)
            mine = [qs[q] for q in ids]
            theirs = [base[q] for q in ids]
            tps = statistics.fmean(s.tokens_per_s for s in mine)
            base_tps = statistics.fmean(s.tokens_per_s for s in theirs)
            ratios = [m.tokens_per_s / b.tokens_per_s for m, b in zip(mine, theirs, strict=True)]
            steps = sum(s.steps for s in mine)
            forward = sum(s.forward_ms for s in mine)
            overhead = sum(s.overhead_ms for s in mine)
            decode_total = forward + overhead - sum(s.prefill_ms for s in mine)
            decode_tps = statistics.fmean(s.decode_tokens_per_s for s in mine)
            decode_base = statistics.fmean(s.decode_tokens_per_s for s in theirs)
            out[(method, task)] = TaskSummary(
                method=method, task=task, baseline=baseline, n_questions=len(ids),
                tokens_per_s=tps, baseline_tokens_per_s=base_tps, speedup=tps / base_tps,
                speedup_std=_sample_std(ratios), speedup_min=min(ratios), speedup_max=max(ratios),
                mean_accepted=sum(s.committed_tokens for s in mine) / steps if steps else math.nan,
                overhead_pct=100.0 * overhead / (forward + overhead) if forward + overhead > 0 else math.nan,
                decode_tokens_per_s=decode_tps, decode_speedup=decode_tps / decode_base,
                decode_overhead_pct=100.0 * overhead / decode_total if decode_total > 0 else math.nan,
            )
    return out


@dataclass(frozen=True)
class TurnShortfalls:
    """One method's turns against the baseline's, turn by turn.

    Attributes:
        method, baseline: what is compared.
        threshold: the ratio of tokens/s a turn is held to.
        turns: turns compared.
        below: turns whose tokens/s fell under ``threshold`` x the baseline's.
        decode_below: the same decode only (``decode_rate``); -1 where either side
            does not report its first steps.
        lowest: the lowest whole-call ratio, and ``lowest_at`` its (question id, turn).
    """

    method: str
    baseline: str
    threshold: float
    turns: int
    below: int
    decode_below: int
    lowest: float
    lowest_at: tuple[int, int]


def turn_shortfalls(records: Sequence[TurnRecord], baseline: str,
                    threshold: float = 0.97) -> dict[str, TurnShortfalls]:
    """Per method (the baseline left out): how many turns ran under ``threshold`` x the baseline.

    A turn's tokens/s is one call's, or the median of its repeats: on a noisy machine a
    method timed against itself misses 0.97x on many turns, so read the counts beside
    such a control (``ar@fresh`` runs ``ar`` again).

    Raises:
        ValueError: when ``baseline`` has no records.
    """
    base = {(r.question_id, r.turn): r for r in records if r.method == baseline}
    if not base:
        raise ValueError(f"baseline {baseline!r} has no records")
    mine: dict[str, list[tuple[float, float, tuple[int, int]]]] = defaultdict(list)
    for r in records:
        b = base.get((r.question_id, r.turn))
        if r.method == baseline or b is None:
            continue
        mine[r.method].append((r.tokens_per_s / b.tokens_per_s, r.decode_tokens_per_s / b.decode_tokens_per_s,
                               (r.question_id, r.turn)))
    out = {}
    for method, rows in mine.items():
        decode = [d for _, d, _ in rows]
        low = min(rows)
        out[method] = TurnShortfalls(
            method=method, baseline=baseline, threshold=threshold, turns=len(rows),
            below=sum(w < threshold for w, _, _ in rows),
            decode_below=-1 if any(math.isnan(d) for d in decode) else sum(d < threshold for d in decode),
            lowest=low[0], lowest_at=low[2])
    return out


def accept_histograms(records: Iterable[TurnRecord]) -> dict[str, dict[int, int]]:
    """Per method: tokens committed per step -> number of steps, over all its records."""
    hist: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        hist[r.method].update(r.accept_hist)
    return {m: dict(sorted(h.items())) for m, h in hist.items()}


def method_order(records: Iterable[TurnRecord]) -> list[str]:
    """Methods in the order they first appear in ``records``."""
    seen: dict[str, None] = {}
    for r in records:
        seen.setdefault(r.method, None)
    return list(seen)


def as_dict(summaries: Mapping[tuple[str, str], TaskSummary]) -> dict[str, dict[str, dict]]:
    """``{method: {task: fields}}`` for JSON."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (method, task), s in summaries.items():
        out[method][task] = {k: v for k, v in s.__dict__.items() if k not in ("method", "task")}
    return dict(out)
