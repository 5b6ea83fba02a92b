"""The parse scorer against hand-worked counts and against the real EVALB (compiled from
../shared/reference/evalb/evalb.c, run with COLLINS.prm; see tests/evalb.py): the hand cases,
the whole WSJ sample and pseudo-randomly perturbed parses of it must get EVALB's numbers.

Brackets are written label[start, end) over the positions of the words each tree keeps.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from attnmt.data.treebank import (
    Tree,
    parse_bracketed,
    preprocess,
    read_treebank,
    tags,
    to_bracketed,
)
from attnmt.errors import DataError
from attnmt.evaluate.parse_f1 import (
    ERROR,
    SKIP,
    VALID,
    brackets,
    evalb_label,
    score_sentence,
    score_trees,
)
from tests.evalb import Evalb, assert_agrees, compile_evalb

T = parse_bracketed

# Words: The cat sat on the mat . -> the period is deleted, 6 words remain.
# Brackets: S[0,6) NP[0,2) VP[2,6) PP[3,6) NP[4,6) = 5.
GOLD = T("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))")

JOHN = "(S (NP (NNP John)) (VP (VBD ran)) (. .))"
LONG_GOLD = "(S " + " ".join(f"(NN w{i})" for i in range(41)) + ")"
LONG_TEST = "(X " + " ".join(f"(NN w{i})" for i in range(41)) + ")"

# Every hand case as (gold, test); the tests below work out their counts, and the last one
# checks that EVALB gets the same numbers for all of them.
CASES: dict[str, tuple[Tree, Tree]] = {
    name: (T(gold), T(test))
    for name, gold, test in [
        ("identical", to_bracketed(GOLD), to_bracketed(GOLD)),
        (
            "wrong label",
            to_bracketed(GOLD),
            "(S (NP (DT The) (NN cat)) (VP (VBD sat) (SBAR (IN on) (NP (DT the) (NN mat)))) (. .))",
        ),
        (
            "missing",
            to_bracketed(GOLD),
            "(S (NP (DT The) (NN cat)) (VP (VBD sat) (IN on) (NP (DT the) (NN mat))) (. .))",
        ),
        (
            "crossing",
            "(S (NP (DT a) (NN b)) (VP (VBD c) (NP (NN d))))",
            "(S (DT a) (NP (NN b) (VBD c)) (VP (NP (NN d))))",
        ),
        ("period inside", JOHN, "(S (NP (NNP John)) (VP (VBD ran) (. .)))"),
        ("period as NN", JOHN, "(S (NP (NNP John)) (VP (VBD ran) (NN .)))"),
        ("word as comma", JOHN, "(S (NP (NNP John)) (VP (, ran)) (. .))"),
        ("other word", JOHN, "(S (NP (NNP Mary)) (VP (VBD ran)) (. .))"),
        ("no words", JOHN, "(S (. .) (NP (-NONE- *)))"),
        (
            "PRT as ADVP",
            "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))",
            "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))",
        ),
        (
            "ADVP as PRT",
            "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))",
            "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))",
        ),
        (
            "cut labels",
            "( (S (NP=2 (NNS Dogs)) (VP-TPC-1 (VBP bark))))",
            "(-LRB- (TOP-1 (S (NP (NNS Dogs)) (VP (VBP bark)))))",
        ),
        ("fewer unary", "(S (VP (VP (VB go))))", "(S (VP (VB go)))"),
        ("more unary", "(S (VP (VP (VB go))))", "(S (VP (VP (VP (VB go)))))"),
        ("over punctuation", JOHN, "(S (NP (NNP John)) (VP (VBD ran)) (X (. .)))"),
        (
            "quotes only",
            "(S (PRN (`` ``)) (NP (NNP John)) (VP (VBD ran)) ('' ''))",
            "(S (PRN (`` ``)) (NP (NNP John)) (VP (VBD ran)) ('' ''))",
        ),
        (
            "outer bracket",
            "( (S (NP-SBJ (-NONE- *)) (NP-SBJ-1 (NNS Dogs)) (VP (VBP bark))) )",
            "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))",
        ),
        (
            "root",
            "(ROOT (S (NP (NNS Dogs)) (VP (VBP bark))))",
            "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))",
        ),
        ("swapped", "(S (NP (NN x)) (VP (VB y)))", "(S (VP (NN x)) (NP (VB y)))"),
        ("nothing matched", "(S (NP (NN x)) (VP (VB y)))", "(X (Y (NN x)) (Z (VB y)))"),
        ("long", LONG_GOLD, LONG_TEST),
    ]
}


def test_identical_trees_score_100_and_match_exactly():
    gold, test = CASES["identical"]
    gold_brackets, test_brackets, length = brackets(gold, test)
    assert gold_brackets == Counter(
        {("S", 0, 6): 1, ("NP", 0, 2): 1, ("VP", 2, 6): 1, ("PP", 3, 6): 1, ("NP", 4, 6): 1}
    )
    assert test_brackets == gold_brackets
    assert length == 7  # EVALB's length counts punctuation; only -NONE- is left out
    scores = score_trees([gold], [test])
    assert (scores.matched, scores.gold_brackets, scores.test_brackets) == (5, 5, 5)
    assert scores.recall == scores.precision == scores.f1 == 100.0
    assert scores.exact_match == 100.0
    assert (scores.num_sentences, scores.num_valid) == (1, 1)


def test_one_wrong_label():
    # PP[3,6) labelled SBAR: 4 of 5 match each way. P = R = F = 80.
    sentence = score_sentence(*CASES["wrong label"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (4, 5, 5)
    assert sentence.precision == sentence.recall == sentence.f1 == pytest.approx(80.0)
    assert not sentence.exact_match


def test_one_missing_bracket():
    # No PP: test has 4 brackets, all correct. P = 4/4 = 100, R = 4/5 = 80,
    # F = 2 * 100 * 80 / 180 = 88.888...
    sentence = score_sentence(*CASES["missing"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (4, 5, 4)
    assert sentence.precision == 100.0
    assert sentence.recall == pytest.approx(80.0)
    assert sentence.f1 == pytest.approx(800 / 9)


def test_crossing_bracket():
    # Words a b c d, no punctuation.
    # gold: S[0,4) NP[0,2) VP[2,4) NP[3,4)
    # test: S[0,4) NP[1,3) (crosses both NP[0,2) and VP[2,4)) VP[3,4) NP[3,4)
    # matched: S[0,4), NP[3,4) = 2 of 4 each way: P = R = F = 50.
    sentence = score_sentence(*CASES["crossing"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (2, 4, 4)
    assert sentence.f1 == pytest.approx(50.0)


def test_punctuation_is_deleted_by_each_trees_own_tags():
    # gold: S[0,3) NP[0,1) VP[1,2) over John ran . ; test attaches the period inside VP[1,3).
    # Deleting the period maps position 3 -> 2 in both: S[0,2) NP[0,1) VP[1,2) each.
    # Full match 3/3, although the raw spans of VP differ.
    sentence = score_sentence(*CASES["period inside"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (3, 3, 3)
    assert sentence.exact_match
    # A test tree that tags the period NN keeps it as a word: 2 gold words, 3 test words,
    # EVALB's "length unmatch", an error sentence with no counts (not an exact match, as
    # a scorer going by the gold tags would say).
    gold, mistagged = CASES["period as NN"]
    sentence = score_sentence(gold, mistagged, index=4)
    assert (sentence.status, sentence.message) == (ERROR, "sentence 4: length unmatch (2|3)")
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (0, 0, 0)
    assert not sentence.exact_match
    with pytest.raises(DataError, match=r"length unmatch \(2\|3\)"):
        brackets(gold, mistagged)
    # A word tagged as punctuation in the test tree: 2 words against 1.
    sentence = score_sentence(*CASES["word as comma"])
    assert (sentence.status, sentence.message) == (ERROR, "sentence 0: length unmatch (2|1)")


def test_words_must_agree_and_a_test_tree_without_words_is_skipped():
    sentence = score_sentence(*CASES["other word"])
    assert (sentence.status, sentence.message) == (ERROR, "sentence 0: words unmatch (John|Mary)")
    # Only punctuation and traces in the test tree: nothing left, EVALB skips the sentence.
    sentence = score_sentence(*CASES["no words"])
    assert sentence.status == SKIP and not sentence.exact_match
    assert sentence.length == 3


def test_advp_and_prt_count_as_the_same_label():
    # gold S[0,3) NP[0,1) VP[1,3) PRT[2,3); test has ADVP[2,3): 4/4, either way round.
    assert score_sentence(*CASES["PRT as ADVP"]).matched == 4
    assert score_sentence(*CASES["ADVP as PRT"]).exact_match


def test_labels_are_cut_at_the_first_dash_or_equals():
    labels = ("NP-SBJ-1", "PP-LOC=2", "S=3", "PRT", "-LRB-")
    assert [evalb_label(label) for label in labels] == ["NP", "PP", "S", "ADVP", ""]
    # NP=2 is NP; a constituent labelled -LRB- is the empty label, like PTB's outer bracket;
    # TOP-1 is TOP, deleted. gold ""[0,2) S[0,2) NP[0,1) VP[1,2); test the same: 4/4.
    sentence = score_sentence(*CASES["cut labels"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (4, 4, 4)


def test_unary_chain_duplicates_count_with_multiplicity():
    # gold S[0,1) VP[0,1) VP[0,1) = 3 brackets, two of them the same.
    # test S[0,1) VP[0,1): matched min(1,1) + min(2,1) = 2. P = 100, R = 2/3.
    fewer = score_sentence(*CASES["fewer unary"])
    assert (fewer.matched, fewer.gold_brackets, fewer.test_brackets) == (2, 3, 2)
    assert fewer.recall == pytest.approx(200 / 3)
    assert fewer.precision == 100.0
    # test S VP VP VP: matched 1 + min(2,3) = 3. P = 3/4 = 75, R = 100.
    more = score_sentence(*CASES["more unary"])
    assert (more.matched, more.gold_brackets, more.test_brackets) == (3, 3, 4)
    assert more.precision == pytest.approx(75.0)
    assert more.recall == 100.0


def test_bracket_covering_only_punctuation_is_dropped():
    # X[2,3) covers the period alone; after deletion it is X[2,2), empty: not a bracket.
    sentence = score_sentence(*CASES["over punctuation"])
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (3, 3, 3)
    # The same on the gold side: the quotes-only PRN is not counted.
    gold_brackets, _, _ = brackets(*CASES["quotes only"])
    assert gold_brackets == Counter({("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1})


def test_the_outer_empty_bracket_counts_and_top_does_not():
    # Raw PTB gold: the outer "( )" is a bracket with the empty label over the sentence
    # (EVALB deletes TOP, not ""); -NONE- is not a word, NP-SBJ over the trace alone covers
    # nothing, NP-SBJ-1 is NP. gold ""[0,2) S[0,2) NP[0,1) VP[1,2): 4. The test's TOP is
    # deleted: S NP VP, all 3 matched. P = 100, R = 75.
    gold_brackets, test_brackets, length = brackets(*CASES["outer bracket"])
    common = Counter({("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1})
    assert test_brackets == common
    assert gold_brackets == common + Counter({("", 0, 2): 1})
    assert length == 2
    sentence = score_sentence(*CASES["outer bracket"])
    assert (sentence.precision, sentence.recall) == (100.0, 75.0)
    # ROOT is an ordinary label: counted, and missed by a test tree without it.
    rooted = score_sentence(*CASES["root"])
    assert (rooted.matched, rooted.gold_brackets, rooted.test_brackets) == (3, 4, 3)


def test_corpus_score_is_a_micro_average_over_valid_sentences():
    # Sentence 0: GOLD against itself, 5/5/5, F = 100.
    # Sentence 1 (x y): gold S[0,2) NP[0,1) VP[1,2); test S[0,2) VP[0,1) NP[1,2):
    #   matched 1 of 3 each way, F = 33.33.
    # Sentence 2: length unmatch, left out of every total and of complete match.
    # Mean of sentence F1s: (100 + 33.33) / 2 = 66.67.
    # Micro: matched 6, gold 8, test 8 -> P = R = F = 75; complete 1 of 2 valid = 50.
    pairs = [CASES["identical"], CASES["swapped"], CASES["period as NN"]]
    scores = score_trees([g for g, _ in pairs], [t for _, t in pairs])
    assert [s.status for s in scores.sentences] == [VALID, VALID, ERROR]
    assert [s.f1 for s in scores.sentences[:2]] == pytest.approx([100.0, 100 / 3])
    assert (scores.matched, scores.gold_brackets, scores.test_brackets) == (6, 8, 8)
    assert scores.f1 == pytest.approx(75.0)
    assert scores.f1 != pytest.approx(sum(s.f1 for s in scores.sentences[:2]) / 2)
    assert scores.exact_match == 50.0
    assert (scores.num_errors, scores.num_skipped, scores.num_valid) == (1, 0, 2)
    assert [s.index for s in scores.sentences] == [0, 1, 2]
    with pytest.raises(DataError, match="2 gold trees but 1 test trees"):
        score_trees([GOLD, GOLD], [GOLD])


def test_nothing_matched_scores_zero():
    # gold S[0,2) NP[0,1) VP[1,2); test X[0,2) Y[0,1) Z[1,2): P = R = 0; F = 0 (EVALB: nan).
    sentence = score_sentence(*CASES["nothing matched"])
    assert (sentence.matched, sentence.precision, sentence.recall, sentence.f1) == (0, 0, 0, 0)


def test_format_looks_like_evalb_summary():
    # Sentence 0 has 7 words (<= 40): 5/5/5. Sentence 1 has 41 words, S against X: 0/1/1.
    # All: 5 of 6 each way, 83.33; the len<=40 block holds sentence 0 alone.
    pairs = [CASES["identical"], CASES["long"]]
    text = score_trees([g for g, _ in pairs], [t for _, t in pairs]).format()
    assert text.splitlines() == [
        "=== Summary ===",
        "",
        "-- All --",
        "Number of sentence        =      2",
        "Number of Error sentence  =      0",
        "Number of Skip  sentence  =      0",
        "Number of Valid sentence  =      2",
        "Bracketing Recall         =  83.33",
        "Bracketing Precision      =  83.33",
        "Bracketing FMeasure       =  83.33",
        "Complete match            =  50.00",
        "",
        "-- len<=40 --",
        "Number of sentence        =      1",
        "Number of Error sentence  =      0",
        "Number of Skip  sentence  =      0",
        "Number of Valid sentence  =      1",
        "Bracketing Recall         = 100.00",
        "Bracketing Precision      = 100.00",
        "Bracketing FMeasure       = 100.00",
        "Complete match            = 100.00",
    ]


def test_empty_corpus_scores_zero():
    scores = score_trees([], [])
    assert (scores.num_sentences, scores.f1, scores.exact_match) == (0, 0.0, 0.0)


# --------------------------------------------------------------------------- against EVALB


def test_every_hand_case_gets_evalbs_numbers(evalb: Evalb, tmp_path):
    names = list(CASES)
    gold = [CASES[name][0] for name in names]
    test = [CASES[name][1] for name in names]
    scores = score_trees(gold, test)
    result = evalb.run_trees(gold, test, tmp_path)
    assert_agrees(scores, result)
    assert (scores.num_errors, scores.num_skipped) == (3, 1)
    # The two cases the issue found: EVALB counts the outer empty bracket...
    outer = result.rows[names.index("outer bracket")]
    assert (outer.status, outer.matched, outer.gold, outer.test) == (VALID, 3, 4, 3)
    # ...and rejects the NN-tagged period.
    assert result.rows[names.index("period as NN")].status == ERROR
    assert "Length unmatch (2|3)" in result.stderr
    # Nothing matched: EVALB's sentence line says 0.00, and its summary would say nan.
    gold, test = CASES["nothing matched"]
    nothing = score_trees([gold], [test])
    assert_agrees(nothing, evalb.run_trees([gold], [test], tmp_path, "zero"))
    assert nothing.f1 == 0.0


@pytest.fixture(scope="module")
def raw_sample(ptb_sample_dir) -> list[Tree]:
    return read_treebank(ptb_sample_dir, 1, 199)


@pytest.fixture(scope="module")
def preprocessed_sample(raw_sample) -> list[Tree]:
    return [preprocess(tree) for tree in raw_sample]


def test_raw_sample_against_its_preprocessed_self_is_evalbs_97_41(
    raw_sample, preprocessed_sample, evalb, tmp_path
):
    """Every raw tree keeps its outer "( )", which preprocess drops: EVALB's recall 94.94."""
    preprocessed = preprocessed_sample
    scores = score_trees(raw_sample, preprocessed)
    result = evalb.run_trees(raw_sample, preprocessed, tmp_path)
    assert_agrees(scores, result)
    assert (result.all.sentences, result.all.errors, result.all.skipped) == (3669, 0, 0)
    assert (result.all.recall, result.all.precision, result.all.f1) == ("94.94", "100.00", "97.41")
    # Without the outer bracket on either side, nothing is lost: EVALB's own cleanup
    # (traces, function tags) agrees with preprocess.
    same = score_trees(preprocessed, preprocessed)
    assert same.f1 == same.exact_match == 100.0
    assert_agrees(same, evalb.run_trees(preprocessed, preprocessed, tmp_path, "self"))


