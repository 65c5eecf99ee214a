"""`lookupdec serve` stopping: SIGTERM drains the requests in flight; SIGKILL loses no answered output.

Each test starts its own server process (tiny random model, ``--history`` store in a temp dir).
"""
from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from lookupdec.index.history import open_history  # noqa: E402
from tests.conftest import save_tiny  # noqa: E402
from tests.server_proc import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("srv-life"), 0, max_positions=2048)


def _wait_for(srv, active: int, queued: int, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        h = srv.health()
        if h["active"] == active and h["queued"] == queued:
            return
        time.sleep(0.02)
    raise AssertionError(f"expected {active} active and {queued} queued, the server has {srv.health()}")


def _stream(url: str, body: dict) -> tuple[str, list[str], int]:
    """A streamed completion: its text, finish reasons and completion tokens."""
    import json

    text, finishes, tokens = [], [], -1
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk["choices"]:
                continue
            c = chunk["choices"][0]
            text.append(c["text"])
            if c["finish_reason"]:
                finishes.append(c["finish_reason"])
    return "".join(text), finishes, tokens


def test_sigterm_finishes_requests_in_flight_and_exits_0(model_dir, tmp_path):
    """Four long requests (two streamed ones decoding together, a streamed and a plain one queued) are
    all answered in full after SIGTERM; the server then refuses connections, exits 0, and their outputs
    are in the history."""
    srv = ServerProcess(["--model", model_dir, "--max-batch", "2", "--method", "ar", "--history",
                         str(tmp_path / "hist")])
    try:
        n = 800  # long enough to be in flight when SIGTERM comes
        bodies = [{"prompt": p, "max_tokens": n, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}} for p in ("abc", "xyz", "0123456789 0123")]
        with cf.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(_stream, srv.url, b) for b in bodies]
            _wait_for(srv, active=2, queued=1)
            plain = pool.submit(httpx.post, srv.url + "/v1/completions", timeout=120,
                                json={"prompt": "abcabc", "max_tokens": n, "temperature": 0})
            _wait_for(srv, active=2, queued=2)  # two decoding, two waiting
            srv.proc.send_signal(__import__("signal").SIGTERM)
            code = srv.proc.wait(120)
            outs = [f.result() for f in futs]
            r = plain.result()
        assert code == 0, srv.log()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
        choice = r.json()["choices"][0]
        outs.append((choice["text"], [choice["finish_reason"]], r.json()["usage"]["completion_tokens"]))
        for text, finishes, tokens in outs:
            assert len(finishes) == 1 and text and tokens > 0
            assert finishes == ["length"] or tokens < n
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url + "/health", timeout=5)
        store = open_history(tmp_path / "hist")
        assert store.n_tokens == sum(o[2] for o in outs)  # every drained output remembered
    finally:
        srv.kill()


def test_sigkill_loses_no_answered_output(model_dir, tmp_path):
    """Every output answered before a SIGKILL is in the history store when it is reopened."""
    srv = ServerProcess(["--model", model_dir, "--method", "ar", "--history", str(tmp_path / "hist")])
    try:
        total = 0
        for i, p in enumerate(["abc", "hello there", "0123"]):
            r = httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={"prompt": p, "max_tokens": 20 + 7 * i, "temperature": 0})
            assert r.status_code == 200
            total += r.json()["usage"]["completion_tokens"]
        srv.proc.kill()  # SIGKILL: no handler runs
        srv.proc.wait(30)
        store = open_history(tmp_path / "hist")
        assert store.n_tokens == total and total > 0
    finally:
        srv.kill()


def test_the_drafting_state_is_read_at_start_and_saved_after_the_drain(model_dir, tmp_path):
    """What ``auto`` learned while serving is on disk once SIGTERM has drained the server, and the
    next server starts from it (its first answer equal to the first server's)."""
    from lookupdec.drafters.saved import read_state
    from tests.conftest import TINY_VOCAB

    env = {"LOOKUPDEC_CACHE": str(tmp_path / "cache")}
    body = {"prompt": "abcdabcdabcdxyzabcdab", "max_tokens": 40, "temperature": 0}
    texts, observed = [], []
    for _ in range(2):
        srv = ServerProcess(["--model", model_dir, "--method", "auto"], env=env)
        try:
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200
            texts.append(r.json()["choices"][0]["text"])
            assert srv.terminate() == 0, srv.log()
        finally:
            srv.kill()
        (path,) = (tmp_path / "cache" / "state").iterdir()
        observed.append(sum(t for _, t in read_state(path, TINY_VOCAB).calibration._coarse.values()))
    assert texts[0] == texts[1]
    assert 0 < observed[0] < observed[1]  # the second server added to what the first saved
