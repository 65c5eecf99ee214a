"""Running the server: uvicorn around the app, SIGTERM turned into a drain.

SIGTERM (or Ctrl-C) first closes admission (new requests get 503), then uvicorn stops
listening and waits for every request in flight to be answered; the engine finishes
every request it accepted, then the process exits 0.
"""
from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

from lookupdec.server.app import create_app
from lookupdec.server.engine import Engine, EngineConfig

log = logging.getLogger("lookupdec.server")


@dataclass(frozen=True)
class ServeConfig:
    """Where and how to listen.

    Attributes:
        host: the interface (127.0.0.1: this machine only).
        port: the TCP port.
        api_key: the bearer key ``/v1/*`` requests need (None: none).
        model_id: the id reported by ``/v1/models`` and in responses.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_id: str = "lookupdec"


def serve(decoder, engine_config: EngineConfig, config: ServeConfig, on_ready=None) -> None:
    """Serve ``decoder`` until SIGTERM/SIGINT, then drain and return.

    Args:
        decoder: the ``Decoder`` (the engine's thread owns it from now on).
        engine_config: scheduling (method, max batch, max queue).
        config: host, port, key, model id.
        on_ready: called once the socket listens (the CLI prints the address).
    """
    import uvicorn

    engine = Engine(decoder, engine_config)
    app = create_app(engine, config.model_id, config.api_key)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # noqa: D102
            engine.close_admission()  # new requests get 503 while in-flight ones finish
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                # uvicorn raises a captured signal again once it has shut down (the process would
                # die by SIGTERM); a drained server exits 0 instead.
                captured = getattr(self, "_captured_signals", None)
                if captured and captured[-1] == sig:
                    captured.pop()

        async def startup(self, sockets=None) -> None:  # noqa: D102
            await super().startup(sockets)
            if on_ready is not None and self.started:
                on_ready()

    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           timeout_graceful_shutdown=None, lifespan="off"))
    engine.start()
    try:
        server.run()
    finally:
        if not engine.stop(timeout=None):
            log.error("the engine did not stop")
