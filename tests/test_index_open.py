"""Opening an index: every damaged or foreign directory is refused by name; tokenizer checks; lookup arguments."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lookupdec.errors import IndexFormatError, TokenizerMismatchError
from lookupdec.index import build_index_from_tokens, open_index
from lookupdec.tokenizer import tokenizer_fingerprint
from tests.index_fixtures import WORDS, tiny_tokenizer


@pytest.fixture
def index_dir(tmp_path):
    build_index_from_tokens([[1, 2, 3, 4], [1, 2, 3, 5], [2, 3, 4]], tmp_path / "i", tokenizer=tiny_tokenizer(),
                            shard_tokens=8)
    return tmp_path / "i"


def edit_manifest(index_dir, change):
    path = index_dir / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ------------------------------------------------------------------ damaged directories
def test_missing_directory_and_manifest(tmp_path, index_dir):
    with pytest.raises(IndexFormatError, match=r"index directory .*nope does not exist"):
        open_index(tmp_path / "nope")
    (tmp_path / "corpus.jsonl").write_text("{}")
    with pytest.raises(IndexFormatError, match=r"corpus\.jsonl is a file, not an index directory"):
        open_index(tmp_path / "corpus.jsonl")
    (index_dir / "manifest.json").unlink()
    with pytest.raises(IndexFormatError, match=r"manifest\.json is missing.*rebuild"):
        open_index(index_dir)


def test_truncated_manifest(index_dir):
    path = index_dir / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(IndexFormatError, match=r"manifest\.json is truncated or not valid JSON.*rebuild the index"):
        open_index(index_dir)


def test_foreign_format_and_other_version(index_dir):
    edit_manifest(index_dir, lambda d: d.update(format="something-else"))
    with pytest.raises(IndexFormatError, match="is not a lookupdec index manifest"):
        open_index(index_dir)
    edit_manifest(index_dir, lambda d: d.update(format="lookupdec-suffix-index", format_version=99))
    with pytest.raises(IndexFormatError, match=r"format version 99, but this lookupdec .* reads version 1"):
        open_index(index_dir)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["shards"][0]["tokens"].update(length="many"), r"shard 0: field 'length' is missing or invalid"),
    (lambda d: d["shards"][0]["tokens"].update(length=True), r"shard 0: field 'length' is missing or invalid"),
    (lambda d: d.update(tokens=-5), r"field 'tokens' is missing or invalid"),
    (lambda d: d["tokenizer"].update(vocab_size="49152"), r"tokenizer: field 'vocab_size' is missing or invalid"),
    (lambda d: d["tokenizer"].update(vocab_size=2**40), r"tokenizer: field 'vocab_size' is out of range"),
])
def test_invalid_manifest_fields(index_dir, edit, message):
    edit_manifest(index_dir, edit)
    with pytest.raises(IndexFormatError, match=message):
        open_index(index_dir)


def test_file_names_outside_the_directory_are_refused(index_dir):
    edit_manifest(index_dir, lambda d: d["shards"][0]["tokens"].update(file="../../etc/passwd"))
    with pytest.raises(IndexFormatError, match="is not a plain file name"):
        open_index(index_dir)


def test_missing_array_file(index_dir):
    (index_dir / "shard-00001.sa.i32").unlink()
    with pytest.raises(IndexFormatError, match=r"shard-00001\.sa\.i32 is missing: the index is incomplete"):
        open_index(index_dir)


def test_truncated_array_file(index_dir):
    path = index_dir / "shard-00000.tokens.i32"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(IndexFormatError, match=r"shard-00000\.tokens\.i32 has 16 bytes but the manifest says 20"):
        open_index(index_dir)


def test_corrupted_array_file_is_caught_by_verify(index_dir):
    path = index_dir / "shard-00001.sa.i32"
    sa = np.fromfile(path, dtype="<i4")
    sa[[0, 1]] = sa[[1, 0]]  # same size, same values, wrong order
    sa.tofile(path)
    open_index(index_dir)  # opening is instant and does not read the arrays...
    with pytest.raises(IndexFormatError, match=r"shard-00001\.sa\.i32 is corrupted \(SHA-256 differs"):
        open_index(index_dir, verify=True)  # ...verify does


def test_verify_checks_the_suffix_array_itself(index_dir):
    # A consistent manifest over a wrong suffix array (checksums recomputed): the order check catches it.
    import hashlib

    path = index_dir / "shard-00000.sa.i32"
    sa = np.fromfile(path, dtype="<i4")
    sa[[0, 1]] = sa[[1, 0]]
    sa.tofile(path)
    edit_manifest(index_dir, lambda d: d["shards"][0]["sa"].update(sha256=hashlib.sha256(sa.tobytes()).hexdigest()))
    with pytest.raises(IndexFormatError, match=r"shard-00000\.sa\.i32 is not the suffix array of shard-00000\.tokens\.i32"):
        open_index(index_dir, verify=True)


# ------------------------------------------------------------------ tokenizer identity
def test_wrong_tokenizer_is_refused_naming_both(index_dir):
    idx = open_index(index_dir)
    idx.check_tokenizer(tiny_tokenizer(), "tiny")  # the same vocabulary passes
    idx.check_tokenizer(tokenizer_fingerprint(tiny_tokenizer()))
    other = tiny_tokenizer(WORDS + ["extra"])
    with pytest.raises(TokenizerMismatchError, match=r"built with tokenizer 'unnamed Tokenizer' \(vocab 20.* "
                                                     r"but the model uses other-model \(vocab 21"):
        idx.check_tokenizer(other, "other-model")
    with pytest.raises(TokenizerMismatchError):
        idx.check_tokenizer("0" * 64, "m")


def test_index_without_tokenizer_record_refuses_every_tokenizer(tmp_path):
    build_index_from_tokens([[1, 2]], tmp_path / "raw")
    idx = open_index(tmp_path / "raw")
    assert idx.tokenizer_name is None
    with pytest.raises(TokenizerMismatchError, match="no tokenizer recorded.*cannot be checked against tiny"):
        idx.check_tokenizer(tiny_tokenizer(), "tiny")


def test_properties(index_dir):
    idx = open_index(index_dir)
    assert (idx.n_tokens, idx.n_documents, idx.n_shards) == (11, 3, 3)
    assert idx.tokenizer_name == "unnamed Tokenizer"
    assert idx.tokenizer_fingerprint == tokenizer_fingerprint(tiny_tokenizer())
    assert idx.manifest.bytes_on_disk == sum(p.stat().st_size for p in index_dir.glob("shard-*"))


# ------------------------------------------------------------------ lookup arguments
@pytest.mark.parametrize("kw, message", [
    (dict(min_n=0), "min_n must be an integer >= 1, got 0"),
    (dict(max_n=2, min_n=3), r"max_n \(2\) must be >= min_n \(3\)"),
    (dict(max_occurrences=0), "max_occurrences must be an integer >= 1"),
    (dict(depth=0), "depth must be an integer >= 1"),
    (dict(budget=-1), "budget must be an integer >= 0"),
    (dict(max_n=2.5), "max_n must be an integer"),
    (dict(max_occurrences=2**20, depth=2**11), "exceeds 1073741824 trie nodes"),
])
def test_lookup_parameters_are_validated(index_dir, kw, message):
    with pytest.raises(ValueError, match=message):
        open_index(index_dir).lookup([1, 2], **kw)


def test_lookup_context_forms_and_errors(index_dir):
    idx = open_index(index_dir)
    expected = idx.lookup([1, 2, 3])
    for ctx in (np.array([1, 2, 3], np.int64), np.array([9, 1, 2, 3], np.uint16)[1:], (1, 2, 3)):
        got = idx.lookup(ctx)
        assert got.tree.tokens.tolist() == expected.tree.tokens.tolist() and got.match_len == 3
    assert idx.lookup([]).match_len == 0 and idx.lookup([1]).match_len == 0  # shorter than min_n
    with pytest.raises(ValueError, match="context holds token id -1"):
        idx.lookup([1, -1, 2])
    with pytest.raises(ValueError, match="context holds token id 2147483648"):
        idx.lookup([2**31])
    with pytest.raises(ValueError, match="1-D sequence"):
        idx.lookup([[1, 2]])
    # Only the last max_n tokens matter: anything earlier, even invalid, is not read.
    assert idx.lookup([-5, 1, 2, 3], max_n=3).match_len == 3
