"""Running the server: uvicorn around the app, SIGTERM turned into a drain.

SIGTERM (or Ctrl-C) first closes admission (new requests get 503), then uvicorn stops
listening and waits for every request in flight to be answered; the engine finishes
every request it accepted, then the process exits 0. The engine runs on the main thread,
uvicorn on a second one.
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass

from lookupdec.server.app import create_app
from lookupdec.server.engine import Engine, EngineConfig


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


def _bound(server) -> tuple[str, int]:
    """The first address a started uvicorn server listens on (host, port)."""
    name = server.servers[0].sockets[0].getsockname()
    return str(name[0]), int(name[1])


def check_listen(host: str, port: int) -> None:
    """Raise OSError, naming the address, when ``host:port`` cannot be listened on now.

    Called before the model loads, so a taken port or an unknown host costs no load. (The
    address is only tried: another process may still take it before the server binds.)
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}; give --host an address of this "
                      "machine (127.0.0.1: this machine only)") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick a free --port "
                          "(or stop what holds it)") from None


def serve(decoder, engine_config: EngineConfig, config: ServeConfig, on_ready=None) -> None:
    """Serve ``decoder`` until SIGTERM/SIGINT, then drain and return.

    The engine (every forward) runs on the calling thread, which must be the main thread;
    uvicorn runs on a second thread (see ``lookupdec.server.engine`` for why).

    Args:
        decoder: the ``Decoder`` (the engine owns it from now on).
        engine_config: scheduling (method, max batch, max queue).
        config: host, port, key, model id.
        on_ready: called with the host and port listened on (the port chosen when 0 was
            asked) once the socket listens; the CLI prints the address.
    Raises:
        SystemExit: uvicorn could not start (the port is taken, for example).
    """
    import uvicorn

    engine = Engine(decoder, engine_config)
    app = create_app(engine, config.model_id, config.api_key)

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:  # noqa: D102
            await super().startup(sockets)
            if on_ready is not None and self.started:
                on_ready(*_bound(self))

    server = ReadyServer(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                        timeout_graceful_shutdown=None, lifespan="off"))
    failed: list[BaseException] = []

    def listen() -> None:
        try:
            server.run()  # off the main thread uvicorn installs no signal handlers: ours below do
        except BaseException as exc:  # noqa: BLE001  (SystemExit when it cannot bind: re-raised below)
            failed.append(exc)
        finally:
            engine.close_admission()  # the HTTP side is gone: the engine finishes what it holds

    def on_signal(sig, frame) -> None:
        # New requests get 503 while the ones in flight finish; uvicorn stops listening and waits
        # for their responses; a second Ctrl-C forces uvicorn's exit.
        engine.close_admission()
        server.handle_exit(sig, frame)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    web = threading.Thread(target=listen, name="lookupdec-http", daemon=True)
    web.start()
    try:
        engine.run()
        web.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise failed[0]
