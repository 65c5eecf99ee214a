"""What a generation returns: per-step statistics and the result."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepStats:
    """One decoding step (one forward of the target).

    Attributes:
        draft_size: tree nodes verified (0 for a plain step and the prefill).
        accepted: draft tokens accepted (the bonus token not counted).
        draft_ms: time in the drafter (propose + commit).
        verify_ms: time in the target's forward.
        other_ms: everything else: acceptance, cache commit, stop checks, decoding text, and (in
            ``generate``) the loop's time between steps, so that the steps' times add up to
            ``elapsed_s``.
    """

    draft_size: int
    accepted: int
    draft_ms: float
    verify_ms: float
    other_ms: float


@dataclass(frozen=True)
class GenerationResult:
    """The output of one ``generate`` call.

    Attributes:
        text: the generated text (special tokens skipped, cut before a stop string).
        token_ids: the new token ids (an EOS that ended generation included).
        prompt_tokens: length of the prompt in tokens.
        new_tokens: ``len(token_ids)``.
        steps: forwards of the target, the prefill included.
        mean_accepted: ``new_tokens / steps``: tokens gained per forward.
        tokens_per_s: ``new_tokens / elapsed_s``.
        elapsed_s: wall time from the prefill to the last token.
        method: the drafting method's name.
        stop_reason: "eos", "stop" (a stop string) or "length" (max_new_tokens).
        step_stats: one StepStats per step.
        accepted_by_source: accepted draft tokens per source name
            (``lookupdec.drafters.base.SOURCES``), for sources that had any.
        incomplete: a ``grammar=`` constraint was given and the output is not a complete
            match of it (``max_new_tokens`` or a stop string ended generation first).
        constraint_s: seconds the constraint's engine took (masks, pruning, forced tokens).
        cached_tokens: prompt tokens whose KV rows came from an earlier sequence
            (``lookupdec.prefix_cache``) instead of the prefill.
    """

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    steps: int
    mean_accepted: float
    tokens_per_s: float
    elapsed_s: float
    method: str
    stop_reason: str
    step_stats: tuple[StepStats, ...]
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    incomplete: bool = False
    constraint_s: float = 0.0
    cached_tokens: int = 0
