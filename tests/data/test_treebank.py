"""Treebank reading, preprocessing, GaFL linearization and repair, on hand cases and real PTB."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from attnmt.data.treebank import (
    Tree,
    delinearize,
    iter_linearized,
    linearize,
    parse_bracketed,
    parse_trees,
    preprocess,
    read_treebank,
    read_trees,
    retag,
    strip_function_tags,
    tags,
    to_bracketed,
    treebank_files,
    words,
)
from attnmt.errors import DataError

# ../shared/data/README.md says 3,636 sentences, but wsj_0001-0179 hold 3,669 trees (counted
# both with read_treebank and with a bare top-level-parenthesis count of the files).
SAMPLE_TREES = 3669


def leaf(tag: str, word: str) -> Tree:
    return Tree(tag, word=word)


def node(label: str, *children: Tree) -> Tree:
    return Tree(label, children)


def with_tag(tree: Tree, tag: str) -> Tree:
    """The tree with every POS tag replaced (what the XX round trip can reproduce)."""
    if tree.is_preterminal:
        return Tree(tag, word=tree.word)
    return Tree(tree.label, tuple(with_tag(child, tag) for child in tree.children))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# Three trees in one file: PTB's multi-line layout, "((" without a space, several on a line.
MRG = """\
( (S
    (NP-SBJ-1 (NNP John) )
    (VP (VBD ran)
      (S (NP-SBJ (-NONE- *-1) ) (VP (-NONE- *?*) ))
      (PP-LOC=2 (IN in)
        (NP (-LRB- -LRB-) (DT the) (NN park) (-RRB- -RRB-) )))
    (. .) ))
