"""Labelled bracket precision / recall / F1 the way EVALB scores them with ``COLLINS.prm``.

The Transformer paper (§6.3) reports WSJ section-23 F1 from EVALB, so the numbers here follow
its conventions rather than inventing new ones:

* A bracket is ``(label, start, end)`` over word positions, counted as a multiset: a unary
  chain ``(NP (NP ...))`` gives two identical brackets, and a test tree with only one of them
  matches one (recall 1/2).
* Preterminals (POS tags) are not brackets. The tree's top constituent (e.g. ``S``) is one;
  brackets labelled ``TOP``, ``-NONE-`` or the empty label of PTB's outer ``( ... )`` are not
  (``DELETE_LABEL TOP``, ``DELETE_LABEL -NONE-``).
* Function tags are stripped (``NP-SBJ`` → ``NP``), and ``PRT`` counts as ``ADVP``
  (``EQ_LABEL ADVP PRT``).
* ``-NONE-`` leaves are not words (``DELETE_LABEL_FOR_LENGTH -NONE-``). Words whose *gold* tag is
  one of ``'' `` . : ,`` are removed from both trees before spans are taken (``DELETE_LABEL``
  for punctuation; the gold tags decide, as the bug-fixed EVALB does, so a mistagged comma in
  the test tree does not shift its spans). A bracket left covering no word is dropped.
* Corpus scores are micro averages of summed counts (EVALB's summary), not means of sentence
  scores; a sentence is a complete match when its gold and test bracket multisets are equal.

No jax here: this runs on trees, e.g. those :func:`attnmt.data.treebank.delinearize` builds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from attnmt.data.treebank import EMPTY_ELEMENT, Tree, strip_function_tags
from attnmt.errors import DataError

__all__ = [
    "EQUIVALENT_LABELS",
    "PUNCTUATION_TAGS",
    "ParseScores",
    "SentenceScore",
    "brackets",
    "score_sentence",
    "score_trees",
]

PUNCTUATION_TAGS = frozenset({"''", "``", ".", ":", ","})
UNCOUNTED_LABELS = frozenset({"", "TOP", EMPTY_ELEMENT})
EQUIVALENT_LABELS = {"PRT": "ADVP"}

Bracket = tuple[str, int, int]


def _percent(part: int, whole: int) -> float:
    """EVALB prints 0.00 where the denominator is zero."""
    return 100.0 * part / whole if whole else 0.0


def _f_measure(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


class _BracketRates:
    """Recall, precision and F1 (percentages) from bracket counts."""

    matched: int
    gold_brackets: int
    test_brackets: int

    @property
    def recall(self) -> float:
        return _percent(self.matched, self.gold_brackets)

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test_brackets)

    @property
    def f1(self) -> float:
        return _f_measure(self.precision, self.recall)


@dataclass(frozen=True)
class SentenceScore(_BracketRates):
    """One sentence's counts; ``length`` counts words without -NONE- (punctuation included)."""

    index: int
    length: int
    gold_brackets: int
    test_brackets: int
    matched: int

    @property
    def exact_match(self) -> bool:
        return self.matched == self.gold_brackets == self.test_brackets


@dataclass(frozen=True)
class ParseScores(_BracketRates):
    """Per-sentence counts and the corpus summary computed from their sums (percentages)."""

    sentences: tuple[SentenceScore, ...]

    @property
    def num_sentences(self) -> int:
        return len(self.sentences)

    @property
    def matched(self) -> int:
        return sum(s.matched for s in self.sentences)

    @property
    def gold_brackets(self) -> int:
        return sum(s.gold_brackets for s in self.sentences)

    @property
    def test_brackets(self) -> int:
        return sum(s.test_brackets for s in self.sentences)

    @property
    def exact_match(self) -> float:
        return _percent(sum(s.exact_match for s in self.sentences), self.num_sentences)

    def format(self) -> str:
        """A summary laid out like EVALB's ``-- All --`` block."""
        rows = [
            ("Number of sentence", f"{self.num_sentences:6d}"),
            ("Bracketing Recall", f"{self.recall:6.2f}"),
            ("Bracketing Precision", f"{self.precision:6.2f}"),
            ("Bracketing FMeasure", f"{self.f1:6.2f}"),
            ("Complete match", f"{self.exact_match:6.2f}"),
        ]
        lines = ["=== Summary ===", "", "-- All --"]
        lines += [f"{name:<26}= {value}" for name, value in rows]
        return "\n".join(lines)


