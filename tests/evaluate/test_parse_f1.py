"""EVALB-convention bracket scoring on hand-worked examples (counts worked out in comments).

Brackets are written label[start, end) over word positions after punctuation is removed.
"""

from __future__ import annotations

from collections import Counter

import pytest

from attnmt.data.treebank import parse_bracketed, preprocess, read_treebank
from attnmt.errors import DataError
from attnmt.evaluate.parse_f1 import brackets, score_sentence, score_trees

T = parse_bracketed

# Words: The cat sat on the mat . -> the period is deleted, 6 words remain.
# Brackets: S[0,6) NP[0,2) VP[2,6) PP[3,6) NP[4,6) = 5.
GOLD = T("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))")


def test_identical_trees_score_100_and_match_exactly():
    gold_brackets, test_brackets, length = brackets(GOLD, GOLD)
    assert gold_brackets == Counter(
        {("S", 0, 6): 1, ("NP", 0, 2): 1, ("VP", 2, 6): 1, ("PP", 3, 6): 1, ("NP", 4, 6): 1}
    )
    assert test_brackets == gold_brackets
    assert length == 7  # EVALB's length counts punctuation; only -NONE- is left out
    scores = score_trees([GOLD], [GOLD])
    assert (scores.matched, scores.gold_brackets, scores.test_brackets) == (5, 5, 5)
    assert scores.recall == scores.precision == scores.f1 == 100.0
    assert scores.exact_match == 100.0
    assert scores.num_sentences == 1


def test_one_wrong_label():
    # PP[3,6) labelled SBAR: 4 of 5 match each way. P = R = F = 80.
    test = T(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (SBAR (IN on) (NP (DT the) (NN mat)))) (. .))"
    )
    sentence = score_sentence(GOLD, test)
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (4, 5, 5)
    assert sentence.precision == sentence.recall == sentence.f1 == pytest.approx(80.0)
    assert not sentence.exact_match


def test_one_missing_bracket():
    # No PP: test has 4 brackets, all correct. P = 4/4 = 100, R = 4/5 = 80,
    # F = 2 * 100 * 80 / 180 = 88.888...
    test = T("(S (NP (DT The) (NN cat)) (VP (VBD sat) (IN on) (NP (DT the) (NN mat))) (. .))")
    sentence = score_sentence(GOLD, test)
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (4, 5, 4)
    assert sentence.precision == 100.0
    assert sentence.recall == pytest.approx(80.0)
    assert sentence.f1 == pytest.approx(800 / 9)


def test_crossing_bracket():
    # Words a b c d, no punctuation.
    # gold: S[0,4) NP[0,2) VP[2,4) NP[3,4)
    # test: S[0,4) NP[1,3) (crosses both NP[0,2) and VP[2,4)) VP[3,4) NP[3,4)
    # matched: S[0,4), NP[3,4) = 2 of 4 each way: P = R = F = 50.
    gold = T("(S (NP (DT a) (NN b)) (VP (VBD c) (NP (NN d))))")
    test = T("(S (DT a) (NP (NN b) (VBD c)) (VP (NP (NN d))))")
    sentence = score_sentence(gold, test)
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (2, 4, 4)
    assert sentence.f1 == pytest.approx(50.0)


def test_punctuation_at_a_constituent_boundary_is_deleted():
    # gold: S[0,3) NP[0,1) VP[1,2) over John ran . ; test attaches the period inside VP[1,3).
    # Deleting the period (gold tag ".") maps position 3 -> 2: gold S[0,2) NP[0,1) VP[1,2),
    # test S[0,2) NP[0,1) VP[1,2). Full match 3/3, although the raw spans of VP differ.
    gold = T("(S (NP (NNP John)) (VP (VBD ran)) (. .))")
    test = T("(S (NP (NNP John)) (VP (VBD ran) (. .)))")
    sentence = score_sentence(gold, test)
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (3, 3, 3)
    assert sentence.exact_match
    # The gold tags decide: a test tree that mistags the period as NN scores the same.
    mistagged = T("(S (NP (NNP John)) (VP (VBD ran) (NN .)))")
    assert score_sentence(gold, mistagged).exact_match


def test_advp_and_prt_count_as_the_same_label():
    # gold S[0,3) NP[0,1) VP[1,3) PRT[2,3); test has ADVP[2,3): 4/4.
    gold = T("(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))")
    test = T("(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))")
    assert score_sentence(gold, test).matched == 4
    assert score_sentence(test, gold).exact_match