PUNCTUATION = (",", ".", ":", "``", "''")
LABELS = ("NP", "VP", "PP", "S", "SBAR", "ADVP", "PRT", "ADJP", "NP-SBJ", "PP-LOC=2", "TOP")
LABELS += ("ROOT", "", ",", "-LRB-", "QP", "NP=3", "TOP-1", ".=2")


def perturb(tree: Tree, rng: random.Random, rate: float, errors: bool) -> Tree:
    """A pseudo-random wrong parse over the same words: brackets dropped (children spliced
    into the parent), relabelled (deleted labels, function tags, ADVP/PRT, the empty label
    included), added over runs of siblings, doubled into unary chains; punctuation leaves
    moved between siblings and traces inserted. With ``errors``, a few sentences also get
    what EVALB rejects: a mistagged punctuation mark, a word tagged as punctuation, a changed
    word, or a tree of punctuation alone (a skip)."""
    if errors and rng.random() < 0.04:
        kind = rng.randrange(4)
        leaves = tags(tree)
        if kind == 3:
            return Tree("S", (Tree(".", word="."), Tree("-NONE-", word="*")))
        if kind == 0 and any(t in PUNCTUATION for t in leaves):
            return _retag_first(tree, lambda t: t in PUNCTUATION, "NN")
        if kind == 1:
            return _retag_first(tree, lambda t: t not in (*PUNCTUATION, "-NONE-"), ",")
        return _rename_first_word(tree)

    def visit(node: Tree) -> list[Tree]:
        if node.is_preterminal:
            out = [node]
            if rng.random() < rate / 4:
                out.append(Tree("-NONE-", word="*T*-1"))
            return out
        children = [c for child in node.children for c in visit(child)]
        if len(children) > 1 and rng.random() < rate / 2:  # swap a punctuation leaf
            i = rng.randrange(len(children) - 1)
            if children[i].is_preterminal and children[i].label in PUNCTUATION:
                children[i], children[i + 1] = children[i + 1], children[i]
        roll = rng.random()
        if roll < rate:
            return children
        label = rng.choice(LABELS) if roll < 2 * rate else node.label
        if len(children) > 2 and rng.random() < rate:
            i = rng.randrange(len(children) - 1)
            j = rng.randrange(i + 1, len(children)) + 1
            children[i:j] = [Tree(rng.choice(LABELS), tuple(children[i:j]))]
        built = Tree(label, tuple(children))
        if rng.random() < rate / 4:
            built = Tree(rng.choice((label, "NP")), (built,))
        return [built]

    parts = visit(tree)
    return parts[0] if len(parts) == 1 and not parts[0].is_preterminal else Tree("S", tuple(parts))


