"""The decoding methods the harness compares, behind one small interface.

A method turns prompt token ids into greedy new token ids and says how many
target forward passes ("steps") it took and how many tokens each step
committed. The harness times the call itself, so every method is timed the
same way.

Peers (transformers ``generate()``):

- ``hf``: plain greedy, the baseline users know;
- ``hf_pld``: ``prompt_lookup_num_tokens=10``, transformers' prompt lookup.

Their steps are counted with a streamer: ``generate()`` hands the streamer
the prompt once, then the tokens of each forward pass in one ``put()`` (one
token per step in greedy search; the accepted draft plus the bonus token in
assisted decoding), so the number of ``put()`` calls after the first is the
number of forward passes and their sizes are the accepted lengths.

lookupdec methods run ``Decoder.generate(prompt_ids, method=NAME)``; their
steps and accepted lengths come from the decoder's ``GenerationResult``.
Adding one is one line in ``LOOKUPDEC_METHODS``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

# Every lookupdec method the harness knows -> whether it takes the documents
# inside rag/summarization prompts as ``references`` (LLMA drafts from them;
# ``auto`` may choose LLMA). Adding a method is one line here.
LOOKUPDEC_METHODS: dict[str, bool] = {
    "ar": False,
    "pld": False,
    "llma": True,
    "rest": False,
    "history": False,
    "lookahead": False,
    "recycle": False,
    "draft": False,  # the small LM alone (needs --draft-model or --draft-layers)
    "auto": True,
}
# transformers generate() peers -> prompt_lookup_num_tokens (None = plain greedy).
PEER_METHODS: dict[str, int | None] = {
    "hf": None,
    "hf_pld": 10,
}
# The method every other method's output is compared against.
REFERENCE_METHOD = "ar"


@dataclass(frozen=True)
class MethodOutput:
    """What one generation returned.

    Attributes:
        token_ids: the new tokens, as the method produced them (an EOS it
            stopped on may or may not be included; see ``exactness.canonical``).
        steps: target-model forward passes, prefill included.
        step_lengths: tokens committed by each step (accepted draft tokens + 1);
            empty when the method does not report them.
        forward_ms: time inside the target's forward passes (NaN when unknown).
        overhead_ms: time outside them: drafting, acceptance, cache commit,
            stop checks (NaN when unknown).
        prefill_ms: the first step's time: the prompt's forward up to the first new
            token (NaN when unknown); ``step_lengths[0]`` tokens came with it (more than one
            where, as in transformers' assisted generation, the first forward also verifies
            a draft). The rest of the call is the decoding proper.
    """

    token_ids: tuple[int, ...]
    steps: int
    step_lengths: tuple[int, ...] = ()
    forward_ms: float = math.nan
    overhead_ms: float = math.nan
    prefill_ms: float = math.nan


class Method(Protocol):
    """A decoding method under test.

    ``takes_references`` says whether ``generate`` uses the documents; the
    harness passes them either way and the method ignores them if not.
    ``same_draws`` says whether, sampled, it draws each position as the reference
    does for the same seed (so a sampled run checks its tokens too).
    """

    name: str
    takes_references: bool
    same_draws: bool

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 references: Sequence[str]) -> MethodOutput: ...

    def snapshot(self) -> object | None:
        """A copy of what the next call starts from, where calls learn from each other (None: they don't)."""

    def restore(self, snapshot: object | None) -> None:
        """Make the next call start from (a copy of) ``snapshot``; None changes nothing."""


class _StepRecorder:
    """A ``generate()`` streamer that records the size of every ``put()`` after the prompt.

    It also times the prefill: from the prompt's ``put()`` (made before the first
    forward) to the first new token's.
    """

    def __init__(self) -> None:
        self.prompt_seen = False
        self.lengths: list[int] = []
        self._prompt_at = math.nan
        self.prefill_ms = math.nan

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self.prompt_seen:  # the first put() is the prompt itself
            self.prompt_seen = True
            self._prompt_at = now
            return
        if not self.lengths:
            self.prefill_ms = (now - self._prompt_at) * 1e3
        self.lengths.append(int(value.numel()))

    def end(self) -> None:
        pass


class HFGenerate:
    """transformers ``model.generate()`` greedy, optionally with prompt lookup.

    Args:
        name: the method's name in reports.
        model: a Hugging Face causal LM with default kernels.
        eos_ids: token ids that end a generation.
        prompt_lookup_num_tokens: tokens per prompt-lookup draft; ``None`` for
            plain greedy search.

    Example:
        >>> m = HFGenerate("hf", loaded.model, loaded.eos_ids)  # doctest: +SKIP
        >>> m.generate([1, 2, 3], 16, ()).steps  # doctest: +SKIP
        16
    """

    takes_references = False
    same_draws = False  # transformers' sampling draws its own way

    def snapshot(self) -> None:
        return None  # every call starts from nothing

    def restore(self, snapshot: None) -> None:
        pass

    def __init__(self, name: str, model, eos_ids: Sequence[int], prompt_lookup_num_tokens: int | None = None,
                 temperature: float = 0.0, seed: int = 0):
        self.name = name
        self.model = model
        self.eos_ids = [int(e) for e in eos_ids]
        self.prompt_lookup_num_tokens = prompt_lookup_num_tokens
        self.temperature = float(temperature)
        self.seed = int(seed)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 references: Sequence[str] = ()) -> MethodOutput:
        import torch
        from transformers import GenerationConfig

        # A fresh config, so no sampling defaults shipped with the model apply.
        sampled = self.temperature > 0
        if sampled:
            torch.manual_seed(self.seed)
        config = GenerationConfig(
            do_sample=sampled,
            temperature=self.temperature if sampled else None,
            top_k=0 if sampled else None,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.eos_ids[0],
            prompt_lookup_num_tokens=self.prompt_lookup_num_tokens,
        )
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.model.device)
        recorder = _StepRecorder()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                      streamer=recorder)
        new = tuple(int(t) for t in out[0, ids.shape[1]:].tolist())
        return MethodOutput(new, len(recorder.lengths), tuple(recorder.lengths), prefill_ms=recorder.prefill_ms)


