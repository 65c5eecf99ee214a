"""lookupdec.constraints against a slow oracle: masks, pruning, forced tokens, per-row masks, commits, errors.

The vocabulary is the tiny models' character tokenizer (one character per
token), and each language is finite, so ``tests.oracles.grammar`` can say which
token is allowed after any text by looking at the word list itself.
"""
from __future__ import annotations

import numpy as np
import pytest

from lookupdec.constraints import Choice, Constraint, ConstraintError, JsonSchema, Lark, Regex, join_forced
from lookupdec.tree import DraftTree
from tests.conftest import EOS_ID, TINY_VOCAB, char_tokenizer
from tests.oracles.grammar import FiniteLanguage, enumerate_regex

TOK = char_tokenizer()
CHOICES = ["red", "green", "grey", "blue", "blueberry"]
REGEX = r"[0-2]{1,2}-(ab|ba)"


def cid(c: str) -> int:
    (i,) = TOK.encode(c, add_special_tokens=False)
    return i


def text_of(ids) -> str:
    return "".join(TOK.convert_ids_to_tokens(int(i)) for i in ids)


def languages():
    return [(CHOICES, FiniteLanguage(CHOICES)),
            (Regex(REGEX), FiniteLanguage(enumerate_regex(REGEX, "012-ab", 5))),
            (Lark('start: "x" item+\nitem: "a" | "bc"\n'), None)]


def make(grammar) -> Constraint:
    return Constraint(grammar, TOK, TINY_VOCAB, (EOS_ID,))


def oracle_mask(lang: FiniteLanguage, prefix: str) -> np.ndarray:
    m = np.zeros(TINY_VOCAB, bool)
    for c in lang.allowed_chars(prefix):
        m[cid(c)] = True
    m[EOS_ID] = lang.eos_allowed(prefix)
    return m


@pytest.mark.parametrize("which", [0, 1])
def test_masks_along_every_word_equal_the_oracle(which):
    grammar, lang = languages()[which]
    assert len(lang.words) > 4
    for word in lang.words:
        c = make(grammar)
        for k in range(len(word) + 1):
            got = c.mask()
            assert np.array_equal(got, oracle_mask(lang, word[:k])), (word, k)
            if k < len(word):
                c.commit([cid(word[k])])
        assert c.is_complete
        c.commit([EOS_ID])
        assert c.is_complete


def random_tree(rng, alphabet: str, n: int) -> DraftTree:
    parents = [int(rng.integers(-1, i)) for i in range(n)]
    toks = [cid(alphabet[int(rng.integers(len(alphabet)))]) if rng.random() < 0.9 else EOS_ID for _ in range(n)]
    return DraftTree(np.array(toks), np.array(parents, np.int32))


@pytest.mark.parametrize("which", [0, 1])
def test_prune_keeps_exactly_the_nodes_whose_path_the_oracle_allows(which):
    grammar, lang = languages()[which]
    alphabet = "".join(sorted({ch for w in lang.words for ch in w}))
    rng = np.random.default_rng(which)
    kept_any = cut_any = 0
    for trial in range(60):
        c = make(grammar)
        # Commit a valid prefix of a random word first: pruning starts from the committed state.
        word = lang.words[int(rng.integers(len(lang.words)))]
        prefix = word[: int(rng.integers(0, len(word)))]
        c.commit([cid(ch) for ch in prefix])
        tree = random_tree(rng, alphabet, int(rng.integers(1, 25)))
        want = []
        for i in range(len(tree)):
            path = tree.tokens[tree.path(i)].tolist()
            eos_at = [k for k, t in enumerate(path) if t == EOS_ID]
            if eos_at:  # EOS is allowed only at the end of a word, and nothing after it
                ok = eos_at[0] == len(path) - 1 and lang.eos_allowed(prefix + text_of(path[:-1]))
            else:
                ok = lang.is_prefix(prefix + text_of(path))
            if ok:
                want.append(i)
        got = c.prune(tree).tolist()
        assert got == want, (prefix, tree)
        tree.subset(got)  # a valid tree: every kept node's parent kept
        kept_any += len(got)
        cut_any += len(tree) - len(got)
        # Pruning looked ahead only: the committed state is unchanged.
        assert np.array_equal(c.mask(), oracle_mask(lang, prefix))
    assert kept_any > 20 and cut_any > 20


@pytest.mark.parametrize("which", [0, 1])
def test_row_masks_are_the_oracle_mask_after_each_rows_path(which):
    grammar, lang = languages()[which]
    rng = np.random.default_rng(10 + which)
    alphabet = "".join(sorted({ch for w in lang.words for ch in w}))
    checked = 0
    for _ in range(30):
        c = make(grammar)
        # Paths along real words with random tails (the pruned tree keeps the valid parts).
        seqs = []
        for _ in range(3):
            w = lang.words[int(rng.integers(len(lang.words)))]
            junk = "".join(alphabet[int(rng.integers(len(alphabet)))] for _ in range(int(rng.integers(0, 3))))
            seqs.append([cid(ch) for ch in w[: int(rng.integers(1, len(w) + 1))] + junk])
        tree = DraftTree.from_sequences(seqs)
        tree = tree.subset(c.prune(tree))
        masks = c.row_masks(tree)
        assert np.array_equal(masks(0), oracle_mask(lang, ""))
        for i in range(len(tree)):
            path = tree.tokens[tree.path(i)].tolist()
            if EOS_ID in path:
                continue
            assert np.array_equal(masks(1 + i), oracle_mask(lang, text_of(path))), path
            checked += 1
    assert checked > 30


