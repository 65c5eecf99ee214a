"""`lookupdec generate`: parse options, call ``Decoder.generate``, print."""
from __future__ import annotations

import json
import sys

import click

from lookupdec.decoder import METHODS  # a plain dict module-level import; torch is imported lazily


def _read_prompts(prompt, prompt_file, input_path):
    given = [x is not None for x in (prompt, prompt_file, input_path)]
    if sum(given) != 1:
        raise click.UsageError("give exactly one of --prompt, --prompt-file or --input")
    if prompt is not None:
        return [prompt]
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                return [f.read()]
        except (OSError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"cannot read --prompt-file {prompt_file!r}: {exc}")
    prompts = []
    try:
        with open(input_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise click.ClickException(f"{input_path}:{lineno}: not valid JSON ({exc.msg})")
                if isinstance(rec, dict):
                    rec = rec.get("messages", rec.get("prompt"))
                if not isinstance(rec, (str, list)) or not rec:
                    raise click.ClickException(
                        f"{input_path}:{lineno}: expected a string or an object with \"prompt\" or \"messages\"")
                prompts.append(rec)
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read --input {input_path!r}: {exc}")
    if not prompts:
        raise click.ClickException(f"--input {input_path!r} holds no prompts")
    return prompts


@click.command("generate")
@click.option("--model", default=None, help="HF model id (cached), local directory or .gguf file; default: the embedded SmolLM2-135M-Instruct.")
@click.option("--prompt", default=None, help="The prompt text.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a file.")
@click.option("--input", "input_path", type=click.Path(dir_okay=False), default=None,
              help="JSONL: one prompt per line (a string, or an object with \"prompt\" or \"messages\").")
@click.option("--method", type=click.Choice(sorted(METHODS)), default="pld", show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--no-chat-template", is_flag=True, help="Use the prompt text as-is.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt instead of streaming text.")
def generate_cmd(model, prompt, prompt_file, input_path, method, max_new_tokens, temperature, top_p, top_k, seed, stop,
                 no_chat_template, dtype, as_json) -> None:
    """Generate text with lossless speculative decoding."""
    prompts = _read_prompts(prompt, prompt_file, input_path)
    from lookupdec.decoder import Decoder
    from lookupdec.errors import LookupdecError

    try:
        dec = Decoder(model, dtype=dtype)
        for p in prompts:
            on_text = None if as_json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
            res = dec.generate(p, method=method, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               top_k=top_k, seed=seed, stop=list(stop) or None, chat_template=not no_chat_template,
                               on_text=on_text)
            if as_json:
                click.echo(json.dumps({
                    "text": res.text, "token_ids": list(res.token_ids), "new_tokens": res.new_tokens,
                    "steps": res.steps, "mean_accepted": round(res.mean_accepted, 4),
                    "tokens_per_s": round(res.tokens_per_s, 3), "elapsed_s": round(res.elapsed_s, 4),
                    "prompt_tokens": res.prompt_tokens, "method": res.method, "stop_reason": res.stop_reason,
                    "accepted_per_step": [s.accepted for s in res.step_stats],
                }, ensure_ascii=False))
            else:
                click.echo("")
                click.echo(f"[{res.method}] {res.new_tokens} new tokens, {res.steps} steps, "
                           f"{res.mean_accepted:.2f} tokens/step, {res.tokens_per_s:.1f} tokens/s "
                           f"(stop: {res.stop_reason})", err=True)
    except (LookupdecError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc))
