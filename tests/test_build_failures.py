"""Every build-index failure is a message naming the fix, and nothing is left behind."""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from lookupdec.cli import main
from lookupdec.index import build_index_from_tokens, open_index
from lookupdec.index.outdir import HOST, BuildError, remove_stale
from tests.conftest import checkout_env

REPO = Path(__file__).resolve().parents[1]


def corpus(tmp_path, n=20) -> Path:
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": f"document {i} about things"}) + "\n" for i in range(n)))
    return p


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_clean_failure(r, *words, parent: Path):
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output, (w, r.output)
    assert not [p for p in parent.iterdir() if ".tmp-" in p.name]  # no temporary directory left


def test_empty_text_field_names_the_option(tmp_path):
    r = run("build-index", corpus(tmp_path), "-o", tmp_path / "i", "--text-field", "")
    assert_clean_failure(r, "text_field", "--text-field text", parent=tmp_path)


def test_unwritable_output_names_a_writable_o(tmp_path, monkeypatch):
    real_mkdir = os.mkdir

    def denied(path, *a, **k):  # root ignores file modes: the refusal is injected where the build creates its dir
        if ".tmp-" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", denied)
    r = run("build-index", corpus(tmp_path), "-o", tmp_path / "i")
    assert_clean_failure(r, "Permission denied", "writable place", parent=tmp_path)


def test_native_memory_error_says_lower_shard_tokens(tmp_path, monkeypatch):
    from lookupdec import _native

    def oom(tokens):
        raise MemoryError("the native core ran out of memory")

    monkeypatch.setattr(_native, "suffix_array", oom)
    r = run("build-index", corpus(tmp_path), "-o", tmp_path / "i", "--shard-tokens", "1000")
    assert_clean_failure(r, "out of memory", "lower --shard-tokens", parent=tmp_path)


def test_full_disk_says_free_space(tmp_path, monkeypatch):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                             capture_output=True).returncode == 0
    try:
        if not mounted:  # no permission to mount here: the failure is injected at the shard writes
            import builtins

            real_open = builtins.open

            class Full:
                def __init__(self, f):
                    self.f = f

                def write(self, data):
                    raise OSError(errno.ENOSPC, "No space left on device", self.f.name)

                def __getattr__(self, name):
                    return getattr(self.f, name)

            def full_open(path, mode="r", *a, **k):
                f = real_open(path, mode, *a, **k)
                return Full(f) if "shard-" in str(path) and "w" in mode else f

            monkeypatch.setattr(builtins, "open", full_open)
        big = tmp_path / "big.jsonl"
        big.write_text("".join(json.dumps({"text": "word " * 400 + str(i)}) + "\n" for i in range(200)))
        r = run("build-index", big, "-o", small / "i")
        assert_clean_failure(r, "disk is full", "free space", parent=small)
    finally:
        if mounted:
            subprocess.run(["umount", str(small)])


@pytest.mark.parametrize("name", ["i", "my-index[1]"])
def test_stale_temporary_directories_of_dead_builds_are_removed(tmp_path, name):
    out = tmp_path / name
    dead = tmp_path / f".{name}.tmp-{2**22 + 12345}-{HOST}-dead"
    dead.mkdir()
    (dead / "shard-00000.tokens.i32").write_bytes(b"x" * 1000)
    swap = tmp_path / f".{name}.old-{2**22 + 12346}-{HOST}-x1"  # an interrupted swap, its owner gone
    (swap / "index").mkdir(parents=True)
    alive = tmp_path / f".{name}.tmp-{os.getpid()}-{HOST}-live"
    alive.mkdir()
    other_host = tmp_path / f".{name}.tmp-{2**22 + 12345}-0000beef-remote"
    other_host.mkdir()
    no_owner = tmp_path / f".{name}.tmp-{2**22 + 12345}"
    no_owner.mkdir()
    unrelated = tmp_path / f".j.tmp-{2**22 + 12345}-{HOST}-x"
    unrelated.mkdir()
    older = {}  # directories of builds that kept their owner in an .owner file
    for what, host, pid in [("dead", socket.gethostname(), 2**22 + 12345), ("live", socket.gethostname(), os.getpid()),
                            ("remote", "another-machine", 2**22 + 12345)]:
        older[what] = tmp_path / f".{name}.tmp-{pid}-{what}"
        older[what].mkdir()
        (older[what] / ".owner").write_text(json.dumps({"host": host, "pid": pid}))
    build_index_from_tokens([[1, 2, 3]], out)
    assert not dead.exists() and not swap.exists() and not older["dead"].exists()  # their processes are gone
    kept = [alive, other_host, no_owner, unrelated, older["live"], older["remote"]]  # alive, or not provably ours
    assert all(d.exists() for d in kept)
    assert remove_stale(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name] + [d.name for d in kept])


KILLED_BUILD = """
import sys
import numpy as np
from lookupdec.index import build_index_from_tokens
rng = np.random.default_rng(0)
docs = (rng.integers(0, 1000, 500) for _ in range(20000))
build_index_from_tokens(docs, sys.argv[1], shard_tokens=400_000, overwrite=True)
"""


@pytest.mark.slow
def test_killed_builds_leave_the_old_index_working_and_their_debris_is_cleaned(tmp_path):
    out = tmp_path / "i"
    build_index_from_tokens([[7, 8, 9]], out)
    rng = np.random.default_rng(3)
    env = checkout_env()
    for trial in range(4):
        p = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(out)], cwd=REPO, env=env)
        time.sleep(float(rng.uniform(0.8, 2.0)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        # Whatever moment it died, an index opens at the output: the old one or the finished new one.
        idx = open_index(out)
        assert idx.n_tokens in (3, 20000 * 500)
    build_index_from_tokens([[1, 2]], out, overwrite=True)
    assert open_index(out).n_tokens == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".i.")]  # every dead build's debris removed


def test_build_errors_are_lookupdec_errors_with_the_path(tmp_path):
    from lookupdec.index.outdir import os_failure

    e = os_failure(OSError(errno.ENOSPC, "No space left on device", "/x/shard"), tmp_path / "i")
    assert isinstance(e, BuildError) and "/x/shard" in str(e) and "free space" in str(e)
    e = os_failure(OSError(errno.EROFS, "Read-only file system"), tmp_path / "i")
    assert "writable place" in str(e)
