"""``lookupdec serve``: an OpenAI-compatible HTTP server over one Decoder (needs the ``serve`` extra).

- ``protocol``: OpenAI request bodies checked into named settings, OpenAI's error shape;
- ``engine``: the thread that owns the Decoder and steps every active request together;
- ``responses``: response bodies and stream chunks;
- ``metrics``: counters in Prometheus' text format;
- ``app``: the FastAPI endpoints;
- ``run``: uvicorn, with SIGTERM as a drain.
"""
from lookupdec.server.engine import Engine, EngineConfig, Job
from lookupdec.server.protocol import APIError, ParsedRequest, parse_request

__all__ = ["APIError", "Engine", "EngineConfig", "Job", "ParsedRequest", "parse_request"]
