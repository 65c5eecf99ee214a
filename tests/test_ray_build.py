"""The Ray engine on a local 2-CPU cluster: the same files as a local build, retries, clean failures."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from lookupdec.errors import LookupdecError
from lookupdec.index import build_index, open_index
from lookupdec.index.build import _resolve_tokenizer
from lookupdec.index.corpus import CorpusReader, prepare_tokenizer
from tests.index_fixtures import WORDS, leftovers, tiny_tokenizer, write_jsonl

ray = pytest.importorskip("ray")


def same_files(a, b):
    names = sorted(p.name for p in a.iterdir() if p.name != "manifest.json")
    assert names == sorted(p.name for p in b.iterdir() if p.name != "manifest.json") and names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def kill_once(marker):
    driver = os.getpid()

    def hook(number):
        if number == 1 and not os.path.exists(marker):
            if os.getpid() == driver:  # never take the test process down: fail with a message instead
                raise AssertionError("the shard task ran in the driver process, not in a Ray worker")
            open(marker, "w").close()
            os._exit(1)  # the worker process dies mid-build
    return hook


def always_fail(number):
    raise RuntimeError(f"shard {number} cannot be built")


def fail_one_others_late(ended_dir):
    def hook(number):
        if number == 1:
            raise RuntimeError(f"shard {number} cannot be built")
        time.sleep(1.0)  # still running when shard 1 has failed
        open(os.path.join(ended_dir, f"ended-{number}"), "w").close()
    return hook


@pytest.mark.slow
def test_ray_build_equals_local_build_survives_a_killed_worker_and_fails_cleanly(tmp_path):
    from lookupdec.index.ray_build import build_with_ray

    rng = np.random.default_rng(0)
    recs = [{"text": " ".join(rng.choice(WORDS, rng.integers(1, 40)))} for _ in range(300)]
    files = [write_jsonl(tmp_path / "a.jsonl", recs[:150]), tmp_path / "b.txt",
             write_jsonl(tmp_path / "c.jsonl", recs[150:] + [{"text": "the " * 700}])]  # one cut document
    files[1].write_text("the cat sat on the mat and then home")
    tok = tiny_tokenizer()
    local = build_index(files, tmp_path / "local", tokenizer=tok, shard_tokens=500, jobs=1, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        s = build_index(files, tmp_path / "ray", tokenizer=tok, shard_tokens=500, engine="ray", progress=False)
        assert (s.documents, s.tokens, s.shards) == (local.documents, local.tokens, local.shards) and s.shards > 4
        same_files(tmp_path / "local", tmp_path / "ray")
        open_index(tmp_path / "ray", verify=True)

        loaded = _resolve_tokenizer(tok)
        args = (loaded, prepare_tokenizer(tok))
        kw = dict(shard_tokens=500, overwrite=False, address=None, params={})
        build_with_ray(CorpusReader(files), tmp_path / "retried", *args, **kw,
                       _task_hook=kill_once(str(tmp_path / "killed")))
        assert (tmp_path / "killed").exists()  # a worker did die
        same_files(tmp_path / "local", tmp_path / "retried")

        with pytest.raises(LookupdecError, match="left nothing behind.*cannot be built"):
            build_with_ray(CorpusReader(files), tmp_path / "failed", *args, **kw, _task_hook=always_fail)
        assert leftovers(tmp_path, "failed") == []

        # A failure returns only once every other shard task has ended (none is cancelled, none
        # is left running to write into the removed temporary folder).
        ended = tmp_path / "ended"
        ended.mkdir()
        with pytest.raises(LookupdecError, match="cannot be built"):
            build_with_ray(CorpusReader(files), tmp_path / "late", *args, **kw,
                           _task_hook=fail_one_others_late(str(ended)))
        assert len(list(ended.iterdir())) == local.shards - 1
        assert leftovers(tmp_path, "late") == []
    finally:
        ray.shutdown()


def test_ray_not_installed_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat"}])
    with pytest.raises(LookupdecError, match=r"pip install 'lookupdec\[ray\]'"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), engine="ray", progress=False)
    assert leftovers(tmp_path, "i") == []


@pytest.mark.slow
def test_unreachable_ray_address_is_a_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat"}])
    with pytest.raises(LookupdecError, match="cannot reach the Ray cluster"):
        build_index([path], tmp_path / "i", tokenizer=tiny_tokenizer(), engine="ray", ray_address="127.0.0.1:1",
                    progress=False)
    assert leftovers(tmp_path, "i") == []
