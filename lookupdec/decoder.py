"""The decoding loop: draft, verify in one forward, accept, commit, repeat.

Each step the drafter proposes a DraftTree under the last committed token
(the root); the verifier runs the root and the tree through the target in one
forward; the acceptance rule (greedy or exact speculative sampling) picks the
longest valid path plus a bonus token; the cache keeps only that path's rows.
Plain autoregressive decoding (``ar``) is the same loop with empty trees.

Lossless: greedy output equals plain greedy decoding of the same model with
the same kernels; sampled output has the target's distribution.
"""
from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from lookupdec.errors import ContextTooLongError
from lookupdec.models import LoadedModel, encode_prompt, load_model
from lookupdec.tree import DraftTree

# Drafting methods by name -> "module:Class" (imported on first use).
METHODS: dict[str, str] = {
    "ar": "lookupdec.drafters.base:NoDrafter",
    "pld": "lookupdec.drafters.pld:PLDDrafter",
}

STOP_REASONS = ("eos", "stop", "length")


@dataclass(frozen=True)
class StepStats:
    """One decoding step (one forward of the target).

    Attributes:
        draft_size: tree nodes verified (0 for a plain step and the prefill).
        accepted: draft tokens accepted (the bonus token not counted).
        draft_ms: time in the drafter (propose + commit).
        verify_ms: time in the target's forward.
        other_ms: everything else: acceptance, cache commit, stop checks, decoding text.
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


def make_drafter(method: str, **context):
    """Instantiate the drafter registered as ``method``.

    Keyword arguments the drafter's constructor accepts (e.g. ``references``,
    ``tokenizer``) are passed on; others are ignored.

    Raises:
        ValueError: an unknown method name.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(METHODS))}")
    module, _, cls_name = METHODS[method].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    params = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in context.items() if k in params and v is not None})


class _TextStream:
    """Incremental detokenisation, stop-string search and streaming of safe text."""

    def __init__(self, tokenizer, stop: Sequence[str], on_text: Callable[[str], None] | None) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.on_text = on_text
        self.sent = 0
        self.text = ""
        # Decoding text each step is only needed for stop strings and streaming.
        self.active = bool(self.stop) or on_text is not None

    def update(self, token_ids: list[int]) -> int | None:
        """Decode the new tokens; if the text now holds a stop string, cut it there and
        return how many tokens to keep (through the one that completes the stop string)."""
        self.text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s)) >= 0]
        if hits:
            cut, s = min(hits)
            self.text = self.text[:cut]
            for k in range(1, len(token_ids) + 1):
                if s in self.tokenizer.decode(token_ids[:k], skip_special_tokens=True):
                    return k
            return len(token_ids)
        self._emit(final=False)
        return None

    def _emit(self, final: bool) -> None:
        if self.on_text is None:
            return
        end = len(self.text)
        if not final:
            # Hold back an incomplete UTF-8 character and a possible stop-string prefix.
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
            for s in self.stop:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k:end] == s[:k]:
                        end -= k
                        break
        if end > self.sent:
            self.on_text(self.text[self.sent:end])
            self.sent = end

    def finish(self) -> None:
        self._emit(final=True)


