"""The benchmark loop: warm-up, then every question, turn and method, with repeats.

Order of work (all methods inside one process, interleaved per question, so
a slow spell of a shared machine hits every method alike):

    warm-up: one short generation per method, not recorded
    for each question, for each turn:
        prompt ids = chat template over the conversation so far
        for each repeat, for each method (the reference ``ar`` first):
            (repeats after the first: method.restore(its snapshot before the first))
            time method.generate(prompt ids); check its tokens against ar's
        (with repeats: each method restored to what its first repeat left)

A method whose calls learn from each other (a kept drafting state) thus times every repeat of
a turn from the same state, and the run goes on as with one repeat: the median of several
calls is not flattered by what the earlier ones taught it.

Turn 2 of an MT-bench question is asked with the first question and ``ar``'s
first answer in the context, for every method. Every method's first answer
has already been checked equal to ``ar``'s at that point (a mismatch stops
the run on turn 1), so this is the same context each method would build
from its own answer, and all methods get byte-identical prompt ids.
"""
from __future__ import annotations

import math

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from .documents import extract_documents
from .exactness import ExactnessCheck, OutputMismatch, canonical
from .methods import Method, MethodOutput
from .tasks import Question


class ChatCodec(Protocol):
    """Turns a conversation into prompt ids, and answer ids back into text."""

    def encode(self, messages: Sequence[Mapping[str, str]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class HFChatCodec:
    """A Hugging Face tokenizer's chat template (ready for the assistant's turn) and decoder."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        from lookupdec.prompts import encode_prompt

        return encode_prompt(self.tokenizer, [dict(m) for m in messages])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


@dataclass(frozen=True)
class RunConfig:
    """How the loop runs.

    Attributes:
        max_new_tokens: new tokens per generation at most.
        repeats: generations per (question, turn, method); times are their median.
        warmup_tokens: new tokens of each method's unrecorded warm-up generation.
        sampled: the methods sample (temperature > 0). lookupdec draws each output
            position at a number keyed by the seed and the position, so a method
            whose drafts are deterministic (``same_draws``) emits the reference's
            tokens and is compared token for token; the others (transformers'
            sampling, ``draft``'s sampled drafts) are not, and the chi-square tests
            of the test suite prove their distribution instead. Turn 2 continues
            the reference's turn-1 answer.
    """

    max_new_tokens: int = 128
    repeats: int = 1
    warmup_tokens: int = 16
    sampled: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be >= 0 (0 skips warm-up), got {self.warmup_tokens}")


@dataclass(frozen=True)
class TurnRecord:
    """One method's figures on one turn of one question.

    Attributes:
        method, question_id, category, task: what ran on what.
        turn: 1 or 2.
        new_tokens: new tokens without a trailing EOS (equal across methods
            when outputs are exact; the numerator of tokens/s).
        seconds: median wall time of the ``generate`` call over the repeats.
        seconds_repeats: every repeat's wall time.
        steps: target forward passes (prefill included).
        committed_tokens: tokens the steps committed, a final EOS included
            (the numerator of mean accepted tokens per step).
        accept_hist: tokens committed per step -> number of steps.
        token_ids: the canonical new tokens.
        forward_ms, overhead_ms: time inside / outside the target's forward
            passes (first repeat; NaN for methods that do not report it).
        prefill_ms: median over the repeats of the first step's time (the prompt's
            forward up to the first new token; NaN when not reported).
        prefill_tokens: new tokens that first step gave.
    """

    method: str
    question_id: int
    category: str
    task: str
    turn: int
    new_tokens: int
    seconds: float
    seconds_repeats: tuple[float, ...]
    steps: int
    committed_tokens: int
    accept_hist: Mapping[int, int] = field(default_factory=dict)
    token_ids: tuple[int, ...] = ()
    forward_ms: float = math.nan
    overhead_ms: float = math.nan
    prefill_ms: float = math.nan
    prefill_tokens: int = 1

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens/s after the turn's first step (``decode_rate``)."""
        return decode_rate(self.new_tokens, self.seconds, self.prefill_ms, self.prefill_tokens)


def decode_rate(new_tokens: int, seconds: float, prefill_ms: float, prefill_tokens: int) -> float:
    """Tokens/s without the first steps: NaN where their time is unknown or nothing is left.

    Example:
        >>> decode_rate(101, 3.0, 1000.0, 1)
        50.0
    """
    seconds = seconds - prefill_ms / 1e3
    tokens = new_tokens - prefill_tokens
    return tokens / seconds if seconds > 0 and tokens > 0 else math.nan


def _record(method: str, q: Question, turn: int, outs: list[MethodOutput], secs: list[float],
            eos_ids: Sequence[int]) -> TurnRecord:
    first = outs[0]  # repeats give identical tokens (checked); steps come from the first
    ids = canonical(first.token_ids, eos_ids)
    lengths = first.step_lengths or ()
    return TurnRecord(
        method=method, question_id=q.question_id, category=q.category, task=q.task, turn=turn,
        new_tokens=len(ids), seconds=statistics.median(secs), seconds_repeats=tuple(secs),
        steps=first.steps, committed_tokens=len(first.token_ids),
        accept_hist=dict(sorted(Counter(lengths).items())), token_ids=ids,
        forward_ms=first.forward_ms, overhead_ms=first.overhead_ms,
        prefill_ms=statistics.median(o.prefill_ms for o in outs),
        prefill_tokens=min(lengths[0] if lengths else 1, len(ids)),
    )


def run_benchmark(questions: Sequence[Question], methods: Mapping[str, Method], codec: ChatCodec,
                  check: ExactnessCheck, config: RunConfig = RunConfig(),
                  records: list[TurnRecord] | None = None,
                  log: Callable[[str], None] | None = None,
                  on_answer: Callable[[tuple[int, ...]], None] | None = None,
                  mismatches: list[OutputMismatch] | None = None) -> list[TurnRecord]:
    """Run every method on every question and turn, checking exactness as it goes.

    Args:
        questions: the questions to run, in order.
        methods: name -> method; must contain ``check.reference``.
        codec: builds each turn's prompt ids and decodes the reference answer.
        check: the exactness check (reference method and EOS ids).
        config: token limits and repeats.
        records: a list to append records to as they are made (so a caller
            keeps the figures gathered before a mismatch); a new one if None.
        log: receives one progress line per question.
        on_answer: called with the reference's answer (token ids) once every method has
            run a turn: what a history store of finished outputs learns, as a server's would.
        mismatches: when given, an output that differs from the reference's is appended here
            and the run goes on (None: it raises).

    Returns:
        ``records``: one ``TurnRecord`` per (question, turn, method).

    Raises:
        ValueError: if the reference method is not among ``methods``.
        OutputMismatch: at the first output that differs from the reference's (unless
            ``mismatches`` collects them).

    Example:
        >>> recs = run_benchmark(questions, {"ar": ar, "pld": pld}, codec,
        ...                      ExactnessCheck("ar", (2,)))  # doctest: +SKIP
    """
    if check.reference not in methods:
        raise ValueError(f"the reference method {check.reference!r} must be run; got methods {list(methods)}")
    order = [check.reference] + [m for m in methods if m != check.reference]
    records = [] if records is None else records
    if not questions:
        return records

    if config.warmup_tokens:
        q0 = questions[0]
        ids = codec.encode([{"role": "user", "content": q0.turns[0]}])
        refs = extract_documents(q0.task, q0.turns[0])
        for name in order:
            methods[name].generate(ids, config.warmup_tokens, refs)

    for qi, q in enumerate(questions):
        messages: list[dict[str, str]] = []
        t_question: dict[str, list[float]] = {name: [0, 0.0] for name in order}
        for turn, text in enumerate(q.turns, 1):
            messages.append({"role": "user", "content": text})
            prompt_ids = codec.encode(messages)
            refs = extract_documents(q.task, text)
            outs: dict[str, list[MethodOutput]] = {name: [] for name in order}
            secs: dict[str, list[float]] = {name: [] for name in order}
            expected: tuple[int, ...] | None = None
            starts: dict[str, object] = {}
            ends: dict[str, object] = {}
            for r in range(config.repeats):
                for name in order:
                    if config.repeats > 1:  # every repeat starts from what the first started from
                        if r == 0:
                            starts[name] = methods[name].snapshot()
                        else:
                            methods[name].restore(starts[name])
                    t0 = time.perf_counter()
                    out = methods[name].generate(prompt_ids, config.max_new_tokens, refs)
                    dt = time.perf_counter() - t0
                    if expected is None:
                        expected = out.token_ids  # the reference's first output
                    elif not config.sampled or methods[name].same_draws:
                        try:
                            check.check(name, q.question_id, turn, expected, out.token_ids)
                        except OutputMismatch as exc:
                            if mismatches is None:
                                raise
                            mismatches.append(exc)
                    outs[name].append(out)
                    secs[name].append(dt)
                    if config.repeats > 1 and r == 0:
                        ends[name] = methods[name].snapshot()
            for name in order:  # and the next turn from what the first repeat left (in the run's order)
                if config.repeats > 1:
                    methods[name].restore(ends[name])
            for name in order:
                rec = _record(name, q, turn, outs[name], secs[name], check.eos_ids)
                records.append(rec)
                t_question[name][0] += rec.new_tokens
                t_question[name][1] += rec.seconds
            answer = codec.decode(canonical(expected, check.eos_ids))
            messages.append({"role": "assistant", "content": answer})
            if on_answer is not None:
                on_answer(tuple(expected))
        if log is not None:
            speeds = ", ".join(f"{n} {tok / s:.1f}" if s > 0 else f"{n} -" for n, (tok, s) in t_question.items())
            log(f"[{qi + 1}/{len(questions)}] q{q.question_id} {q.task}: tok/s {speeds}")
    return records
