"""`lookupdec serve`: parse options, load the Decoder, run the OpenAI-compatible server."""
from __future__ import annotations

import os
import sys

import click

from lookupdec.cli.generate import KV_DTYPES, WEIGHTS, state_file
from lookupdec.decoder_args import MAX_DRAFT_BUDGET
from lookupdec.methods import METHODS  # a plain dict; torch is imported lazily


@click.command("serve")
@click.option("--model", default=None, help="HF model id (cached), local directory or .gguf file; default: the embedded SmolLM2-135M-Instruct.")
@click.option("--index", "indexes", multiple=True, type=click.Path(file_okay=False),
              help="A datastore built with `lookupdec build-index`, shared by every request (repeatable).")
@click.option("--history", default=None, type=click.Path(),
              help="A store of earlier outputs (created if needed), shared by every request: each answered "
                   "request's output is added (and on disk) before its response completes.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Most requests decoded together (their drafts verified in one forward per step).")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Most requests waiting for a slot; beyond it requests get 429 with Retry-After.")
@click.option("--api-key", default=None, envvar="LOOKUPDEC_API_KEY",
              help="Bearer key /v1/* requests must send (also $LOOKUPDEC_API_KEY); default: none.")
@click.option("--method", type=click.Choice(sorted(METHODS)), default="auto", show_default=True,
              help="Drafting method of every request (ar: no speculation); see `lookupdec generate --help`.")
@click.option("--model-id", default=None, help="The id /v1/models reports [default: the --model name].")
@click.option("--device", default=None, help="torch device [default: $LOOKUPDEC_DEVICE, else CUDA if available].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--weights", type=click.Choice(WEIGHTS),
              default="auto", show_default=True,
              help="The fast forward's weight format, as for generate (auto: measured per machine).")
@click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default="float32", show_default=True,
              help="The KV cache's element type, as for generate: float16 holds twice the cached tokens in the "
                   "same memory and makes batched steps cheaper; a slightly different model.")
@click.option("--draft-budget", type=click.IntRange(min=0, max=MAX_DRAFT_BUDGET), default=None,
              help="Most draft nodes verified per step and sequence [default: 64].")
@click.option("--prefix-cache-mb", type=click.FloatRange(min=0), default=None,
              help="MiB of KV rows kept from finished requests for later prompts that begin with the same tokens "
                   "(a chat's next turn, a shared system prompt); 0: off [default: 256 in the quantized formats, "
                   "where reuse is exact bit for bit; off in the float formats].")
@click.option("--fresh-state", is_flag=True,
              help="Draft with nothing learned, and save nothing. Without it, the drafting state saved for this model "
                   "on this machine (see `lookupdec generate --help`) is read at start and saved after the drain.")
def serve_cmd(model, indexes, history, host, port, max_batch, max_queue, api_key, method, model_id, device, dtype,
              weights, kv_dtype, draft_budget, prefix_cache_mb, fresh_state) -> None:
    """Serve the OpenAI API (chat, completions) with lossless speculative decoding.

    SIGTERM stops admission (503), finishes the requests in flight and exits 0.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"serving needs the 'serve' extra ({exc.name} is missing): "
                                   "pip install 'lookupdec[serve]'")
    if method == "draft":
        raise click.UsageError("--method draft needs a draft model, which serve does not load; pick another method")
    if api_key is None and os.environ.get("LOOKUPDEC_API_KEY") == "":  # click reads an empty variable as unset
        api_key = ""
    if api_key is not None and not api_key.strip():
        raise click.UsageError("--api-key (or $LOOKUPDEC_API_KEY) is empty, which would let requests in without a "
                               "key; pass a key, or leave both out to serve without one")
    from lookupdec.decoder import DEFAULT_DRAFT_BUDGET, Decoder
    from lookupdec.errors import LookupdecError
    from lookupdec.server.engine import EngineConfig
    from lookupdec.server.run import ServeConfig, check_listen, serve

    try:
        check_listen(host, port)  # before the model loads
    except OSError as exc:
        raise click.ClickException(str(exc))

    try:
        if history is not None:
            from lookupdec.index.history import check_history_path

            check_history_path(history)
        dec = Decoder(model, dtype=dtype, device=device, indexes=list(indexes) or None, history=history,
                      weights=weights, draft_budget=DEFAULT_DRAFT_BUDGET if draft_budget is None else draft_budget,
                      prefix_cache_mb=prefix_cache_mb, kv_dtype=kv_dtype)
        from lookupdec.methods import method_prices

        if method_prices(method):
            click.echo("resolving the verify cost curve (measured once per model and machine, then cached)...",
                       err=True)
            dec.costs()
        keep_state = method != "ar" and not fresh_state
        if keep_state:
            state_file(dec, save=False)
    except (LookupdecError, ValueError, TypeError, RuntimeError) as exc:
        raise click.ClickException(str(exc))
    served = model_id or dec.loaded.name

    def ready(bound_host: str, bound_port: int) -> None:
        where = f"[{bound_host}]" if ":" in bound_host else bound_host
        click.echo(f"lookupdec serve: {served} ({method}, max batch {max_batch}) on http://{where}:{bound_port}/v1",
                   err=True)
        sys.stderr.flush()

    serve(dec, EngineConfig(method=method, max_batch=max_batch, max_queue=max_queue),
          ServeConfig(host=host, port=port, api_key=api_key, model_id=served), on_ready=ready)
    if keep_state:  # drained: the engine no longer touches the state
        state_file(dec, save=True)
