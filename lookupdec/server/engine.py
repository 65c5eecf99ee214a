"""The serving engine: one thread owns the Decoder and steps every active request together.

``lookupdec serve`` runs the engine on the process's main thread (``run()``) and the HTTP
server on another: torch's OpenMP parallel regions entered from a thread the program started
ran 1.5-3x slower on a 2-core CPU (measured: a fp16 linear 63-90 vs 180-220 us, a whole
forward 35 vs 55 ms). ``start()`` runs the same loop on a background thread instead (tests,
embedding in another program).

Requests are ``Job`` objects. The HTTP side (``lookupdec.server.app``) submits them from the
event loop; the engine thread does all model work:

1. checks each new job (``Decoder.new_sequence``: prompt, context length, settings); a bad
   one is answered 400 at once, a good one joins the FIFO queue of waiting jobs;
2. admits waiting jobs, oldest first, while fewer than ``max_batch`` are active (a job's
   prompt is prefilled alone as it joins);
3. steps every active sequence with ``lookupdec.batch.step_together``: one verify forward
   for all their draft trees, the drafts priced together at the batch's width;
4. answers the jobs that finished (after their output is added to the history store, which
   fsyncs it: an answered request's output survives a kill).

A job whose client went away is cancelled between steps and its KV cache freed. An exception
while stepping a batch is retried one sequence at a time, so only the request that raised it
fails (500) and the others go on. ``stop()`` closes admission (503), lets every accepted job
finish, then ends the thread.

Events reach the job's ``asyncio.Queue`` through ``loop.call_soon_threadsafe``: ``("ok", None)``
once the request passed its checks (or ``("error", APIError)`` with a 400), ``("text", str)`` for
each piece of final text, then ``("done", Completion)`` or ``("error", APIError)``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from lookupdec.server.metrics import Metrics
from lookupdec.server.protocol import APIError

log = logging.getLogger("lookupdec.server")

# Exceptions from Decoder.new_sequence that are the request's fault (400): every check it does.
_USER_ERRORS = (ValueError, TypeError)


@dataclass(frozen=True)
class Completion:
    """A finished job.

    Attributes:
        result: the ``GenerationResult``.
        prediction_tokens: tokens in the request's predicted output (0 without one).
    """

    result: Any
    prediction_tokens: int


@dataclass
class Job:
    """One request between the HTTP handler and the engine thread.

    Attributes:
        prompt: what ``Decoder.encode`` takes (messages, text or token ids).
        settings: ``Decoder.new_sequence`` keyword arguments (``max_new_tokens`` None: what
            the context has room for).
        chat_template: render the prompt with the chat template.
        loop: the event loop the events go to.
        events: the job's event queue (read by the handler).
        stream: whether the handler wants text pieces (``on_text``).
        id: the response id.
        created: unix time of submission.
        cancelled: set by the handler when its client went away.
        prompt_param: "messages" or "prompt" (named by a context-length error).
        limit_param: the request's field for the most tokens to generate (``max_tokens`` ...),
            or None when it gave none (a context-length error names it).
        seq: the job's ``Sequence`` once checked.
        prediction_tokens: tokens of its predicted output (for the usage's rejected count).
    """

    prompt: Any
    settings: dict
    chat_template: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    stream: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    cancelled: bool = False
    prompt_param: str = "messages"  # the request field holding the prompt (errors name it)
    limit_param: str | None = None
    seq: Any = None
    prediction_tokens: int = 0

    def post(self, kind: str, value) -> None:
        """Hand an event to the handler's loop (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass(frozen=True)
class EngineConfig:
    """How the engine schedules.

    Attributes:
        method: the drafting method every request uses ("auto"; "ar": no speculation).
        max_batch: most sequences stepped together.
        max_queue: most jobs waiting for a slot; beyond it submissions get 429.
        retry_after_s: the ``Retry-After`` a 429 carries.
    """

    method: str = "auto"
    max_batch: int = 8
    max_queue: int = 64
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.max_batch, bool) or int(self.max_batch) != self.max_batch or self.max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if isinstance(self.max_queue, bool) or int(self.max_queue) != self.max_queue or self.max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0, got {self.max_queue!r}")


