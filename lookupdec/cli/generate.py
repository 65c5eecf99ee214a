"""`lookupdec generate` and `lookupdec cost-curve`: parse options, call the library, print."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import click

from lookupdec.decoder_args import MAX_DRAFT_BUDGET  # torch-free, as the CLI stays until a command runs
from lookupdec.methods import METHODS  # a plain dict; torch is imported lazily

# --weights of generate, cost-curve and serve: lookupdec.weights.WEIGHTS_CHOICES, spelled out so the
# CLI imports no torch (tests/test_cli_generate.py keeps the two equal).
WEIGHTS = ["auto", "float32", "float16", "quantized", "quantized-bf16", "quantized-int8"]
# --kv-dtype of the same commands: lookupdec.kvcache.KV_DTYPES' names (the same test keeps them equal).
KV_DTYPES = ["float32", "float16"]


@dataclass(frozen=True)
class Request:
    """One prompt to generate for, with its own reference documents and where it was read."""

    prompt: object
    references: tuple[str, ...] = ()
    where: str = ""  # "FILE:LINE" for an --input line


# The fields of an --input line that is an object.
RECORD_FIELDS = ("prompt", "messages", "references")


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise click.ClickException(f"cannot read {what} {path!r}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} on "
                                   f"line {line}); convert the file to UTF-8") from None
    except OSError as exc:
        why = exc.strerror or exc
        raise click.ClickException(f"cannot read {what} {path!r}: {why}; pass a readable file") from None


def _record(rec, where: str) -> Request:
    refs = ()
    if isinstance(rec, dict):
        unknown = sorted(set(rec) - set(RECORD_FIELDS))
        if unknown:
            raise click.ClickException(f"{where}: unknown field {unknown[0]!r}; a line holds "
                                       f"{', '.join(RECORD_FIELDS)}")
        if ("prompt" in rec) == ("messages" in rec):
            raise click.ClickException(f"{where}: give exactly one of \"prompt\" or \"messages\"")
        raw_refs = rec.get("references", [])
        if not isinstance(raw_refs, list) or not all(isinstance(r, str) for r in raw_refs):
            raise click.ClickException(f"{where}: \"references\" must be a list of strings")
        refs = tuple(raw_refs)
        if "messages" in rec and not (isinstance(rec["messages"], list) and
                                      all(isinstance(m, dict) for m in rec["messages"])):
            raise click.ClickException(f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects")
        rec = rec.get("messages", rec.get("prompt"))
    if not isinstance(rec, (str, list)) or not rec:
        raise click.ClickException(f"{where}: expected a string or an object with \"prompt\" or \"messages\"")
    return Request(rec, refs, where)


def read_requests(prompt, prompt_file, input_path) -> list[Request]:
    """The prompts of one invocation, all read and checked before any model work."""
    given = [x is not None for x in (prompt, prompt_file, input_path)]
    if sum(given) != 1:
        raise click.UsageError("give exactly one of --prompt, --prompt-file or --input")
    if prompt is not None:
        return [Request(prompt)]
    if prompt_file is not None:
        return [Request(_read_text(prompt_file, "--prompt-file"))]
    out = []
    text = _read_text(input_path, "--input")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{input_path}:{lineno}: not valid JSON ({exc.msg})")
        out.append(_record(rec, f"{input_path}:{lineno}"))
    if not out:
        raise click.ClickException(f"--input {input_path!r} holds no prompts")
    return out


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _json_row(res) -> str:
    return json.dumps({
        "text": res.text, "token_ids": list(res.token_ids), "new_tokens": res.new_tokens,
        "steps": res.steps, "mean_accepted": round(res.mean_accepted, 4),
        "tokens_per_s": round(res.tokens_per_s, 3), "elapsed_s": round(res.elapsed_s, 4),
        "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens, "method": res.method,
        "stop_reason": res.stop_reason,
        "accepted_per_step": [s.accepted for s in res.step_stats],
        "accepted_by_source": res.accepted_by_source, "incomplete": res.incomplete,
    }, ensure_ascii=False)


def read_grammar(json_schema, regex, grammar, choices):
    """The ``grammar=`` spec from the structured-output options (None: none given), compiled once as a check.

    Raises:
        click.UsageError: more than one kind given.
        click.ClickException: an unreadable file or a grammar that does not compile.
    """
    given = [name for name, v in (("--json-schema", json_schema), ("--regex", regex), ("--grammar", grammar),
                                  ("--choice", choices)) if v]
    if not given:
        return None
    if len(given) > 1:
        raise click.UsageError(f"give one structured-output option, not {' and '.join(given)}")
    from lookupdec.constraints import Choice, ConstraintError, JsonSchema, Lark, Regex, grammar_text

    if json_schema:
        spec = JsonSchema(_read_text(json_schema, "--json-schema"))
    elif regex:
        spec = Regex(regex)
    elif grammar:
        spec = Lark(_read_text(grammar, "--grammar"))
    else:
        spec = Choice(list(choices))
    try:
        grammar_text(spec)  # compile errors before the model loads
    except ConstraintError as exc:
        raise click.ClickException(f"{given[0]}: {exc}")
    return spec


def state_file(dec, save: bool) -> None:
    """Read (``save=False``) or save the decoder's drafting state; a problem is a warning on stderr, never an exit."""
    done = dec.save_state(warn=False) if save else dec.load_state(warn=False)
    if done.problem:
        click.echo(f"warning: {done.problem}", err=True)