# What each lookupdec call starts from: kept (what the decoder learned on the run's earlier calls, as
# a server's or a pipeline's long-lived decoder), fresh (nothing learned: a `lookupdec generate
# --fresh-state` call, or any first call), saved (a state file read at the start of every call,
# inside its timing: a `lookupdec generate` call after earlier calls saved theirs).
STATES = ("kept", "fresh", "saved")


def split_state(name: str) -> tuple[str, str | None]:
    """A ``--methods`` entry as (method, state): ``"auto@fresh"`` -> ``("auto", "fresh")``, ``"pld"`` -> ``("pld", None)``.

    Raises:
        ValueError: an unknown state.
    """
    base, at, state = name.partition("@")
    if at and state not in STATES:
        raise ValueError(f"method {name!r}: the state after '@' must be one of {STATES}")
    return base, (state if at else None)


class LookupdecMethod:
    """``lookupdec.Decoder.generate`` with one registered method, greedy.

    Args:
        decoder: a ``lookupdec.Decoder``.
        method: the decoder's method name (``"ar"``, ``"pld"``, ...).
        takes_references: pass the prompt's documents as ``references``.
        state: what each call starts from (``STATES``).
        state_file: the drafting state file of ``state="saved"``.

    Example:
        >>> m = LookupdecMethod(Decoder(), "pld")  # doctest: +SKIP
        >>> m.generate(prompt_ids, 64, ()).token_ids[:3]  # doctest: +SKIP
        (504, 3458, 28)
    """

    def __init__(self, decoder, method: str, takes_references: bool = False, temperature: float = 0.0,
                 seed: int = 0, state: str = "kept", state_file=None):
        if state not in STATES or (state == "saved") != (state_file is not None):
            raise ValueError(f"state must be one of {STATES} (saved, and only saved, with a state file); got {state!r}")
        self.state, self.state_file = state, state_file
        self.name = method
        self.decoder = decoder
        self.takes_references = takes_references
        self.temperature = float(temperature)
        self.seed = int(seed)
        # Sampled, every method but ``draft`` (its small LM samples its drafts) draws each
        # position as sampled ``ar`` does for the same seed: its tokens are ``ar``'s.
        self.same_draws = method != "draft"

    def snapshot(self):
        """A copy of the decoder's drafting state, where this method's calls keep it (``kept``, not ``ar``)."""
        return self.decoder.state.copy() if self.state == "kept" and self.name != "ar" else None

    def restore(self, snapshot) -> None:
        if snapshot is not None:
            self.decoder.state = snapshot.copy()

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 references: Sequence[str] = ()) -> MethodOutput:
        refs = list(references) if (self.takes_references and references) else None
        kept = self.decoder.state  # what the run's kept calls share: a fresh or saved call leaves it as it was
        try:
            if self.state != "kept" and self.name != "ar":  # inside the timed call: a CLI call reads its file too
                self.decoder.reset_state()
                if self.state == "saved" and not self.decoder.load_state(self.state_file):
                    raise ValueError(f"cannot read the drafting state {self.state_file}")
            # remember=False: a history store learns only the reference answer of each finished
            # question (run_benchmark's on_answer), never an answer to the question being run.
            res = self.decoder.generate(list(prompt_ids), method=self.name, max_new_tokens=max_new_tokens,
                                        temperature=self.temperature, seed=self.seed, references=refs,
                                        chat_template=False, remember=False)
        finally:
            self.decoder.state = kept
        lengths = step_lengths_from_stats(res.step_stats, res.new_tokens)
        forward = sum(s.verify_ms for s in res.step_stats)
        overhead = sum(s.draft_ms + s.other_ms for s in res.step_stats)
        # The prefill's forward (its first token chosen with it); the drafter's ``begin`` stays
        # the method's own cost.
        prefill = res.step_stats[0].verify_ms + res.step_stats[0].other_ms if res.step_stats else math.nan
        return MethodOutput(tuple(int(t) for t in res.token_ids), int(res.steps), lengths, forward, overhead,
                            prefill)


def step_lengths_from_stats(step_stats, new_tokens: int) -> tuple[int, ...]:
    """Tokens committed per step from the decoder's ``StepStats``.

    A step commits its accepted draft tokens plus the bonus token; the last
    step may have been cut by ``max_new_tokens`` or EOS, so the total is
    clipped to ``new_tokens``.

    Example:
        >>> from types import SimpleNamespace as S
        >>> step_lengths_from_stats([S(accepted=0), S(accepted=3), S(accepted=2)], 6)
        (1, 4, 1)
    """
    out, left = [], int(new_tokens)
    for s in step_stats:
        n = min(int(s.accepted) + 1, left)
        if n <= 0:
            break
        out.append(n)
        left -= n
    return tuple(out)


def known_method_names(decoder_methods: Sequence[str] | None = None) -> list[str]:
    """Every method name the harness can run, peers first.

    Args:
        decoder_methods: the names the installed decoder registers; ``None``
            keeps every entry of ``LOOKUPDEC_METHODS``.
    """
    names = list(PEER_METHODS)
    for name in LOOKUPDEC_METHODS:
        if decoder_methods is None or name in decoder_methods:
            names.append(name)
    return names
