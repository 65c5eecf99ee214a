"""Suffix-array construction and checking in lookupdec._native against the
slow reference (tests/oracles/index.py), on random and adversarial inputs."""
import numpy as np
import pytest

from lookupdec import _native as N
from tests.oracles.index import suffix_array_reference

MAX_ID = 2**31 - 1


def arr(values):
    return np.asarray(values, dtype=np.int32)


def assert_sa(tokens):
    """Both position widths, with and without the 16-bit text copy (forced on
    small inputs by a zero threshold), with the LMS substrings named during
    induction or by comparison, equal the reference, and the checker accepts
    them."""
    tokens = arr(tokens)
    want = suffix_array_reference(tokens).tolist()
    sa = N.suffix_array(tokens)
    assert sa.dtype == np.int32
    assert sa.tolist() == want
    sa64 = N._suffix_array64(tokens)
    assert sa64.dtype == np.int64
    assert sa64.tolist() == want
    for force64 in (False, True):
        for narrow_min_n in (0, -1):
            for compare_names in (False, True):
                got = N._suffix_array_opts(tokens, force64, narrow_min_n, compare_names)
                assert got.dtype == (np.int64 if force64 else np.int32)
                assert got.tolist() == want, (force64, narrow_min_n, compare_names)
    assert N.check_suffix_array(tokens, sa) == ""
    assert N.check_suffix_array(tokens, sa64) == ""


ADVERSARIAL = {
    "empty": [],
    "one token": [7],
    "one separator": [-1],
    "all equal": [3] * 50,
    "all separators": [-1] * 9,
    "abab": [1, 2] * 25,
    "abcabc": [1, 2, 3] * 17,
    "aab periodic": [1, 1, 2] * 15,
    "decreasing": list(range(40, 0, -1)),
    "increasing": list(range(40)),
    "separators at both ends": [-1, 4, 5, 4, 5, -1],
    "consecutive separators": [4, -1, -1, -1, 4, 5, -1, -1, 4],
    "largest ids": [MAX_ID, MAX_ID - 1, MAX_ID, 0, MAX_ID, -1, MAX_ID - 1, MAX_ID],
    "largest id repeated": [MAX_ID] * 20,
    "huge and tiny ids": [0, MAX_ID, 1, MAX_ID, 0, MAX_ID, 1] * 5,
    "tiny vocab": [0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 1] * 4,
    "fibonacci word": None,
}


def fibonacci_word(n):
    a, b = [0], [0, 1]
    while len(b) < n:
        a, b = b, b + a
    return b[:n]


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial(name):
    tokens = ADVERSARIAL[name] if ADVERSARIAL[name] is not None else fibonacci_word(200)
    assert_sa(tokens)


def test_random_small_alphabets_and_lengths():
    rng = np.random.default_rng(0)
    for _ in range(600):
        n = int(rng.integers(0, 120))
        k = int(rng.choice([1, 2, 3, 4, 7, 50, 1000]))
        tokens = rng.integers(-1, k, size=n)
        assert_sa(tokens)


def test_random_huge_ids_take_the_compacted_path():
    # ids far above the text length force rank-compaction of the alphabet
    rng = np.random.default_rng(1)
    pool = np.array([-1, 0, 5, 2**20, 2**30, MAX_ID - 1, MAX_ID])
    for _ in range(200):
        n = int(rng.integers(1, 100))
        assert_sa(rng.choice(pool, size=n))


def test_text_like_medium_input_is_valid():
    # Zipf-like tokens over a 49,152 vocabulary with separators: too long for
    # the reference, checked by the linear-time checker and by brute force
    # on a sample of adjacent pairs
    rng = np.random.default_rng(2)
    p = 1.0 / (np.arange(49152) + 2.7) ** 1.07
    tokens = rng.choice(49152, size=200_000, p=p / p.sum()).astype(np.int32)
    tokens[rng.integers(0, tokens.size, size=500)] = -1
    sa = N.suffix_array(tokens)
    assert N.check_suffix_array(tokens, sa) == ""
    assert np.array_equal(np.sort(sa), np.arange(tokens.size))
    for i in rng.integers(1, tokens.size, size=200):
        a, b = int(sa[i - 1]), int(sa[i])
        x, y = tokens[a:a + 64].tolist(), tokens[b:b + 64].tolist()
        assert x <= y  # equal 64-token prefixes are left to the checker
    assert np.array_equal(N._suffix_array64(tokens), sa)


def test_long_periodic_input_recurses_deeply():
    tokens = arr(([1, 2, 3, 1, 2] * 3000 + [-1]) * 3)
    sa = N.suffix_array(tokens)
    assert N.check_suffix_array(tokens, sa) == ""


def test_invalid_negative_is_rejected_naming_value_and_position():
    with pytest.raises(ValueError, match=r"tokens\[2\] = -7"):
        N.suffix_array(arr([1, 2, -7, 3]))
    with pytest.raises(ValueError, match=r"tokens\[0\] = -2147483648"):
        N._suffix_array64(arr([-(2**31), 1]))


def test_wrong_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="int32"):
        N.suffix_array(np.array([1, 2, 3], dtype=np.int64))
    with pytest.raises(TypeError, match="int32"):
        N.suffix_array(np.array([1.0, 2.0], dtype=np.float32))
    with pytest.raises(TypeError, match="int32"):
        N.suffix_array([1, 2, 3])