((NP (NP-TTL (NN it) )))
( (FRAG (NP (NN yes) ) (SBAR (-NONE- 0) (S (-NONE- *T*-1) )) ) ) ( (X (UH oh) ) )
"""


# --------------------------------------------------------------------------- reading


def test_read_trees_several_per_file(tmp_path: Path):
    trees = read_trees(write(tmp_path / "wsj_0001.mrg", MRG))
    assert len(trees) == 4
    assert [tree.label for tree in trees] == ["", "", "", ""]
    assert trees[1] == node("", node("NP", node("NP-TTL", leaf("NN", "it"))))
    first = trees[0].children[0]
    assert first.label == "S"
    assert [child.label for child in first.children] == ["NP-SBJ-1", "VP", "."]
    assert words(trees[0]) == [
        "John",
        "ran",
        "*-1",
        "*?*",
        "in",
        "-LRB-",
        "the",
        "park",
        "-RRB-",
        ".",
    ]
    assert tags(trees[0])[2:4] == ["-NONE-", "-NONE-"]
    assert tags(trees[0])[5] == "-LRB-"


def test_preprocess_matches_hand_written_trees(tmp_path: Path):
    trees = [preprocess(tree) for tree in read_trees(write(tmp_path / "a.mrg", MRG))]
    # The S under VP held only -NONE- elements: removed, with its emptied NP and VP.
    expected_first = node(
        "S",
        node("NP", leaf("NNP", "John")),
        node(
            "VP",
            leaf("VBD", "ran"),
            node(
                "PP",
                leaf("IN", "in"),
                node("NP", leaf("-LRB-", "-LRB-"), leaf("DT", "the"), leaf("NN", "park"),
                     leaf("-RRB-", "-RRB-")),
            ),
        ),
        leaf(".", "."),
    )  # fmt: skip
    assert trees[0] == expected_first
    # (NP (NP-TTL ...)) becomes the unary chain (NP (NP ...)), kept on purpose.
    assert trees[1] == node("NP", node("NP", leaf("NN", "it")))
    assert trees[2] == node("FRAG", node("NP", leaf("NN", "yes")))
    assert trees[3] == node("X", leaf("UH", "oh"))


@pytest.mark.parametrize(
    ("label", "stripped"),
    [
        ("NP-SBJ-1", "NP"),
        ("PP-LOC=2", "PP"),
        ("NP=3", "NP"),
        ("NP-SBJ=1-3", "NP"),
        ("S-TPC-1", "S"),
        ("PRP$", "PRP$"),
        ("-LRB-", "-LRB-"),
        ("-NONE-", "-NONE-"),
        ("", ""),
    ],
)
def test_strip_function_tags(label: str, stripped: str):
    assert strip_function_tags(label) == stripped


def test_preprocess_root_wrappers():
    assert preprocess(parse_bracketed("(TOP (S (VB go)))")) == node("S", leaf("VB", "go"))
    # A wrapper around a lone preterminal or several constituents becomes S.
    assert preprocess(parse_bracketed("( (UH hi) )")) == node("S", leaf("UH", "hi"))
    two = preprocess(parse_bracketed("( (NP (NN a)) (VP (VB b)) )"))
    assert two == node("S", node("NP", leaf("NN", "a")), node("VP", leaf("VB", "b")))
    with pytest.raises(ValueError, match="only -NONE-"):
        preprocess(parse_bracketed("( (S (-NONE- *)) )"))


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("( (S (NN a) )\n( (S (NN b) ))\n", 1, "never closed"),
        ("( (S (NN a)) )\n)\n", 2, "closes nothing"),
        ("( (S (NN a)) )\nstray\n", 2, "outside any tree"),
        ("( (S (NN a)\n  () ) )\n", 2, "empty brackets"),
        ("( (S (NN a)\n  (NP) ) )\n", 2, "neither a word"),
        ("( (S (NN a)\n (NN b c) ) )\n", 2, "unexpected 'c'"),
        ("( (S (NN a)\n (NP x (NN b)) ) )\n", 2, "mixes a word and subtrees"),
    ],
)
def test_malformed_file_names_file_and_line(tmp_path: Path, text: str, line: int, message: str):
    path = write(tmp_path / "bad.mrg", text)
    with pytest.raises(DataError, match=message) as caught:
        read_trees(path)
    assert f"{path}, line {line}:" in str(caught.value)


def test_unreadable_file_is_a_data_error(tmp_path: Path):
    with pytest.raises(DataError, match=r"missing\.mrg"):
        read_trees(tmp_path / "missing.mrg")
    path = tmp_path / "latin1.mrg"
    path.write_bytes(b"( (S (NN caf\xe9)) )")
    with pytest.raises(DataError, match=r"latin1\.mrg"):
        read_trees(path)


def test_read_treebank_selects_by_file_number(tmp_path: Path):
    one = "( (S (NN {}) ) )\n"
    write(tmp_path / "wsj_0001.mrg", one.format("a") + one.format("b"))
    write(tmp_path / "wsj_0159.mrg", one.format("c"))
    write(tmp_path / "01" / "wsj_0160.mrg", one.format("d"))  # full PTB: section folders
    write(tmp_path / "wsj_0179.MRG", one.format("e"))
    write(tmp_path / "notes.txt", "not a tree")
    first_words = [words(tree)[0] for tree in read_treebank(tmp_path, 1, 159)]
    assert first_words == ["a", "b", "c"]
    assert [path.name for path in treebank_files(tmp_path, 160, 179)] == [
        "wsj_0160.mrg",
        "wsj_0179.MRG",
    ]
    with pytest.raises(DataError, match="0200-2199"):
        read_treebank(tmp_path, 200, 2199)
    with pytest.raises(DataError, match="does not exist"):
        read_treebank(tmp_path / "nowhere", 1, 1)


# --------------------------------------------------------------------------- linearize, write

SMALL = node(
    "S", node("NP", leaf("DT", "The"), leaf("NN", "cat")), node("VP", leaf("VBD", "sat")),
    leaf(".", "."),
)  # fmt: skip


def test_linearize_gafl_tokens():
    assert linearize(SMALL) == ["(S", "(NP", "XX", "XX", ")NP", "(VP", "XX", ")VP", "XX", ")S"]
    assert linearize(SMALL, pos=None)[2:4] == ["DT", "NN"]
    assert linearize(SMALL, pos=None)[-2] == "."
    assert list(iter_linearized([SMALL])) == [("The cat sat .", " ".join(linearize(SMALL)))]
    with pytest.raises(ValueError, match="parentheses"):
        linearize(SMALL, pos="(XX")


def test_linearize_with_the_words_as_leaves():
    assert linearize(SMALL, leaves="words") == [
        "(S", "(NP", "The", "cat", ")NP", "(VP", "sat", ")VP", ".", ")S",
    ]  # fmt: skip
    # A parenthesis in a word would read as a bracket: escaped on both sides, as in PTB.
    odd = node("S", leaf("SYM", ":-)"), leaf("-LRB-", "("))
    assert linearize(odd, leaves="words") == ["(S", ":--RRB-", "-LRB-", ")S"]
    assert list(iter_linearized([odd], leaves="words")) == [
        (":--RRB- -LRB-", "(S :--RRB- -LRB- )S")
    ]
    with pytest.raises(ValueError, match="leaves"):
        linearize(SMALL, leaves="tags")


def test_to_bracketed_and_back():
    text = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    assert to_bracketed(SMALL) == text
    assert parse_bracketed(text) == SMALL
    raw = to_bracketed(node("", SMALL))
    assert raw == "( " + text + ")"
    assert parse_bracketed(raw) == node("", SMALL)
    # Parentheses in words follow the PTB convention, so the line parses back.
    smiley = node("S", leaf("-LRB-", "("), leaf("SYM", ":-)"))
    assert to_bracketed(smiley) == "(S (-LRB- -LRB-) (SYM :--RRB-))"
    assert words(parse_bracketed(to_bracketed(smiley))) == ["-LRB-", ":--RRB-"]
    with pytest.raises(DataError, match="expected one tree, found 2"):
        parse_bracketed(text + text)


def test_retag_replaces_each_leafs_tag_in_order():
    # SMALL's leaves: (DT The) (NN cat) (VBD sat) (. .).
    xx = with_tag(SMALL, "XX")
    assert retag(xx, ["DT", "NN", "VBD", "."]) == SMALL
    assert retag(SMALL, ["A", "B", "C", "D"]) == node(
        "S",
        node("NP", leaf("A", "The"), leaf("B", "cat")),
        node("VP", leaf("C", "sat")),
        leaf("D", "."),
    )
    # One leaf object used twice still gets one tag per position; a bare preterminal too.
    twice = leaf("XX", "x")
    assert tags(retag(node("S", twice, twice), ["A", "B"])) == ["A", "B"]
    assert retag(leaf("XX", "x"), ["NN"]) == leaf("NN", "x")
    # Deeper than the recursion limit, as repaired parses can be.
    deep = leaf("XX", "w")
    for _ in range(5000):
        deep = node("NP", deep)
    assert tags(retag(deep, ["NN"])) == ["NN"]
    with pytest.raises(ValueError, match="4 leaves but 3 tags"):
        retag(SMALL, ["A", "B", "C"])


def test_tree_rejects_ill_formed_nodes():
    with pytest.raises(ValueError, match="exactly one of children and a word"):
        Tree("NP")
    with pytest.raises(ValueError, match="exactly one of children and a word"):
        Tree("NP", (SMALL,), word="x")
    with pytest.raises(ValueError, match="invalid label"):
        Tree("N P", word="x")
    with pytest.raises(ValueError, match="invalid word"):
        Tree("NN", word="two words")


# --------------------------------------------------------------------------- real sample


@pytest.fixture(scope="module")
def sample_split(ptb_sample_dir) -> tuple[list[Tree], list[Tree]]:
    """The sample read as a config would split it by file: wsj_0001-0159 and wsj_0160-0179."""
    return read_treebank(ptb_sample_dir, 1, 159), read_treebank(ptb_sample_dir, 160, 179)


@pytest.fixture(scope="module")
def sample(sample_split: tuple[list[Tree], list[Tree]]) -> list[Tree]:
    return [preprocess(tree) for part in sample_split for tree in part]


def test_sample_size_and_file_split(
    sample_split: tuple[list[Tree], list[Tree]], ptb_sample_dir: Path
):
    train, dev = sample_split
    assert len(train) + len(dev) == SAMPLE_TREES
    assert len(dev) > 0
    assert len(treebank_files(ptb_sample_dir, 1, 179)) == 179


def test_sample_preprocessing_leaves_no_annotation(sample: list[Tree]):
    for tree in sample:
        for token in linearize(tree, pos=None):
            assert token != "-NONE-"
            if token[0] in "()":
                label = token[1:]
                assert label and "=" not in label and "-" not in label, label


def test_sample_round_trips_with_real_tags(sample: list[Tree]):
    for tree in sample:
        assert delinearize(linearize(tree, pos=None), words(tree), pos=None) == tree
        assert parse_bracketed(to_bracketed(tree)) == tree


def test_sample_round_trips_with_xx(sample: list[Tree]):
    for tree in sample:
        assert delinearize(linearize(tree), words(tree)) == with_tag(tree, "XX")


def test_sample_round_trips_with_the_words_as_leaves(sample: list[Tree]):
    for tree in sample:
        tokens = linearize(tree, leaves="words")
        assert [t for t in tokens if t[0] not in "()"] == words(tree)
        assert delinearize(tokens, words(tree), leaves="words") == with_tag(tree, "XX")


# --------------------------------------------------------------------------- repair

A, B, C = "a", "b", "c"


@pytest.mark.parametrize(
    ("tokens", "sentence", "expected"),
    [
        # nothing predicted: the words under one S
        ([], [A, B], node("S", leaf("XX", A), leaf("XX", B))),
        # missing closes added at the end
        (["(S", "(NP", "XX", "XX", ")NP", "(VP", "XX"], [A, B, C],
         node("S", node("NP", leaf("XX", A), leaf("XX", B)), node("VP", leaf("XX", C)))),
        # surplus closes dropped
        (["(NP", "XX", ")NP", ")NP", ")S"], [A], node("NP", leaf("XX", A))),
        # a close's label is ignored: ")VP" closes the open NP
        (["(S", "(NP", "XX", ")VP", "(VP", "XX", ")S", ")S"], [A, B],
         node("S", node("NP", leaf("XX", A)), node("VP", leaf("XX", B)))),
        # surplus leaves dropped
        (["(S", "XX", "XX", "XX", ")S"], [A, B], node("S", leaf("XX", A), leaf("XX", B))),
        # missing leaves: into the single top constituent when everything is closed ...
        (["(S", "(NP", "XX", ")NP", ")S"], [A, B, C],
         node("S", node("NP", leaf("XX", A)), leaf("XX", B), leaf("XX", C))),
        # ... or into the innermost constituent still open
        (["(S", "(NP", "XX"], [A, B], node("S", node("NP", leaf("XX", A), leaf("XX", B)))),
        # garbage, a bare "(" and a label with a parenthesis dropped
        (["(S", "foo", "XX", "<unk>", "(", "(A(B", "XX", ")S", "bar"], [A, B],
         node("S", leaf("XX", A), leaf("XX", B))),
        # several top-level constituents, or a bare leaf, wrapped in S
        (["(NP", "XX", ")NP", "(VP", "XX", ")VP"], [A, B],
         node("S", node("NP", leaf("XX", A)), node("VP", leaf("XX", B)))),
        (["XX"], [A], node("S", leaf("XX", A))),
        (["(NP", "XX", ")NP", "XX"], [A, B], node("S", node("NP", leaf("XX", A)), leaf("XX", B))),
        # empty constituents removed, recursively
        (["(S", "(NP", ")NP", "(VP", "(ADVP", ")ADVP", "XX", ")VP", ")S"], [A],
         node("S", node("VP", leaf("XX", A)))),
        (["(NP", "(NP", ")NP", ")NP"], [A], node("S", leaf("XX", A))),
    ],
)  # fmt: skip
def test_repair_hand_cases(tokens: list[str], sentence: list[str], expected: Tree):
    assert delinearize(tokens, sentence) == expected


def test_repair_with_copied_words():
    # Each non-bracket token is the next word, whatever it spells: the leaves are always the
    # input's words, tagged XX; extra ones are dropped, missing ones appended as with XX.
    tokens = ["(S", "(NP", "the", "dog", ")NP", "(VP", "ran", "away", ")VP", ")S"]
    sentence = ["the", "cat", "ran"]
    expected = node(
        "S", node("NP", leaf("XX", "the"), leaf("XX", "cat")), node("VP", leaf("XX", "ran"))
    )
    assert delinearize(tokens, sentence, leaves="words") == expected
    assert delinearize(["(S", "a", ")S"], [A, B], leaves="words") == node(
        "S", leaf("XX", A), leaf("XX", B)
    )
    with pytest.raises(ValueError, match="leaves"):
        delinearize(tokens, sentence, leaves="tags")


def test_repair_with_predicted_tags():
    tokens = ["(S", "(NP", "DT", "NN", ")NP", "VBD", ")S"]
    expected = node(
        "S", node("NP", leaf("DT", "the"), leaf("NN", "cat")), leaf("VBD", "ran"),
        leaf("XX", "home"),
    )  # fmt: skip
    assert delinearize(tokens, ["the", "cat", "ran", "home"], pos=None) == expected
    # with pos="XX" the tags are garbage: every word is a missing leaf
    tagged = delinearize(tokens, ["the", "cat"])
    assert tagged == node("S", leaf("XX", "the"), leaf("XX", "cat"))


def test_repair_root_label_and_bad_arguments():
    assert delinearize(["XX"], [A], root_label="TOP") == node("TOP", leaf("XX", A))
    with pytest.raises(ValueError, match="zero words"):
        delinearize(["(S", ")S"], [])
    with pytest.raises(ValueError, match="root label"):
        delinearize([], [A], root_label="")


def assert_well_formed(tree: Tree) -> None:
    """Checked here by walking the tree, not by trusting Tree's own validation."""
    stack = [tree]
    while stack:
        current = stack.pop()
        assert current.label and not any(ch in current.label for ch in " ()")
        if current.is_preterminal:
            assert current.children == () and current.word
        else:
            assert current.word is None and len(current.children) > 0
            stack.extend(current.children)


RANDOM_VOCAB = [
    "(S", "(NP", "(VP", "(PP", "(", "((", ")", ")S", ")NP", ")VP", ")(", "XX", "XX", "XX",
    "NN", "garbage", "<unk>", "", "(A(B",
]  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_repair_random_sequences(seed: int):
    rng = random.Random(seed)
    for _ in range(100):
        sentence = [f"w{i}" for i in range(rng.randint(1, 8))]
        tokens = [rng.choice(RANDOM_VOCAB) for _ in range(rng.randint(0, 30))]
        for pos, leaves in (("XX", "pos"), (None, "pos"), ("XX", "words")):
            tree = delinearize(tokens, sentence, pos=pos, leaves=leaves)
            assert_well_formed(tree)
            assert words(tree) == sentence
            assert not tree.is_preterminal
            # Repair is a fixed point: a repaired tree's tokens describe it exactly.
            again = delinearize(linearize(tree, pos, leaves), sentence, pos, leaves=leaves)
            assert again == tree
            assert parse_bracketed(to_bracketed(tree)) == tree


def test_parse_trees_names_the_source():
    with pytest.raises(DataError, match="<string>, line 1"):
        parse_trees("(S (NN a)")