def _retag_first(tree: Tree, which, tag: str) -> Tree:
    done = False

    def visit(node: Tree) -> Tree:
        nonlocal done
        if node.is_preterminal:
            if not done and which(node.label):
                done = True
                return Tree(tag, word=node.word)
            return node
        return Tree(node.label, tuple(visit(child) for child in node.children))

    return visit(tree)


def _rename_first_word(tree: Tree) -> Tree:
    if tree.is_preterminal:
        return Tree(tree.label, word=tree.word + "x")
    return Tree(tree.label, (_rename_first_word(tree.children[0]), *tree.children[1:]))


def _brackets(tree: Tree) -> int:
    return 0 if tree.is_preterminal else 1 + sum(_brackets(child) for child in tree.children)


@pytest.mark.parametrize(
    ("seed", "rate", "raw_gold", "errors"),
    [(0, 0.1, True, True), (1, 0.25, False, True), (2, 0.4, False, False)],
)
def test_perturbed_parses_of_the_whole_sample_get_evalbs_numbers(
    raw_sample, preprocessed_sample, evalb, tmp_path, seed, rate, raw_gold, errors
):
    rng = random.Random(seed)
    gold = raw_sample if raw_gold else preprocessed_sample
    test = [perturb(tree, rng, rate, errors) for tree in preprocessed_sample]
    # Within EVALB's fixed arrays (200 brackets, 200 kept words a sentence), so its
    # answer is defined.
    assert max(_brackets(tree) for tree in gold + test) < 200
    scores = score_trees(gold, test)
    result = evalb.run_trees(gold, test, tmp_path)
    assert_agrees(scores, result)
    assert 10 < scores.precision < 95 and 10 < scores.recall < 95
    assert scores.precision != scores.recall
    if errors:
        assert scores.num_errors > 20 and scores.num_skipped > 5
    else:
        assert scores.num_errors == scores.num_skipped == 0


def test_a_missing_compiler_or_a_failed_build_fails_the_evalb_tests(tmp_path, monkeypatch):
    """The EVALB comparison is never skipped for want of cc: it fails (tests/evalb.py)."""
    monkeypatch.setattr("tests.evalb.shutil.which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="no C compiler"):
        compile_evalb(tmp_path)
    monkeypatch.undo()
    broken = tmp_path / "source"
    broken.mkdir()
    (broken / "evalb.c").write_text("int main( {\n")
    monkeypatch.setenv("ATTNMT_EVALB_DIR", str(broken))
    with pytest.raises(pytest.fail.Exception, match="compiling EVALB failed"):
        compile_evalb(tmp_path)