@click.command("generate")
@click.option("--model", default=None, help="HF model id (cached), local directory or .gguf file; default: the embedded SmolLM2-135M-Instruct.")
@click.option("--prompt", default=None, help="The prompt text.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a file.")
@click.option("--input", "input_path", type=click.Path(dir_okay=False), default=None,
              help="JSONL: one prompt per line (a string, or an object with \"prompt\" or \"messages\", "
                   "and optionally \"references\": a list of document strings).")
@click.option("--method", type=click.Choice(sorted(METHODS)), default="auto", show_default=True,
              help="auto: every available source in one tree sized by the cost curve; pld: the prompt and the "
                   "output; llma: --reference documents; rest: --index datastores; history: --history; "
                   "recycle: the target's own earlier top-k candidates (Token Recycling); lookahead: an n-gram "
                   "pool from Jacobi iterations beside verification; draft: the small LM of --draft-model / "
                   "--draft-layers alone; ar: no drafting.")
@click.option("--reference", "references", multiple=True, type=click.Path(dir_okay=False),
              help="A document to draft from (a text file; repeatable), for every prompt.")
@click.option("--index", "indexes", multiple=True, type=click.Path(file_okay=False),
              help="A datastore built with `lookupdec build-index` (repeatable).")
@click.option("--history", default=None, type=click.Path(),
              help="A store of earlier outputs (created if needed): each generation is added, auto and history "
                   "draft from it.")
@click.option("--history-budget", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="Most tokens the history keeps, oldest dropped first [default: 50,000,000].")
@click.option("--draft-model", default=None,
              help="A small draft model with the target's tokenizer (HF id, directory or .gguf): method draft, "
                   "and auto calls it on steps where lookup is expected to pay less.")
@click.option("--draft-layers", type=click.IntRange(min=1), default=None, metavar="K",
              help="Cut the draft model (the target itself without --draft-model) to its first K layers.")
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--draft-budget", type=click.IntRange(min=0, max=MAX_DRAFT_BUDGET), default=None,
              help="Most draft nodes verified per step [default: 64; auto verifies what pays within it].")
@click.option("--device", default=None, help="torch device, e.g. cpu or cuda:0 [default: $LOOKUPDEC_DEVICE, else CUDA if available].")
@click.option("--hf-kernels", is_flag=True,
              help="Run transformers' own forward and kernels (outputs then equal transformers' generate() "
                   "token for token; slower on CPU).")
@click.option("--no-chat-template", is_flag=True, help="Use the prompt text as-is.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--weights", type=click.Choice(WEIGHTS),
              default="auto", show_default=True,
              help="Weight format of the fast CPU forward: quantized keeps a GGUF's Q4_1/Q8_0 blocks (the float32 "
                   "values from 6-9 bits each), float16 halves float32's bytes (activations stay float32); "
                   "auto times them and picks, float16 only for quantized/float16 GGUF files (README: Weight "
                   "formats). quantized-bf16 (CPUs with AVX-512 BF16) rounds the blocks' values and the activations "
                   "to bfloat16 in the layers' products: faster verify steps and prompts, a slightly different "
                   "model; never picked by auto. quantized-int8 (CPUs with AVX2 or AVX-512 VNNI) rounds the activations to 8 "
                   "bits per block of 32 and sums the blocks in integers, as llama.cpp does: much cheaper wide "
                   "forwards, a slightly different model; never picked by auto. Greedy output equals ar in the "
                   "same format.")
