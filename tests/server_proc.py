"""A real `lookupdec serve` process for the server tests: started on a free port, waited for, stopped."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.conftest import checkout_env

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m lookupdec serve ARGS`` run from this checkout, on 127.0.0.1 and a free port.

    Args:
        args: the serve options (``--model`` etc.; host and port are added).
        api_key: sent by ``headers`` (and passed as ``--api-key`` when given).
        env: variables set for the server beside the checkout's (``LOOKUPDEC_CACHE``, say).
    """

    def __init__(self, args: list[str], api_key: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.api_key = api_key
        cmd = [sys.executable, "-m", "lookupdec", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        if api_key:
            cmd += ["--api-key", api_key]
        # One intra-op thread: the tiny model gains nothing from more, and the machine is shared.
        env = checkout_env(OMP_NUM_THREADS="1", **(env or {}))
        # stderr to a file: a pipe nobody reads would block the server once full.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _wait_ready(self, timeout: float = 180.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("the server did not start in time")

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def metric(self, name: str) -> float:
        """One unlabelled sample of /metrics."""
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