def test_non_contiguous_input_is_rejected_not_copied():
    # decided: no silent copy of a possibly huge array; the message says how to fix it
    tokens = arr(range(20))[::2]
    with pytest.raises(ValueError, match="ascontiguousarray"):
        N.suffix_array(tokens)
    with pytest.raises(ValueError, match="1-D"):
        N.suffix_array(arr([[1, 2], [3, 4]]))


def test_read_only_input_is_accepted():
    tokens = arr([3, 1, 3, 1, 2])
    tokens.setflags(write=False)
    assert N.suffix_array(tokens).tolist() == suffix_array_reference(tokens).tolist()


def test_checker_reports_non_permutation():
    tokens = arr([1, 2, 1])
    assert N.check_suffix_array(tokens, np.array([2, 2, 1], dtype=np.int32)).startswith(
        "not a permutation at 1")
    assert N.check_suffix_array(tokens, np.array([0, 1, 3], dtype=np.int32)).startswith(
        "not a permutation at 2")
    assert N.check_suffix_array(tokens, np.array([0, 1], dtype=np.int32)).startswith(
        "length mismatch")


def test_checker_reports_first_unsorted_pair():
    tokens = arr([1, 2, 1])
    good = N.suffix_array(tokens)
    assert N.check_suffix_array(tokens, good) == ""
    bad = good.copy()
    bad[[1, 2]] = bad[[2, 1]]
    # SA [2, 0, 1] ("1" < "1 2 1" < "2 1") swapped to [2, 1, 0]: first fault at 2
    assert N.check_suffix_array(tokens, bad).startswith("not sorted at 2")
    # the separator must sort below every token
    sep = arr([5, -1])
    assert N.check_suffix_array(sep, np.array([0, 1], dtype=np.int32)).startswith("not sorted at 1")
    assert N.check_suffix_array(sep, np.array([1, 0], dtype=np.int32)) == ""


def test_checker_catches_random_corruptions():
    rng = np.random.default_rng(3)
    for _ in range(100):
        tokens = rng.integers(-1, 4, size=int(rng.integers(2, 60))).astype(np.int32)
        sa = N.suffix_array(tokens)
        i, j = rng.choice(tokens.size, size=2, replace=False)
        bad = sa.copy()
        bad[[i, j]] = bad[[j, i]]
        assert N.check_suffix_array(tokens, bad) != ""


@pytest.mark.parametrize("seed", range(4))
def test_text_like_input_equals_reference(seed):
    # Zipfian tokens make most LMS substrings unique, so the build sorts only
    # the non-unique ones through a cut reduced text; it must still agree with
    # the reference everywhere
    rng = np.random.default_rng(10 + seed)
    p = 1.0 / (np.arange(3000) + 2.7) ** 1.07
    tokens = rng.choice(3000, size=6000, p=p / p.sum()).astype(np.int32)
    tokens[rng.integers(0, tokens.size, size=20)] = -1
    assert_sa(tokens)


@pytest.mark.parametrize("top, sep", [(65534, True), (65535, False), (65535, True), (65536, False)])
def test_alphabet_at_the_16_bit_limit(top, sep):
    # 65,536 symbols (SEP counted) is the largest alphabet the 16-bit copy
    # takes; one more must take the int32 path; both agree with the reference
    rng = np.random.default_rng(top + sep)
    for _ in range(20):
        pool = [top, top - 1, top - 2, 0, 1] + ([-1] if sep else [])
        tokens = rng.choice(pool, size=int(rng.integers(1, 200)))
        tokens[0] = top  # the largest id is present, so the alphabet size is exact
        assert_sa(tokens)


def test_16_bit_copy_equals_int32_path_on_medium_text():
    # large enough for the recursion and the cut reduced text on both paths
    rng = np.random.default_rng(5)
    p = 1.0 / (np.arange(49152) + 2.7) ** 1.07
    tokens = rng.choice(49152, size=300_000, p=p / p.sum()).astype(np.int32)
    tokens[rng.integers(0, tokens.size, size=1000)] = -1
    wide = N._suffix_array_opts(tokens, False, -1)
    assert N.check_suffix_array(tokens, wide) == ""
    for force64 in (False, True):
        assert np.array_equal(N._suffix_array_opts(tokens, force64, 0), wide)
        for narrow_min_n in (0, -1):
            assert np.array_equal(N._suffix_array_opts(tokens, force64, narrow_min_n, True), wide)


def test_naming_during_induction_on_long_random_texts():
    # naming during induction against naming by comparison, over many
    # alphabets and repetitiveness levels (groups of equal LMS substrings)
    rng = np.random.default_rng(11)
    for sigma in (2, 3, 5, 40, 3000):
        for period in (0, 7, 100):
            n = int(rng.integers(5_000, 40_000))
            tokens = rng.integers(-1, sigma, size=n).astype(np.int32)
            if period:
                tokens = np.tile(tokens[:period], n // period + 1)[:n]
                tokens[rng.integers(0, n, size=n // 50)] = rng.integers(-1, sigma)
            want = N._suffix_array_opts(tokens, False, -1, True)
            assert N.check_suffix_array(tokens, want) == ""
            for narrow_min_n in (0, -1):
                got = N._suffix_array_opts(tokens, False, narrow_min_n, False)
                assert np.array_equal(got, want), (sigma, period, narrow_min_n)