@click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default="float32", show_default=True,
              help="The KV cache's element type: float16 halves its memory per cached token and the bytes each step's "
                   "attention reads (each key and value rounded to float16: a slightly different model; greedy "
                   "output equals ar with the same choice). Needs the fast CPU forward.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt instead of streaming text.")
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Decode up to N prompts of --input together, their drafts verified in one forward per step "
                   "(continuous batching; outputs are printed in input order as they complete, not streamed).")
@click.option("--json-schema", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Structured output: the output is one JSON value valid against this JSON Schema file.")
@click.option("--regex", default=None, help="Structured output: the output matches this regular expression.")
@click.option("--grammar", "grammar_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Structured output: the output follows this Lark (or GBNF) grammar file's start rule.")
@click.option("--choice", "choices", multiple=True,
              help="Structured output: the output is exactly one of the --choice strings (repeatable).")
@click.option("--prefix-cache-mb", type=click.FloatRange(min=0), default=None, metavar="MIB",
              help="MiB of KV rows kept from finished prompts of --input for later ones that begin with the same "
                   "tokens (a shared system prompt or document); 0: off [default: 256 in the quantized formats, "
                   "where reuse is exact bit for bit; off in the float formats].")
@click.option("--fresh-state", is_flag=True,
              help="Draft with nothing learned, and save nothing. Without it, what earlier calls learned for this "
                   "model on this machine (acceptance rates, Token Recycling's tables, auto's source accounts) is "
                   "read from the cache before the first prompt and saved after the last: speed depends on it, "
                   "never the output.")
def generate_cmd(model, prompt, prompt_file, input_path, method, references, indexes, history, history_budget,
                 draft_model, draft_layers, max_new_tokens, temperature, top_p, top_k, seed, stop, draft_budget, device, hf_kernels,
                 no_chat_template, dtype, weights, kv_dtype, as_json, batch_size, json_schema, regex, grammar_file,
                 choices, prefix_cache_mb, fresh_state) -> None:
    """Generate text with lossless speculative decoding."""
    requests = read_requests(prompt, prompt_file, input_path)
    grammar = read_grammar(json_schema, regex, grammar_file, choices)
    if method == "draft" and draft_model is None and draft_layers is None:
        raise click.UsageError("--method draft needs a draft model: --draft-model ID|DIR|GGUF or --draft-layers K")
    shared_refs = tuple(_read_text(p, "--reference") for p in references)
    from lookupdec.decoder import DEFAULT_DRAFT_BUDGET, Decoder
    from lookupdec.errors import LookupdecError

    try:
        if history is not None:
            from lookupdec.index.history import check_history_path

            check_history_path(history)  # path problems before the model loads
        elif history_budget is not None:
            raise click.UsageError("--history-budget needs --history DIR")
        dec = Decoder(model, dtype=dtype, device=device, hf_kernels=hf_kernels, indexes=list(indexes) or None,
                      draft_budget=DEFAULT_DRAFT_BUDGET if draft_budget is None else draft_budget, history=history,
                      history_budget=history_budget, draft_model=draft_model, draft_layers=draft_layers,
                      weights=weights, prefix_cache_mb=prefix_cache_mb, kv_dtype=kv_dtype)
        # Every prompt is checked before the first is generated: no partial output for a bad later one.
        for i, req in enumerate(requests):
            try:
                dec.prepare(req.prompt, max_new_tokens, not no_chat_template)
            except (LookupdecError, ValueError, TypeError) as exc:
                where = ", ".join(x for x in (req.where, f"prompt {i + 1}" if len(requests) > 1 else "") if x)
                raise click.ClickException(f"{where}: {exc}" if where else str(exc))
        from lookupdec.methods import method_prices

        if method_prices(method):  # methods that size drafts by the curve: measure it before timing
            from lookupdec.costs import curve_path

            path = curve_path(dec.verifier, torch_threads())
            if not path.exists():
                click.echo(f"measuring the verify cost curve of this model on this machine once (cached in "
                           f"{path.parent})...", err=True)
            dec.costs()
        keep_state = method != "ar" and not fresh_state  # plain decoding learns nothing
        if keep_state:
            state_file(dec, save=False)
        settings = dict(method=method, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        top_k=top_k, seed=seed, stop=list(stop) or None, chat_template=not no_chat_template,
                        grammar=grammar)
        refs = [list(shared_refs + req.references) or None for req in requests]
        if batch_size > 1 and len(requests) > 1:
            printer = InOrder(lambda res: _print_result(res, as_json, streamed=False))
            dec.generate_batch([req.prompt for req in requests], batch_size=batch_size, references=refs,
                               on_result=printer, **settings)
        else:
            for req, ref in zip(requests, refs):
                on_text = None if as_json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
                res = dec.generate(req.prompt, references=ref, on_text=on_text, **settings)
                _print_result(res, as_json, streamed=True)
        if keep_state:
            state_file(dec, save=True)
    except (LookupdecError, ValueError, TypeError, RuntimeError) as exc:
        raise click.ClickException(str(exc))


class InOrder:
    """Calls ``emit`` for results that finish in any order, in input order: each as soon as those before it are out."""

    def __init__(self, emit) -> None:
        self.emit = emit
        self.ready: dict[int, object] = {}
        self.next = 0

    def __call__(self, i: int, result) -> None:
        self.ready[i] = result
        while self.next in self.ready:
            self.emit(self.ready.pop(self.next))
            self.next += 1


def _print_result(res, as_json: bool, streamed: bool) -> None:
    """One result: its JSON row, or (text mode) its text unless already streamed, then its statistics on stderr."""
    if as_json:
        click.echo(_json_row(res))
        return
    click.echo("" if streamed else res.text)
    by_src = ", ".join(f"{k} {v}" for k, v in sorted(res.accepted_by_source.items()))
    click.echo(f"[{res.method}] {res.new_tokens} new tokens, {res.steps} steps, "
               f"{res.mean_accepted:.2f} tokens/step, {res.tokens_per_s:.1f} tokens/s "
               f"(stop: {res.stop_reason}{'; accepted from ' + by_src if by_src else ''})", err=True)
    if res.incomplete:
        click.echo("warning: the output does not complete the structured-output constraint "
                   "(max_new_tokens ran out first); raise --max-new-tokens", err=True)


@click.command("cost-curve")
@click.option("--model", default=None, help="As for generate [default: the embedded model].")
@click.option("--device", default=None, help="torch device [default: $LOOKUPDEC_DEVICE, else CUDA if available].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--hf-kernels", is_flag=True, help="The curve of transformers' own forward.")
@click.option("--weights", type=click.Choice(WEIGHTS),
              default="auto", show_default=True,
              help="The weight format whose curve to show (each format has its own).")
@click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default="float32", show_default=True,
              help="The KV cache element type whose curve to show (each has its own).")
