"""The HTTP side: a FastAPI app with OpenAI's endpoints over one ``Engine``.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
(these three need the bearer key when one is set), ``GET /health`` and ``GET /metrics``
(Prometheus text; both open). Errors use OpenAI's JSON shape
``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lookupdec.server.engine import Engine, Job
from lookupdec.server.protocol import APIError, ParsedRequest, error_body, parse_request
from lookupdec.server.responses import DONE, Shapes, finish_reason, sse, usage_of

class ClientGone(Exception):
    """The client of a request disconnected before its answer."""


# How often a handler waiting for its result checks whether the client is still there.
DISCONNECT_POLL_S = 0.25
# The largest request body read (413 beyond it): prompts fit the context, but references and a
# prediction may be whole documents.
MAX_BODY_BYTES = 64 << 20


def generation_settings(req: ParsedRequest) -> dict:
    """``Decoder.new_sequence`` keyword arguments of a parsed request."""
    grammar = None
    if req.response_format is not None:
        from lookupdec.constraints.openai_format import from_response_format

        grammar = from_response_format(req.response_format)
    return dict(max_new_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                seed=req.seed, stop=list(req.stop) or None,
                references=None if req.references is None else list(req.references),
                prediction=req.prediction, grammar=grammar)


def create_app(engine: Engine, model_id: str, api_key: str | None = None):
    """The FastAPI application serving ``engine``.

    Args:
        engine: a started (or to be started by the caller) ``Engine``.
        model_id: the id ``/v1/models`` lists and responses report.
        api_key: when set, ``/v1/*`` requests need ``Authorization: Bearer <api_key>`` (else 401).
    Returns:
        The app (run it with uvicorn; ``lookupdec.server.run`` does).
    """
    app = FastAPI(title="lookupdec", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = engine.metrics

    def error_response(err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
                            status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError("missing or wrong API key: send 'Authorization: Bearer <key>' with the server's "
                           "--api-key", 401, code="invalid_api_key")

    async def read_body(request: Request):
        too_big = APIError(f"the request body is over {MAX_BODY_BYTES >> 20} MiB; send shorter references or "
                           "prediction", 413, code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_big
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(f"the request body is not valid JSON: {exc}", 400) from None
        except RecursionError:
            raise APIError("the request body nests JSON too deeply to read", 400) from None

    async def next_event(request: Request, job: Job):
        """The job's next event; the job is cancelled if its client goes away meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancelled = True
                    raise ClientGone

    async def complete(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            check_key(request)
            req = parse_request(await read_body(request), chat)
            job = Job(req.prompt, generation_settings(req), chat, asyncio.get_running_loop(), asyncio.Queue(),
                      stream=req.stream, prompt_param="messages" if chat else "prompt",
                      limit_param=req.max_tokens_param)
            engine.submit(job)
            kind, value = await next_event(request, job)  # "ok" once it passed the decoder's checks
            if kind == "error":
                raise value
        except APIError as err:
            metrics.request_done(endpoint, err.status)
            return error_response(err)
        except ClientGone:
            return client_gone(endpoint)
        shapes = Shapes(chat, job.id, job.created, model_id)
        if req.stream:
            metrics.request_done(endpoint, 200)
            return StreamingResponse(stream(request, job, shapes, req.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while True:
                kind, value = await next_event(request, job)
                if kind == "done":
                    metrics.request_done(endpoint, 200)
                    return JSONResponse(shapes.full(value.result, value.prediction_tokens))
                if kind == "error":
                    metrics.request_done(endpoint, value.status)
                    return error_response(value)
        except ClientGone:
            return client_gone(endpoint)
        except asyncio.CancelledError:  # the server is cancelling the handler
            job.cancelled = True
            raise

    def client_gone(endpoint: str) -> JSONResponse:
        """The answer to a client that went away (nobody reads it; nginx's 499 in the metrics)."""
        metrics.request_done(endpoint, 499)
        return JSONResponse(error_body("the client closed the connection", "invalid_request_error"), status_code=499)

    async def stream(request: Request, job: Job, shapes: Shapes, include_usage: bool):
        try:
            if shapes.chat:  # OpenAI's first chunk names the role
                yield shapes.chunk(text="", first=True, with_usage=include_usage)
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    yield shapes.chunk(text=value, with_usage=include_usage)
                elif kind == "done":
                    res = value.result
                    yield shapes.chunk(finish=finish_reason(res.stop_reason), with_usage=include_usage)
                    if include_usage:
                        yield shapes.chunk(usage=usage_of(res, value.prediction_tokens))
                    yield DONE
                    return
                elif kind == "error":
                    yield sse(value.body())
                    yield DONE
                    return
        finally:
            job.cancelled = True  # a no-op once done; frees the sequence when the client went away

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, False)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                            "owned_by": "lookupdec"}]}

    @app.get("/health")
    async def health():
        waiting, active = engine.counts()
        body = {"status": "ok" if engine.accepting else "draining", "model": model_id, "active": active,
                "queued": waiting}
        fast = engine.decoder.verifier.fast
        if fast is not None:  # what a sequence's cache costs (--kv-dtype)
            body["kv_cache"] = {"dtype": fast.kv_dtype, "bytes_per_token": fast.kv_bytes_per_token}
        return JSONResponse(body, status_code=200 if engine.accepting else 503)

    @app.get("/metrics")
    async def prometheus():
        waiting, active = engine.counts()
        return PlainTextResponse(metrics.render(waiting, active), media_type="text/plain; version=0.0.4")

    started = int(time.time())
    return app
