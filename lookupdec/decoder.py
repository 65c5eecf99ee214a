"""The decoder: a target model loaded once, and the loop that decodes a prompt with it.

Each step the drafter proposes a DraftTree under the last committed token
(the root); the verifier runs the root and the tree through the target in one
forward; the acceptance rule (greedy or exact speculative sampling) picks the
longest valid path plus a bonus token; the cache keeps only that path's rows.
Plain autoregressive decoding (``ar``) is the same loop with empty trees.
One request's state between forwards lives in ``lookupdec.sequence``; this
module turns a request into one and steps it.

Lossless: greedy output equals plain greedy decoding of the same model with
the same kernels; sampled output has the target's distribution.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from lookupdec.decoder_args import (check_callback, check_cost_curve, check_cost_refresh, check_decodable, check_flag,
                                    check_max_new_tokens, check_seed, checked_budget, checked_prompt, checked_stops,
                                    open_history_arg, open_indexes, prediction_ids, reference_ids, renamed_arguments,
                                    sampling_params)
from lookupdec.drafters.base import as_drafter
from lookupdec.drafters.state import DrafterState
from lookupdec.methods import METHODS, make_drafter, method_inputs, method_prices  # noqa: F401  (METHODS: re-exported)
from lookupdec.models import LoadedModel, load_model
from lookupdec.prefix_cache import check_prefix_cache_mb, prefix_store
from lookupdec.prompts import encode_prompt
from lookupdec.results import GenerationResult
from lookupdec.sequence import Sequence as DecodeSequence  # typing's Sequence is used below

STOP_REASONS = ("eos", "stop", "length")
# Most tree nodes verified per step unless the Decoder is told otherwise; each
# method drafts what pays within it (auto by the cost curve, pld up to 12).
DEFAULT_DRAFT_BUDGET = 64


class Decoder:
    """A target model loaded once, decoding many prompts.

    Args:
        model: a model id / directory / .gguf path, None for the embedded
            default, or an already ``LoadedModel``.
        dtype: "float32" (default), "bfloat16" or "float16".
        device: torch device; None = the environment's LOOKUPDEC_DEVICE when set, else CUDA when available, else CPU.
        hf_kernels: run transformers' own forward and kernels (CLI ``--hf-kernels``).
            Default False: on CPU in float32, Llama-family models run the lean
            forward of ``lookupdec.fast_forward``, others transformers' forward
            with linear weights prepacked for oneDNN (only for a model loaded
            here: a model passed in is never changed). Greedy output then equals
            our ``ar`` with the same kernels; set True to match transformers'
            kernels (and its ``generate()``) exactly. With a model loaded here,
            the fast forward keeps the only copy of its linear weights, so
            ``decoder.model``'s own forward is not usable then.
        tree_masks: None = from the model's attention implementation; False
            forces chain verification.
        draft_budget: most tree nodes verified per step.
        indexes: corpus datastores for ``rest`` and ``auto`` (CLI ``--index``,
            repeatable): index directories or opened ``SuffixIndex`` objects (one
            or a list). Opened and checked against the model's tokenizer here,
            before any generation.
        cost_curve: the verifier's ``CostCurve`` for ``auto``; None = measured
            on first use and cached on disk (``lookupdec.costs``). Either way it is
            the prior of the decoder's ``CostModel`` (``costs()``), which measured
            steps correct.
        cost_refresh: what to do, before the next request, when the measured steps
            contradict the curve (``CostModel.stale``): "fit" (default) takes the steps'
            fit as the new prior (no pause, nothing written to disk); "measure" measures
            the curve again (seconds; replaces the cached file); "off" keeps correcting
            online only. A curve given as ``cost_curve`` is never measured again ("measure"
            acts as "fit"). Every decision is logged (logger ``lookupdec.pricing``).
        history: a store of earlier outputs (a directory, created if needed, or an
            open ``HistoryStore``): every finished generation is added to it, and
            ``history`` and ``auto`` draft from it.
        history_budget: most tokens the history keeps, >= 1 (default
            ``lookupdec.index.history.DEFAULT_BUDGET_TOKENS``; oldest dropped first).
        draft_model: a small draft model for method ``draft`` and ``auto`` (the
            small-LM fallback): a model id / directory / .gguf path or a
            ``LoadedModel``; it must share the target's tokenizer, ids included.
        draft_layers: cut the draft model (the target itself when ``draft_model``
            is None) to its first K decoder layers.
        weights: the fast forward's weight format (CLI ``--weights``; ``lookupdec.weights``):
            "float32", "float16", "quantized" (a GGUF's own Q4_1 / Q8_0 blocks, float32's
            values), "quantized-bf16" / "quantized-int8" (those blocks with bfloat16 or
            llama.cpp's 8-bit products: cheaper wide forwards, a slightly different model,
            never picked by auto), or "auto" (default): for a GGUF of quantized or float16
            matrices the format measured fastest here (cached), else float32. Greedy output
            equals ``ar`` in the same format. ``weights_choice`` says what was used and why.
        prefix_cache_mb: MiB of KV rows kept from finished requests, reused by later prompts
            that begin with the same tokens (``lookupdec.prefix_cache``; ``prefixes`` is the
            store, None when off). None (default): ``prefix_cache.DEFAULT_MB`` in the quantized
            formats, where a reused row is the prefill's own bit for bit, else off; 0: off;
            a number turns it on in any format of the fast forward (in the float formats a
            reused row may differ from the prefill's in the last bits, as a tree's rows do).
        kv_dtype: the fast forward's KV cache elements (``--kv-dtype``): "float32" (default) or "float16"
            (half the bytes; a slightly different model: greedy output equals ``ar`` with the same choice).

    Raises:
        IndexFormatError, TokenizerMismatchError: an index or history store that
            cannot serve this model.
        HistoryError: the history directory cannot be created or written.
        ModelLoadError: the model cannot be loaded, or its layers keep a recurrent
            state (Mamba, linear attention, ...), which verification cannot roll back.

    Example:
        >>> dec = Decoder()                                         # doctest: +SKIP
        >>> dec.generate("Repeat: a b c d").text                    # doctest: +SKIP
    """

    def __init__(self, model=None, *, dtype: str = "float32", device: str | None = None, hf_kernels: bool = False,
                 tree_masks: bool | None = None, draft_budget: int = DEFAULT_DRAFT_BUDGET, indexes=None,
                 cost_curve=None, history=None, history_budget: int | None = None, draft_model=None,
                 draft_layers: int | None = None, cost_refresh: str = "fit", weights: str = "auto",
                 prefix_cache_mb: float | None = None, kv_dtype: str = "float32", **renamed) -> None:
        import torch

        from lookupdec.fast_kernels import fast_kernels_available, pack_linears
        from lookupdec.kvcache import check_kv_dtype
        from lookupdec.products import QUANTIZED_FORMATS
        from lookupdec.weights import check_weights, decoder_verifier

        check_weights(weights)
        check_kv_dtype(kv_dtype)
        prefix_cache_mb = check_prefix_cache_mb(prefix_cache_mb)
        self.draft_budget = checked_budget(draft_budget)
        check_cost_curve(cost_curve)
        check_cost_refresh(cost_refresh)
        indexes, hf_kernels = renamed_arguments(renamed, indexes, hf_kernels)
        check_flag(hf_kernels, "hf_kernels")
        check_flag(tree_masks, "tree_masks", none_ok=True)
        indexes = open_indexes(indexes)  # file errors before the model loads
        # A model loaded here for the quantized formats may leave its layer matrices unread: those
        # formats read the file's blocks (lookupdec.deferred); anything else reads them first.
        defer = (not hf_kernels and draft_model is None and draft_layers is None
                 and weights in ("auto",) + QUANTIZED_FORMATS)
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, dtype=dtype, device=device,
                                                                              defer_matrices=defer)
        check_decodable(self.loaded)
        for idx in indexes:
            idx.check_tokenizer(self.tokenizer, self.loaded.name)
        self.indexes = indexes
        self.history = open_history_arg(history, self.tokenizer, history_budget)
        self.fast_kernels = not hf_kernels and fast_kernels_available(self.loaded.model)
        # The draft model before the target's weights may be released (draft_layers copies them).
        draft_loaded = None
        if draft_model is not None or draft_layers is not None:
            from lookupdec.models import load_draft_model

            draft_loaded = load_draft_model(draft_model, self.loaded, layers=draft_layers, dtype=dtype, device=device)
        # A model the caller passed in is never changed; one loaded here is ours to repack, and only its
        # weights are surely still its file's (the quantized blocks are then read, not recovered).
        owned = not isinstance(model, LoadedModel)
        self.verifier, self.weights_choice = decoder_verifier(self.loaded, owned, weights=weights, tree_masks=tree_masks,
                                                              fast=self.fast_kernels, threads=torch.get_num_threads(),
                                                              kv_dtype=kv_dtype)
        self.weights = self.weights_choice.weights  # "float32" / "float16"; "" on transformers' forward
        if self.fast_kernels and self.verifier.backend == "hf":
            if owned:
                pack_linears(self.loaded.model)
            else:
                self.fast_kernels = False
        self.vocab_size = int(self.loaded.model.config.get_text_config(decoder=True).vocab_size)
        self._cost_curve = cost_curve
        self._cost_curve_given = cost_curve is not None
        self.cost_refresh = cost_refresh
        self._cost_model = None  # lookupdec.pricing.CostModel, made from the curve on first use
        self._torch = torch
        self.draft = None  # the small-LM fallback's DraftModel (decoder state, like the calibration)
        if draft_loaded is not None:
            from lookupdec.drafters.small_lm import DraftModel

            self.draft = DraftModel(draft_loaded, fast=not hf_kernels and fast_kernels_available(draft_loaded.model))
        self.prefixes = prefix_store(self.verifier.fast, prefix_cache_mb)
        self.reset_state()  # what drafting learns across requests, handed to the drafters (drafters/state.py)

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def cost_curve(self, remeasure: bool = False):
        """The verifier's cost curve (``lookupdec.costs.CostCurve``): cached on disk, measured on first use.

        Args:
            remeasure: measure again now (and replace the cached curve).
        """
        if self._cost_curve is None or remeasure:
            from lookupdec.costs import cached_curve

            self._cost_curve = cached_curve(self.verifier, self._torch.get_num_threads(), remeasure=remeasure)
            if self._cost_model is not None:
                self._cost_model.reset(self._cost_curve)
        return self._cost_curve

    def use_cost_curve(self, curve) -> None:
        """Price with ``curve`` from now on, as if it had been given as ``cost_curve``.

        The cost model starts again from it (the steps it had seen are forgotten). Benchmarks
        use it to start from a curve that is wrong on purpose (``pricing.scaled_curve``).
        """
        from lookupdec.costs import CostCurve

        if not isinstance(curve, CostCurve):
            raise TypeError(f"use_cost_curve takes a CostCurve, got {type(curve).__name__}")
        self._cost_curve = curve
        self._cost_curve_given = True
        if self._cost_model is not None:
            self._cost_model.reset(curve)

    def costs(self):
        """The decoder's one cost provider (``lookupdec.pricing.CostModel``): the cost curve, corrected by steps.

        Resolved (the curve loaded or measured) on first call; ``new_sequence`` calls it before
        a request's first timed step for every method that prices with it. When the steps so far
        contradict the curve (``CostModel.stale``), it is refreshed here as ``cost_refresh`` says,
        and the decision is logged (logger ``lookupdec.pricing``).
        """
        from lookupdec.pricing import CostModel, settle_stale

        if self._cost_model is None:
            self._cost_model = CostModel(self.cost_curve())
        remeasure = None if self._cost_curve_given else (lambda: self.cost_curve(remeasure=True))
        settle_stale(self._cost_model, self.cost_refresh, remeasure)
        return self._cost_model

    @property
    def calibration(self):
        """The acceptance rates learned so far (``drafters/calibrate.py``): part of ``state``."""
        return self.state.calibration

    def state_path(self) -> Path:
        """Where ``save_state`` and ``load_state`` go by default (``drafters/saved.py``)."""
        from lookupdec.drafters.saved import default_path

        return default_path(self.verifier, self._torch.get_num_threads(), self.loaded.name)

    def save_state(self, path: str | Path | None = None, *, warn: bool = True):
        """Save what drafting has learned to ``path`` (default ``state_path()``): a ``StateFile``, true when
        saved; one that cannot be written says why (``problem``), logged (``lookupdec.state``) if ``warn``."""
        from lookupdec.drafters.saved import save_state

        return save_state(self.state, path or self.state_path(), self.vocab_size, warn)

    def load_state(self, path: str | Path | None = None, *, warn: bool = True):
        """Start from a saved drafting state (default ``state_path()``): a ``StateFile``, true when read. A
        missing file reads nothing, quietly; an invalid one changes nothing and says why, as ``save_state``.
        Outputs never depend on the state: only how many tokens each step drafts."""
        from lookupdec.drafters.saved import load_state

        return load_state(self.state, path or self.state_path(), self.vocab_size, warn)

    def reset_state(self) -> None:
        """Forget what drafting has learned (acceptance rates, Token Recycling's tables, ``auto``'s
        accounts and gates) and the prompts' kept cache rows (``prefixes``), as a new process
        starts; the cost curve and the draft model stay."""
        from lookupdec.drafters.calibrate import Calibration

        self.state = DrafterState(Calibration(), self.costs, self.draft)
        if self.prefixes is not None:
            self.prefixes.clear()

    def _ledger(self, method: str, temperature: float):
        """The decoder's ``SourceLedger`` for ``method`` at ``temperature``'s band (created on first use)."""
        return self.state.ledger(method, temperature)

    def encode(self, prompt, chat_template: bool = True) -> list[int]:
        """Token ids of ``prompt`` (see ``lookupdec.prompts.encode_prompt``)."""
        return encode_prompt(self.tokenizer, prompt, chat_template)

    def generate(self, prompt, *, method: str = "auto", max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop: Sequence[str] | str | None = None,
                 references: Sequence[str] | None = None, chat_template: bool = True,
                 on_text: Callable[[str], None] | None = None, drafter=None, remember: bool = True,
                 grammar=None, prediction: str | None = None, do_sample: bool | None = None) -> GenerationResult:
        """Generate a continuation of ``prompt``.

        Args:
            prompt: a string, a list of chat messages, or a list of token ids (used as-is).
            method: drafting method (``lookupdec.methods.METHODS``: "auto", "pld", "ar", ...).
            max_new_tokens: the most tokens generated (never exceeded).
            temperature, top_p, top_k: sampling settings; temperature 0 = greedy.
            do_sample: transformers' switch, accepted with its meaning: False decodes
                greedily whatever ``temperature`` says; True samples, at temperature 1.0
                (transformers' default) when ``temperature`` is 0. None (default): sample
                exactly when ``temperature`` > 0. The model's ``generation_config``
                sampling defaults are not applied: lookupdec decodes greedily unless
                asked, so an output is ``ar``'s unless sampling was requested.
            seed: seeds the sampling. What the same seed reproduces (README "What is
                guaranteed", tests/test_seeded.py): greedy output is ``ar``'s whatever the seed and
                the decoder's state. Sampled, the token at each output position is drawn at a
                uniform number keyed by the seed and the position, so every method whose drafts
                are deterministic (all but ``draft`` sampling its own drafts) gives sampled
                ``ar``'s tokens for the same seed, on any decoder and on every call; ``draft``'s
                sampled drafts keep the target's distribution without that promise.
            stop: stop string(s): generation ends when the text contains one;
                the text is cut where it starts.
            references: documents (strings) to draft from, for methods that take
                them (``llma``, ``auto``); tokenized here.
            chat_template: apply the tokenizer's chat template to str/message prompts.
            on_text: called with each new piece of text as it becomes final.
            drafter: a ``lookupdec.Drafter`` (or an object with ``begin``/``propose``/``commit``,
                given the base class's default hooks), used instead of ``method``.
            remember: add the output to the decoder's history store (when it has one).
            grammar: structured output: a JSON Schema dict, a list of choices, or
                ``lookupdec.JsonSchema`` / ``Regex`` / ``Lark`` / ``Choice``. The output then
                follows it exactly as constrained ``ar`` would (EOS only once it is complete);
                ``result.incomplete`` tells when ``max_new_tokens`` ran out first.
            prediction: text the output will mostly repeat (a file being edited, a document being
                corrected: OpenAI's Predicted Outputs), drafted from by ``auto`` and ``llma``; its
                accepted tokens are counted under ``accepted_by_source["prediction"]``.
        Returns:
            A GenerationResult.
        Raises:
            ContextTooLongError: prompt plus max_new_tokens exceed the model's context.
            DraftError: a drafter proposed an invalid tree.
            ConstraintError: a ``grammar`` that is malformed or does not compile (raised
                before any model work).
            ValueError: bad settings (unknown method, negative max_new_tokens,
                references for a method that does not use them, ...).
        """
        check_flag(remember, "remember")
        seq = self.new_sequence(prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, seed=seed, stop=stop, references=references,
                                chat_template=chat_template, on_text=on_text, drafter=drafter, grammar=grammar,
                                prediction=prediction, do_sample=do_sample)
        # auto's steps are judged by what they deliver against plain steps (lookupdec.batch.BatchGate).
        gate = self.state.gate(method, seq.params.temperature) if method == "auto" and drafter is None else None
        result = seq.run(gate)
        if remember:
            self.remember(result)
        return result

    def remember(self, result: GenerationResult) -> None:
        """Add a result's tokens to the decoder's history store (when it has one)."""
        if self.history is not None and result.token_ids:
            self.history.append(result.token_ids)  # remembered whatever produced it

    def new_sequence(self, prompt, *, method: str = "auto", max_new_tokens: int = 128, temperature: float = 0.0,
                     top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                     stop: Sequence[str] | str | None = None, references: Sequence[str] | None = None,
                     chat_template: bool = True, on_text: Callable[[str], None] | None = None, drafter=None,
                     grammar=None, prediction: str | None = None, do_sample: bool | None = None) -> DecodeSequence:
        """One request as a ``lookupdec.sequence.Sequence``, checked and ready for ``prefill``.

        Args:
            prompt ... grammar: as for ``generate``.
            prediction: text the output is expected to repeat mostly (OpenAI's Predicted
                Outputs), drafted from as LLMA drafts from a reference (methods ``auto`` and
                ``llma``); its accepted tokens are counted under the source ``prediction``.
        Returns:
            The sequence (not yet prefilled): ``generate`` steps it alone, ``generate_batch``
            and the server step several together.
        Raises:
            As ``generate`` (every check happens here, before any model work).
        """
        from lookupdec.sampling import request_generators

        params = sampling_params(temperature, top_p, top_k, do_sample)
        check_seed(seed)
        check_max_new_tokens(max_new_tokens)
        stops = checked_stops(stop)
        check_callback(on_text, "on_text", "each new piece of text")
        check_flag(chat_template, "chat_template")
        constraint = None if grammar is None else self.constraint(grammar)
        prompt_ids = self.prepare(prompt, max_new_tokens, chat_template)
        if drafter is None:
            ref_ids = reference_ids(self.tokenizer, references)
            pred_ids = prediction_ids(self.tokenizer, prediction)
            # Datastores and the history belong to the decoder: methods that do not
            # draft from them simply do not get them.
            uses = method_inputs(method)
            # The cost provider is resolved now, before the request's first timed step.
            cost = self.costs() if method_prices(method) else self.costs
            drafter = make_drafter(method, references=ref_ids, prediction=pred_ids,
                                   indexes=self.indexes if "indexes" in uses else None,
                                   history=self.history if "history" in uses else None,
                                   calibration=self.calibration.band(params.temperature), cost=cost,
                                   vocab_size=self.vocab_size, ledger=self._ledger(method, params.temperature),
                                   draft_model=self.draft, state=self.state)
            method_name = method
        else:
            if references or prediction:
                raise ValueError("references and a prediction go to the method's drafters; with drafter=, pass "
                                 "them to it directly")
            drafter = as_drafter(drafter)
            method_name = drafter.name
        # A drafter that samples gets the request's settings and its own generator (others ignore them).
        generator, draft_gen = request_generators(params, seed)
        drafter.set_sampling(params, draft_gen)
        return DecodeSequence(self, prompt_ids, drafter, method_name, int(max_new_tokens), params, generator, stops,
                              on_text, constraint)

    def generate_batch(self, prompts: Sequence, *, batch_size: int = 8, references=None, predictions=None,
                       remember: bool = True, on_result: Callable[[int, GenerationResult], None] | None = None,
                       **kwargs) -> list[GenerationResult]:
        """Generate for several prompts, up to ``batch_size`` at a time verified in one forward per step.

        Continuous batching: a prompt joins as soon as another finishes. Each step prices the
        batch's drafts together at the batch's total width (``lookupdec.batch.price_batch``),
        so speculation shrinks as the batch grows. Greedy outputs equal ``generate``'s for
        each prompt alone (up to the float rounding of wider products); sampled outputs
        keep the target's distribution (with a ``seed`` prompt ``i`` gets ``seed + i``, and a
        method with deterministic drafts then gives it sampled ``ar``'s tokens for that seed).

        Args:
            prompts: the prompts (as for ``generate``).
            batch_size: most sequences stepped together.
            references: None, or one list of documents per prompt (None entries allowed).
            predictions: None, or one predicted-output string per prompt (None entries allowed).
            remember: add every output to the history store.
            on_result: called with (index, result) as each prompt finishes.
            **kwargs: the other ``generate`` settings, shared by every prompt (method,
                max_new_tokens, temperature, top_p, top_k, seed, stop, chat_template, grammar).
        Returns:
            One ``GenerationResult`` per prompt, in order.
        Raises:
            ValueError, TypeError, ContextTooLongError, ConstraintError: a bad setting or prompt,
                raised for the first bad prompt before any model work.

        Example:
            >>> dec.generate_batch(["Say a", "Say b"], method="ar", max_new_tokens=4)  # doctest: +SKIP
        """
        from lookupdec.batch import generate_batch

        return generate_batch(self, prompts, batch_size, references, predictions, remember, on_result, kwargs)

    def prepare(self, prompt, max_new_tokens: int, chat_template: bool = True) -> list[int]:
        """The prompt's token ids, checked to fit the context with ``max_new_tokens`` more.

        Raises:
            ContextTooLongError: naming both lengths and the largest max_new_tokens that fits.
            TypeError, ValueError: a prompt of none of the accepted forms, an empty one,
                or a token id outside the vocabulary.
        """
        return checked_prompt(self.encode(prompt, chat_template), self.vocab_size, self.loaded.max_context,
                              max_new_tokens)

    def constraint(self, grammar):
        """A fresh ``lookupdec.constraints.Constraint`` for ``grammar`` with this model's tokenizer.

        Raises:
            ConstraintError: the grammar is malformed or does not compile.
        """
        from lookupdec.constraints import Constraint

        return Constraint(grammar, self.tokenizer, self.vocab_size, self.loaded.eos_ids)