def test_forced_tokens_are_what_every_continuation_shares():
    lang = FiniteLanguage(CHOICES)
    c = make(CHOICES)
    assert c.forced(10) == []                       # r / g / b: nothing forced
    c.commit([cid("b")])
    assert text_of(c.forced(10)) == lang.forced("b") == "lue"
    assert text_of(c.forced(2)) == "lu"             # cut at max_len
    c.commit([cid(ch) for ch in "lue"])
    assert c.forced(10) == []                       # "blue" is a word: EOS or "berry"
    c.commit([cid("b")])
    assert text_of(c.forced(10)) == lang.forced("blueb") == "erry"
    c2 = make(CHOICES)
    c2.commit([cid("g")])
    assert text_of(c2.forced(10)) == lang.forced("g") == "re"


def test_lark_grammar_masks_and_completion():
    c = make(Lark('start: "x" item+\nitem: "a" | "bc"\n'))
    assert np.flatnonzero(c.mask()).tolist() == [cid("x")]
    c.commit([cid("x")])
    assert sorted(np.flatnonzero(c.mask()).tolist()) == sorted([cid("a"), cid("b")])
    assert not c.is_complete
    c.commit([cid("b")])
    assert np.flatnonzero(c.mask()).tolist() == [cid("c")]
    c.commit([cid("c")])
    assert c.is_complete and c.mask()[EOS_ID]


def test_commit_refuses_a_forbidden_token_and_an_early_eos():
    c = make(CHOICES)
    with pytest.raises(ConstraintError, match="not allowed"):
        c.commit([cid("z")])
    c = make(CHOICES)
    with pytest.raises(ConstraintError, match="EOS"):
        c.commit([cid("r"), EOS_ID])


def test_join_forced_reuses_matching_nodes_adds_the_rest_and_respects_the_budget():
    tree = DraftTree.from_sequences([[5, 6, 9], [5, 7]])   # 5 -> 6 -> 9, 5 -> 7
    j = join_forced(tree, [5, 6, 10, 11], source=8, budget=16, max_depth=8)
    paths = {tuple(j.tree.tokens[j.tree.path(i)].tolist()) for i in range(len(j.tree))}
    assert (5, 6, 10, 11) in paths and (5, 6, 9) in paths and (5, 7) in paths
    assert len(j.tree) == len(tree) + 2
    added = np.flatnonzero(j.origin < 0)
    assert j.tree.tokens[added].tolist() == [10, 11] and set(j.tree.sources[added].tolist()) == {8}
    for i in np.flatnonzero(j.origin >= 0):
        assert j.tree.tokens[i] == tree.tokens[j.origin[i]]
    small = join_forced(tree, [5, 6, 10, 11], source=8, budget=4, max_depth=8)
    assert len(small.tree) == 4
    assert small.tree.path_tokens(int(np.argmax(small.tree.depth))) == [5, 6, 10, 11]  # the forced chain stays
    shallow = join_forced(DraftTree.empty(), [5, 6, 10, 11], source=8, budget=16, max_depth=2)
    assert shallow.tree.tokens.tolist() == [5, 6]


@pytest.mark.parametrize("bad, match", [
    ("[a-z]+", "bare string"),
    (Regex("[a-"), "Regex"),
    (Lark("start: nosuch"), "Lark"),
    (JsonSchema({"type": "nosuchtype"}), "JsonSchema"),
    (JsonSchema("{not json"), "not valid JSON"),
    ([], "at least one"),
    (["ok", ""], "at least one"),
    (Choice(["a", 3]), "at least one"),
    (42, "takes a JSON Schema"),
])
def test_bad_grammars_raise_a_constraint_error_naming_the_problem(bad, match):
    with pytest.raises(ConstraintError, match=match):
        make(bad)
    assert issubclass(ConstraintError, ValueError)


def test_forced_after_a_path_is_the_oracles_shared_continuation_and_leaves_the_state_alone():
    lang = FiniteLanguage(CHOICES)
    c = make(CHOICES)
    assert text_of(c.forced_after([cid("b")], 10)) == lang.forced("b") == "lue"
    assert text_of(c.forced_after([cid(ch) for ch in "blueb"], 10)) == lang.forced("blueb") == "erry"
    assert c.forced_after([cid(ch) for ch in "blue"], 10) == []
    assert c.forced_after([cid("z")], 10) == []            # a path the grammar rejects
    assert np.array_equal(c.mask(), oracle_mask(lang, ""))  # looked ahead only