class Decoder:
    """A target model loaded once, decoding many prompts.

    Args:
        model: a model id / directory / .gguf path, None for the embedded
            default, or an already ``LoadedModel``.
        dtype: "float32" (default), "bfloat16" or "float16".
        device: torch device; None = CUDA when available, else CPU.
        fast_kernels: CPU float32 only (ignored elsewhere): Llama-family
            models run the lean forward of ``lookupdec.fast_forward``, others
            transformers' forward with linear weights prepacked for oneDNN.
            Greedy output then equals our ``ar`` with the same kernels; turn
            off to match transformers' kernels exactly.
        tree_masks: None = from the model's attention implementation; False
            forces chain verification.
        draft_budget: most tree nodes verified per step.

    Example:
        >>> dec = Decoder()                                         # doctest: +SKIP
        >>> dec.generate("Repeat: a b c d", method="pld").text      # doctest: +SKIP
    """

    def __init__(self, model=None, *, dtype: str = "float32", device: str | None = None, fast_kernels: bool = True,
                 tree_masks: bool | None = None, draft_budget: int = 15) -> None:
        import torch

        from lookupdec.fast_kernels import fast_kernels_available, pack_linears
        from lookupdec.verify import TreeVerifier

        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, dtype=dtype, device=device)
        self.fast_kernels = bool(fast_kernels) and fast_kernels_available(self.loaded.model)
        if draft_budget < 0:
            raise ValueError(f"draft_budget must be >= 0, got {draft_budget}")
        self.draft_budget = int(draft_budget)
        # Fast kernels: the lean forward for Llama-family models; other models
        # keep transformers' forward with prepacked linear weights.
        self.verifier = TreeVerifier(self.loaded.model, tree_masks=tree_masks, fast=self.fast_kernels)
        if self.fast_kernels and self.verifier.backend == "hf":
            pack_linears(self.loaded.model)
        self._torch = torch

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def encode(self, prompt, chat_template: bool = True) -> list[int]:
        """Token ids of ``prompt`` (see ``lookupdec.models.encode_prompt``)."""
        return encode_prompt(self.tokenizer, prompt, chat_template)

    def generate(self, prompt, *, method: str = "pld", max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop: Sequence[str] | str | None = None,
                 references: Sequence[str] | None = None, chat_template: bool = True,
                 on_text: Callable[[str], None] | None = None, drafter=None) -> GenerationResult:
        """Generate a continuation of ``prompt``.

        Args:
            prompt: a string, a list of chat messages, or a list of token ids (used as-is).
            method: drafting method ("ar", "pld", ...).
            max_new_tokens: the most tokens generated (never exceeded).
            temperature, top_p, top_k: sampling settings; temperature 0 = greedy.
            seed: seeds the sampling generator (same seed, same output).
            stop: stop string(s): generation ends when the text contains one;
                the text is cut where it starts.
            references: documents for drafters that take them (tokenized here).
            chat_template: apply the tokenizer's chat template to str/message prompts.
            on_text: called with each new piece of text as it becomes final.
            drafter: an object implementing the Drafter protocol, used instead of ``method``.
        Returns:
            A GenerationResult.
        Raises:
            ContextTooLongError: prompt plus max_new_tokens exceed the model's context.
            ValueError: bad settings (unknown method, negative max_new_tokens, ...).
        """
        from lookupdec.sampling import SamplingParams

        torch = self._torch
        params = SamplingParams(float(temperature), float(top_p), int(top_k))
        if int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        prompt_ids = self.encode(prompt, chat_template)
        limit = self.loaded.max_context
        if len(prompt_ids) + max_new_tokens > limit:
            raise ContextTooLongError(
                f"the prompt has {len(prompt_ids)} tokens and max_new_tokens is {max_new_tokens}: "
                f"{len(prompt_ids) + max_new_tokens} > the model's context of {limit} tokens; "
                f"shorten the prompt or set max_new_tokens to at most {max(limit - len(prompt_ids), 0)}"
            )
        if drafter is None:
            ref_ids = None
            if references:
                ref_ids = [list(self.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in references]
            drafter = make_drafter(method, references=ref_ids, tokenizer=self.tokenizer)
            method_name = method
        else:
            method_name = getattr(drafter, "name", type(drafter).__name__)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device="cpu")
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(seed))
        return self._run(prompt_ids, drafter, method_name, int(max_new_tokens), params, generator, stops, on_text)

    def _choose(self, logits, params, generator) -> int:
        if params.greedy:
            return int(logits.argmax().item())
        from lookupdec.sampling import sample, target_probs

        return sample(target_probs(logits, params).cpu(), generator)

    def _run(self, prompt_ids, drafter, method_name, max_new, params, generator, stops, on_text) -> GenerationResult:
        from lookupdec.sampling import target_probs
        from lookupdec.verify import clip_depth, greedy_accept, sample_accept

        torch = self._torch
        eos = set(self.loaded.eos_ids)
        stream = _TextStream(self.tokenizer, stops, on_text)
        stats: list[StepStats] = []
        new: list[int] = []
        stop_reason = "length"
        t_start = time.perf_counter()
        if max_new == 0:
            return self._result(stream, new, prompt_ids, stats, 0.0, method_name, stop_reason)
        budget = self.draft_budget
        cache = self.verifier.new_cache(len(prompt_ids) + max_new + self.verifier.width(budget))
        with torch.inference_mode():
            t0 = time.perf_counter()
            drafter.begin(list(prompt_ids))
            t1 = time.perf_counter()
            logits = self.verifier.prefill(cache, list(prompt_ids))
            t2 = time.perf_counter()
            step_tokens = [self._choose(logits, params, generator)]
            accepted = draft_size = 0
            draft_ms, verify_ms, other_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3, 0.0
            past = len(prompt_ids)
            while True:
                t3 = time.perf_counter()
                # Append this step's tokens, cut at the first EOS and at max_new_tokens.
                for tok in step_tokens:
                    if len(new) >= max_new:
                        break
                    new.append(tok)
                    if tok in eos:
                        stop_reason = "eos"
                        break
                if stream.active:
                    keep = stream.update(new)
                    if keep is not None:
                        del new[keep:]
                        stop_reason = "stop"
                done = stop_reason != "length" or len(new) >= max_new
                t4 = time.perf_counter()
                if not done:
                    drafter.commit(list(step_tokens), accepted)
                t5 = time.perf_counter()
                stats.append(StepStats(draft_size, accepted, draft_ms + (t5 - t4) * 1e3, verify_ms,
                                       other_ms + (t4 - t3) * 1e3))
                if done:
                    break
                # Next step: draft, verify, accept, keep the accepted rows.
                root = new[-1]
                t6 = time.perf_counter()
                tree = drafter.propose(budget) if budget else DraftTree.empty()
                t7 = time.perf_counter()
                if len(tree) > budget:
                    tree = tree.prune(budget)
                # A step emits at most depth + 1 tokens: deeper nodes could never be used.
                tree = clip_depth(tree, max_new - len(new) - 1)
                t8 = time.perf_counter()
                res = self.verifier.forward(cache, past, root, tree)
                t9 = time.perf_counter()
                # Logit rows the walk visits beyond those the verifier fetched are
                # computed on use; their time counts as verification.
                lazy_s = res.rows.compute_s
                if params.greedy:
                    acc = greedy_accept(res.tree, lambda r: int(res.row(r).argmax()))
                else:
                    acc = sample_accept(res.tree, lambda r: target_probs(res.row(r), params), generator)
                lazy_s = res.rows.compute_s - lazy_s
                self.verifier.commit(cache, past, acc.nodes)
                past += 1 + acc.accepted
                t10 = time.perf_counter()
                step_tokens, accepted, draft_size = list(acc.tokens), acc.accepted, len(res.tree)
                verify_ms = (t9 - t8 + lazy_s) * 1e3
                draft_ms, other_ms = (t7 - t6) * 1e3, (t8 - t7 + t10 - t9 - lazy_s) * 1e3
        stream.finish()
        elapsed = time.perf_counter() - t_start
        return self._result(stream, new, prompt_ids, stats, elapsed, method_name, stop_reason)

    def _result(self, stream, new, prompt_ids, stats, elapsed, method_name, stop_reason) -> GenerationResult:
        text = stream.text if stream.active else self.tokenizer.decode(new, skip_special_tokens=True)
        steps = len(stats)
        return GenerationResult(
            text=text,
            token_ids=tuple(new),
            prompt_tokens=len(prompt_ids),
            new_tokens=len(new),
            steps=steps,
            mean_accepted=len(new) / steps if steps else 0.0,
            tokens_per_s=len(new) / elapsed if elapsed > 0 else 0.0,
            elapsed_s=elapsed,
            method=method_name,
            stop_reason=stop_reason,
            step_stats=tuple(stats),
        )


_DEFAULT: dict[tuple, Decoder] = {}


def generate(prompt, *, model=None, dtype: str = "float32", device: str | None = None, fast_kernels: bool = True,
             **kwargs) -> GenerationResult:
    """One-call generation; the Decoder for ``(model, dtype, device, fast_kernels)`` is kept for reuse.

    Args:
        prompt: see ``Decoder.generate``.
        model, dtype, device, fast_kernels: see ``Decoder``.
        **kwargs: passed to ``Decoder.generate`` (method, max_new_tokens, temperature, ...).
    Returns:
        A GenerationResult.
    Example:
        >>> from lookupdec import generate                            # doctest: +SKIP
        >>> generate("Say hi", method="ar", max_new_tokens=8).text    # doctest: +SKIP
    """
    key = (model, dtype, device, fast_kernels)
    if key not in _DEFAULT:
        _DEFAULT[key] = Decoder(model, dtype=dtype, device=device, fast_kernels=fast_kernels)
    return _DEFAULT[key].generate(prompt, **kwargs)