@click.option("--remeasure", is_flag=True, help="Measure again and replace the cached curve.")
@click.option("--json", "as_json", is_flag=True, help="Print the curve as JSON.")
def cost_curve_cmd(model, device, dtype, hf_kernels, weights, kv_dtype, remeasure, as_json) -> None:
    """Show (or measure) the verify cost curve `auto` sizes its trees by."""
    from lookupdec.decoder import Decoder
    from lookupdec.errors import LookupdecError

    try:
        dec = Decoder(model, dtype=dtype, device=device, hf_kernels=hf_kernels, weights=weights, kv_dtype=kv_dtype)
        curve = dec.cost_curve(remeasure=remeasure)
    except (LookupdecError, ValueError, TypeError, RuntimeError) as exc:
        raise click.ClickException(str(exc))
    if as_json:
        click.echo(curve.to_json())
        return
    click.echo(f"{curve.device}; backend {dec.verifier.backend}; {curve.base_past} cached rows; key {curve.key}")
    click.echo(f"measured for: {curve.measured_for or 'not recorded (a file from before measured_for)'}")
    click.echo(f"{'width':>6} {'ms':>8} {'x c(1)':>7} {'ms per 1k past rows':>20}")
    for w, ms, slope in zip(curve.widths, curve.ms, curve.slope_ms):
        click.echo(f"{w:>6} {ms:>8.2f} {ms / curve.ms[0]:>7.2f} {slope * 1000:>20.2f}")
