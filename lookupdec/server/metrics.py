"""The server's counters, rendered in Prometheus' text exposition format.

The engine thread updates them; ``/metrics`` renders them from the event loop's thread,
so every access holds one lock.

Example:
    >>> m = Metrics()
    >>> m.request_done("chat", 200)
    >>> 'lookupdec_requests_total{endpoint="chat",status="200"} 1' in m.render(queue_depth=0, active=0)
    True
"""
from __future__ import annotations

import threading
from collections import defaultdict


class Metrics:
    """Request, token and step counters of one server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.cancelled = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0  # prompt tokens whose rows were reused (lookupdec.prefix_cache)
        self.completion_tokens = 0
        self.accepted: dict[str, int] = defaultdict(int)
        self.seq_steps = 0  # sequence-steps: one per sequence per forward (tau's denominator)
        self.step_tokens = 0  # tokens those steps committed
        self.steps = 0
        self.step_s = 0.0
        self.forward_s = 0.0
        self.batch_sum = 0
        self.width_sum = 0

    def request_done(self, endpoint: str, status: int) -> None:
        """Count one answered request (any status)."""
        with self._lock:
            self.requests[(endpoint, int(status))] += 1

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        """Count one completed generation's tokens."""
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens
            self.completion_tokens += completion_tokens

    def step(self, size: int, width: int, new_tokens: int, step_s: float, forward_s: float,
             accepted_by_source: dict) -> None:
        """Count one batched step (``lookupdec.batch.BatchStep``'s numbers)."""
        with self._lock:
            self.steps += 1
            self.seq_steps += size
            self.step_tokens += new_tokens
            self.step_s += step_s
            self.forward_s += forward_s
            self.batch_sum += size
            self.width_sum += width
            for k, v in accepted_by_source.items():
                self.accepted[k] += int(v)

    def render(self, queue_depth: int, active: int) -> str:
        """The Prometheus text format (version 0.0.4)."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, rows) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in rows:
                lab = ",".join(f'{k}="{v}"' for k, v in labels)
                out.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

        def summary(name: str, help_: str, total) -> None:  # per step: _sum and _count
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} summary", f"{name}_sum {total}",
                        f"{name}_count {self.steps}"])

        with self._lock:
            metric("lookupdec_requests_total", "counter", "Requests answered, by endpoint and HTTP status.",
                   [((("endpoint", e), ("status", s)), n) for (e, s), n in sorted(self.requests.items())])
            metric("lookupdec_cancelled_total", "counter", "Requests whose client went away before the end.",
                   [((), self.cancelled)])
            metric("lookupdec_prompt_tokens_total", "counter", "Prompt tokens of completed requests.",
                   [((), self.prompt_tokens)])
            metric("lookupdec_prompt_cached_tokens_total", "counter",
                   "Prompt tokens of completed requests whose KV rows an earlier request left (not prefilled).",
                   [((), self.cached_tokens)])
            metric("lookupdec_completion_tokens_total", "counter", "Generated tokens of completed requests.",
                   [((), self.completion_tokens)])
            metric("lookupdec_accepted_tokens_total", "counter", "Draft tokens accepted, by drafting source.",
                   [((("source", k),), v) for k, v in sorted(self.accepted.items())])
            metric("lookupdec_sequence_steps_total", "counter", "Sequence-steps: one per sequence per verify forward.",
                   [((), self.seq_steps)])
            metric("lookupdec_decode_tokens_total", "counter", "Tokens those sequence-steps committed.",
                   [((), self.step_tokens)])
            tau = self.step_tokens / self.seq_steps if self.seq_steps else 0.0
            metric("lookupdec_tau", "gauge", "Tokens committed per sequence per verify forward (decode steps).",
                   [((), f"{tau:.6g}")])
            metric("lookupdec_queue_depth", "gauge", "Requests waiting for a batch slot.", [((), queue_depth)])
            metric("lookupdec_active_sequences", "gauge", "Sequences being decoded now.", [((), active)])
            summary("lookupdec_batch_size", "Sequences verified per forward.", self.batch_sum)
            summary("lookupdec_forward_width", "Rows per verify forward (roots and draft nodes).", self.width_sum)
            summary("lookupdec_step_seconds", "Wall time of a batched step (plans, forward, acceptance).",
                    f"{self.step_s:.6f}")
            summary("lookupdec_forward_seconds", "Wall time of the verify forward of a step.", f"{self.forward_s:.6f}")
        return "\n".join(out) + "\n"