class Engine:
    """The thread that decodes every request (see the module docstring).

    Args:
        decoder: a ``lookupdec.Decoder`` (used by this engine's thread only, once started).
        config: an ``EngineConfig``.
        metrics: where counters go (a fresh ``Metrics`` by default).

    Example:
        >>> eng = Engine(Decoder(), EngineConfig(max_batch=4))   # doctest: +SKIP
        >>> eng.start(); eng.submit(job); ...; eng.stop()        # doctest: +SKIP
    """

    def __init__(self, decoder, config: EngineConfig | None = None, metrics: Metrics | None = None) -> None:
        self.decoder = decoder
        self.config = config or EngineConfig()
        self.metrics = metrics or Metrics()
        self._lock = threading.Condition()
        self._inbox: collections.deque[Job] = collections.deque()  # submitted, not yet checked
        self._waiting: collections.deque[Job] = collections.deque()  # checked, FIFO for a slot
        self._active: list[Job] = []
        from lookupdec.batch import BatchGate

        self._gate = BatchGate()  # stops drafting while the batch's pricing keeps none
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- from the HTTP side ----------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._accepting

    def counts(self) -> tuple[int, int]:
        """(waiting, active) jobs now."""
        with self._lock:
            return len(self._inbox) + len(self._waiting), len(self._active)

    def submit(self, job: Job) -> None:
        """Queue a job.

        Raises:
            APIError: 503 when the server is shutting down; 429 (with ``Retry-After``) when
                ``max_queue`` jobs already wait.
        """
        with self._lock:
            if not self._accepting:
                raise APIError("the server is shutting down; retry on another instance", 503,
                               type="server_error", code="shutting_down")
            if len(self._inbox) + len(self._waiting) >= self.config.max_queue:
                raise APIError(f"the server is busy: {self.config.max_queue} requests already wait for a slot; "
                               f"retry after {self.config.retry_after_s} s", 429, type="rate_limit_error",
                               code="queue_full", headers={"Retry-After": str(self.config.retry_after_s)})
            self._inbox.append(job)
            self._lock.notify()

    def start(self) -> None:
        """Run the engine loop on a background thread (``stop()`` ends it)."""
        self._thread = threading.Thread(target=self.run, name="lookupdec-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Close admission, let every accepted job finish, end the thread.

        Returns:
            True when the thread ended within ``timeout``.
        """
        with self._lock:
            self._accepting = False
            self._lock.notify()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close_admission(self) -> None:
        """Answer new submissions 503 from now on (what SIGTERM does first); ``run()`` returns once
        every accepted job is answered."""
        with self._lock:
            self._accepting = False
            self._lock.notify()

    # -- the thread ------------------------------------------------------------------------------

    def run(self) -> None:
        """The engine loop on the calling thread, until admission is closed and every accepted job
        is answered."""
        # Plain decoding drafts nothing: only other methods need the cost model that prices a batch.
        curve = None if self.config.method == "ar" else self.decoder.costs()
        while True:
            with self._lock:
                while not (self._inbox or self._waiting or self._active) and self._accepting:
                    self._lock.wait()
                if not (self._inbox or self._waiting or self._active):
                    break  # stopped and drained
                inbox = list(self._inbox)
                self._inbox.clear()
            try:
                self._iteration(inbox, curve)
            except Exception as exc:  # noqa: BLE001  (an engine bug: fail what is in flight, keep serving)
                log.exception("the engine's step failed outside any one request")
                for job in list(self._active):
                    self._fail(job, exc)
        self._stopped.set()

    def _iteration(self, inbox: list[Job], curve) -> None:
        """Check new jobs, drop cancelled ones, admit, step the batch once, answer the finished."""
        from lookupdec.batch import step_together

        for job in inbox:
            self._check(job)
        with self._lock:  # a cancelled job gives its queue slot back at once
            gone = [j for j in self._waiting if j.cancelled]
            for job in gone:
                self._waiting.remove(job)
        for job in gone:
            self._drop(job)
        self._admit()
        for job in [j for j in self._active if j.cancelled]:
            self._drop(job)  # frees its cache; the client is gone
        active = list(self._active)
        if not active:
            return
        try:
            lone = None  # a lone auto sequence is judged as Decoder.generate judges it
            if len(active) == 1 and self.config.method == "auto":
                lone = self.decoder.state.gate("auto", active[0].seq.params.temperature)
            step = step_together(self.decoder.verifier, [j.seq for j in active], curve, gate=self._gate,
                                 lone_gate=lone)
        except Exception:  # noqa: BLE001  (find the request that raised it; the others go on)
            log.exception("a batched step failed; stepping its %d sequences one at a time", len(active))
            self._step_alone(active, curve)
        else:
            self.metrics.step(step.size, step.width, step.new_tokens, step.step_s, step.forward_s,
                              step.accepted_by_source)
        for job in list(self._active):
            if job.seq is not None and job.seq.done:
                self._complete(job)

    def _check(self, job: Job) -> None:
        """``new_sequence`` for a submitted job: a bad request is answered here, a good one waits."""
        if job.cancelled:
            self.metrics.cancel()
            return
        dec = self.decoder
        settings = dict(job.settings)
        try:
            ids = dec.encode(job.prompt, job.chat_template)
            if settings.get("max_new_tokens") is None:
                # OpenAI's default: as many tokens as the context has room for.
                settings["max_new_tokens"] = max(dec.loaded.max_context - len(ids), 1)
            on_text = (lambda s, job=job: job.post("text", s)) if job.stream else None
            job.seq = dec.new_sequence(ids, method=self.config.method, on_text=on_text, **settings)
            pred = settings.get("prediction")
            if pred:
                job.prediction_tokens = len(dec.tokenizer(pred, add_special_tokens=False)["input_ids"])
        except _USER_ERRORS as exc:
            job.post("error", _user_error(job, exc))
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("checking request %s failed", job.id)
            job.post("error", APIError(f"internal error: {type(exc).__name__}: {exc}", 500, type="server_error"))
            return
        with self._lock:
            self._waiting.append(job)
        job.post("ok", None)

    def _admit(self) -> None:
        """Prefill waiting jobs, oldest first, while there is room in the batch."""
        while True:
            with self._lock:
                if not self._waiting or len(self._active) >= self.config.max_batch:
                    return
                job = self._waiting.popleft()
            if job.cancelled:
                self._drop(job)
                continue
            try:
                job.seq.prefill()
            except Exception as exc:  # noqa: BLE001
                self._fail(job, exc)
                continue
            if job.seq.done:
                self._complete(job)
            else:
                with self._lock:
                    self._active.append(job)

    def _step_alone(self, jobs: list[Job], curve) -> None:
        """Step each sequence of a failed batch by itself; one that raises again fails its request."""
        from lookupdec.batch import step_together

        for job in jobs:
            if job.seq.done:
                continue
            try:
                step = step_together(self.decoder.verifier, [job.seq], curve)
            except Exception as exc:  # noqa: BLE001
                self._fail(job, exc)
            else:
                self.metrics.step(step.size, step.width, step.new_tokens, step.step_s, step.forward_s,
                                  step.accepted_by_source)

    def _complete(self, job: Job) -> None:
        res = job.seq.result()
        try:
            # Remembered (and fsynced) before the answer: an answered request's output is durable.
            self.decoder.remember(res)
        except Exception:  # noqa: BLE001  (the answer is still right; the store is the operator's to fix)
            log.exception("could not add request %s to the history store", job.id)
        self._release(job)
        self.metrics.finished(res.prompt_tokens, res.new_tokens, res.cached_tokens)
        job.post("done", Completion(res, job.prediction_tokens))

    def _fail(self, job: Job, exc: Exception) -> None:
        log.error("request %s failed: %s: %s", job.id, type(exc).__name__, exc, exc_info=exc)
        self._release(job)
        job.post("error", APIError(f"internal error while decoding: {type(exc).__name__}: {exc}", 500,
                                   type="server_error"))

    def _drop(self, job: Job) -> None:
        """A cancelled job: free its sequence, tell nobody (the client is gone)."""
        self._release(job)
        self.metrics.cancel()

    def _release(self, job: Job) -> None:
        with self._lock:
            if job in self._active:
                self._active.remove(job)
        if job.seq is not None:
            job.seq.cache = None  # its KV cache goes now, not when the handler lets go
            job.seq.done = True


def _user_error(job: Job, exc: Exception) -> APIError:
    """A check ``new_sequence`` failed, as a 400 naming the request field it is about."""
    from lookupdec.constraints.spec import ConstraintError
    from lookupdec.errors import ContextTooLongError, PromptError

    if isinstance(exc, ContextTooLongError):
        return APIError(exc.worded(job.limit_param), 400, job.prompt_param, code="context_length_exceeded")
    if isinstance(exc, PromptError):  # e.g. a token id outside the vocabulary
        return APIError(str(exc), 400, job.prompt_param)
    if isinstance(exc, ConstraintError):
        return APIError(str(exc), 400, "response_format")
    msg = str(exc)
    param = next((p for p in ("references", "prediction", "temperature", "top_p", "top_k", "seed", "stop")
                  if p in msg), None)
    return APIError(msg, 400, param)