def _spans(tree: Tree) -> tuple[list[Bracket], list[str]]:
    """Every constituent as (label, start, end) over word positions, and the words' tags.

    -NONE- leaves take no position, so constituents over traces alone get an empty span.
    Iterative post-order, so deep (repaired) trees do not hit the recursion limit.
    """
    spans: list[Bracket] = []
    word_tags: list[str] = []
    starts: list[int] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if node.is_preterminal:
            if node.label != EMPTY_ELEMENT:
                word_tags.append(node.label)
        elif children_done:
            spans.append((node.label, starts.pop(), len(word_tags)))
        else:
            starts.append(len(word_tags))
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
    return spans, word_tags


def _canonical_label(label: str) -> str:
    bare = strip_function_tags(label)
    return EQUIVALENT_LABELS.get(bare, bare)


def _counted(spans: list[Bracket], kept_before: list[int]) -> Counter[Bracket]:
    """Brackets re-indexed over the kept words; uncounted labels and empty spans dropped."""
    counted: Counter[Bracket] = Counter()
    for raw_label, start, end in spans:
        label = _canonical_label(raw_label)
        new_start, new_end = kept_before[start], kept_before[end]
        if new_start < new_end and label not in UNCOUNTED_LABELS:
            counted[(label, new_start, new_end)] += 1
    return counted


def _kept_before(gold_tags: Sequence[str]) -> list[int]:
    """kept_before[i] = how many non-punctuation words precede position i (len n + 1)."""
    counts = [0]
    for tag in gold_tags:
        counts.append(counts[-1] + (tag not in PUNCTUATION_TAGS))
    return counts


def brackets(gold: Tree, test: Tree) -> tuple[Counter[Bracket], Counter[Bracket], int]:
    """The gold and test bracket multisets EVALB compares, and the sentence length.

    Punctuation positions come from the gold tags. Raises DataError when the trees have
    different numbers of words (EVALB's "length unmatch").
    """
    gold_spans, gold_tags = _spans(gold)
    test_spans, test_tags = _spans(test)
    if len(gold_tags) != len(test_tags):
        raise DataError(
            f"length unmatch: gold has {len(gold_tags)} words, test has {len(test_tags)}"
        )
    kept_before = _kept_before(gold_tags)
    return _counted(gold_spans, kept_before), _counted(test_spans, kept_before), len(gold_tags)


def score_sentence(gold: Tree, test: Tree, index: int = 0) -> SentenceScore:
    """Counts for one sentence; ``index`` names it in errors and in the result."""
    try:
        gold_brackets, test_brackets, length = brackets(gold, test)
    except DataError as err:
        raise DataError(f"sentence {index}: {err}") from err
    return SentenceScore(
        index=index,
        length=length,
        gold_brackets=sum(gold_brackets.values()),
        test_brackets=sum(test_brackets.values()),
        matched=sum((gold_brackets & test_brackets).values()),
    )


def score_trees(gold: Sequence[Tree], test: Sequence[Tree]) -> ParseScores:
    """EVALB-style scores of ``test`` parses against ``gold`` trees, sentence by sentence.

    Sentence indices are 0-based positions in the lists. Raises DataError when the lists
    differ in length or a sentence's word counts differ, rather than skipping sentences
    silently (EVALB's error sentences), since a skipped sentence inflates the score.
    """
    if len(gold) != len(test):
        raise DataError(f"{len(gold)} gold trees but {len(test)} test trees")
    pairs = enumerate(zip(gold, test, strict=True))
    return ParseScores(tuple(score_sentence(g, t, index) for index, (g, t) in pairs))