def test_unary_chain_duplicates_count_with_multiplicity():
    # gold S[0,1) VP[0,1) VP[0,1) = 3 brackets, two of them the same.
    gold = T("(S (VP (VP (VB go))))")
    # test S[0,1) VP[0,1): matched min(1,1) + min(2,1) = 2. P = 100, R = 2/3.
    fewer = score_sentence(gold, T("(S (VP (VB go)))"))
    assert (fewer.matched, fewer.gold_brackets, fewer.test_brackets) == (2, 3, 2)
    assert fewer.recall == pytest.approx(200 / 3)
    assert fewer.precision == 100.0
    # test S VP VP VP: matched 1 + min(2,3) = 3. P = 3/4 = 75, R = 100.
    more = score_sentence(gold, T("(S (VP (VP (VP (VB go)))))"))
    assert (more.matched, more.gold_brackets, more.test_brackets) == (3, 3, 4)
    assert more.precision == pytest.approx(75.0)
    assert more.recall == 100.0


def test_bracket_covering_only_punctuation_is_dropped():
    # X[2,3) covers the period alone; after deletion it is X[2,2), empty: not a bracket.
    gold = T("(S (NP (NNP John)) (VP (VBD ran)) (. .))")
    test = T("(S (NP (NNP John)) (VP (VBD ran)) (X (. .)))")
    sentence = score_sentence(gold, test)
    assert (sentence.matched, sentence.gold_brackets, sentence.test_brackets) == (3, 3, 3)
    # The same on the gold side: the quotes-only PRN is not counted.
    quoted = T("(S (PRN (`` ``)) (NP (NNP John)) (VP (VBD ran)) ('' ''))")
    gold_brackets, _, _ = brackets(quoted, quoted)
    assert gold_brackets == Counter({("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1})


def test_traces_function_tags_and_root_wrappers():
    # Raw PTB gold: the outer "( )" and TOP are not brackets, -NONE- is not a word, NP-SBJ
    # over the trace alone covers nothing, NP-SBJ-1 is NP. gold S[0,2) NP[0,1) VP[1,2).
    gold = T("( (S (NP-SBJ (-NONE- *)) (NP-SBJ-1 (NNS Dogs)) (VP (VBP bark))) )")
    test = T("(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))")
    gold_brackets, test_brackets, length = brackets(gold, test)
    assert (
        gold_brackets
        == test_brackets
        == Counter({("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1})
    )
    assert length == 2


def test_corpus_score_is_a_micro_average():
    # Sentence 1: GOLD against itself, 5/5/5, F = 100.
    # Sentence 2 (x y): gold S[0,2) NP[0,1) VP[1,2); test S[0,2) VP[0,1) NP[1,2):
    #   matched 1 of 3 each way, F = 33.33.
    # Mean of sentence F1s: (100 + 33.33) / 2 = 66.67.
    # Micro: matched 6, gold 8, test 8 -> P = R = F = 75.
    gold2 = T("(S (NP (NN x)) (VP (VB y)))")
    test2 = T("(S (VP (NN x)) (NP (VB y)))")
    scores = score_trees([GOLD, gold2], [GOLD, test2])
    assert [s.f1 for s in scores.sentences] == pytest.approx([100.0, 100 / 3])
    assert (scores.matched, scores.gold_brackets, scores.test_brackets) == (6, 8, 8)
    assert scores.f1 == pytest.approx(75.0)
    assert scores.f1 != pytest.approx(sum(s.f1 for s in scores.sentences) / 2)
    assert scores.exact_match == 50.0
    assert [s.index for s in scores.sentences] == [0, 1]


def test_length_mismatch_names_the_sentence():
    short = T("(S (NP (NNP John)) (VP (VBD ran)))")
    with pytest.raises(
        DataError, match=r"sentence 1: length unmatch: gold has 7 words, test has 2"
    ):
        score_trees([GOLD, GOLD], [GOLD, short])
    with pytest.raises(DataError, match="2 gold trees but 1 test trees"):
        score_trees([GOLD, GOLD], [GOLD])


def test_format_looks_like_evalb_summary():
    gold2 = T("(S (NP (NN x)) (VP (VB y)))")
    test2 = T("(S (VP (NN x)) (NP (VB y)))")
    text = score_trees([GOLD, gold2], [GOLD, test2]).format()
    assert text.splitlines() == [
        "=== Summary ===",
        "",
        "-- All --",
        "Number of sentence        =      2",
        "Bracketing Recall         =  75.00",
        "Bracketing Precision      =  75.00",
        "Bracketing FMeasure       =  75.00",
        "Complete match            =  50.00",
    ]


def test_empty_corpus_scores_zero():
    scores = score_trees([], [])
    assert (scores.num_sentences, scores.f1, scores.exact_match) == (0, 0.0, 0.0)


def test_raw_sample_scores_100_against_its_preprocessed_self(ptb_sample_dir):
    """EVALB's own cleanup (traces, function tags, root wrapper) agrees with preprocess."""
    raw = read_treebank(ptb_sample_dir, 1, 179)
    scores = score_trees(raw, [preprocess(tree) for tree in raw])
    assert scores.f1 == scores.exact_match == 100.0
    assert scores.gold_brackets > 10 * len(raw)
