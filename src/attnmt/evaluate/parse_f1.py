"""Labelled bracket precision / recall / F1 exactly as EVALB scores them with ``COLLINS.prm``.

The Transformer paper (§6.3) reports WSJ section-23 F1 from EVALB (Sekine & Collins 1997,
the bug-fixed 2006 version), so the numbers here are EVALB's, conventions included, even
where they are odd; tests compile EVALB's C source and compare the two on the whole WSJ
sample and on perturbed parses. What EVALB does with ``COLLINS.prm``, tree by tree:

* Preterminals (POS tag + word) are words, not brackets. A word whose *own* tag is in
  ``DELETE_LABEL`` (``-NONE-``, ``TOP`` and the punctuation tags ``, : `` '' .``) is removed
  from that tree, so the gold tree's tags decide for the gold tree and the test tree's for
  the test tree: a test tree that tags a period ``NN`` keeps one word more than the gold
  tree and the sentence is an *error* ("length unmatch"), left out of every total.
* Every other bracket is a span over the words kept. A bracket left covering no word is
  dropped; its label is cut at the first ``-`` or ``=`` (``NP-SBJ-1`` → ``NP``; ``-LRB-``
  → the empty label), and brackets whose cut label is in ``DELETE_LABEL`` are dropped
  (``TOP``; a constituent labelled ``,``). PTB's unlabelled outer bracket ``( (S ...) )``
  is *not* dropped: its empty label is counted as a bracket over the whole sentence, and a
  test tree without it misses one bracket (the raw sample against its preprocessed self:
  recall 94.94, F1 97.41). ``ROOT`` is counted too; only ``TOP`` is not.
* Brackets are compared as multisets of (label, start, end), ``PRT`` equal to ``ADVP``
  (``EQ_LABEL ADVP PRT``): a unary chain ``(NP (NP ...))`` gives two brackets, and a test
  tree with only one of them matches one (recall 1/2).
* A sentence whose test tree keeps no word is *skipped*; one whose trees keep different
  numbers of words, or different words, is an *error*. Neither enters the bracket totals or
  the complete-match rate (whose denominator is the valid sentences).
* Corpus scores are micro averages of the summed counts (EVALB's summary), with
  ``100.0 * matched / total`` and ``2 * P * R / (P + R)`` in double precision as EVALB
  computes them, so the printed figures agree to the last digit. The ``-- len<=40 --``
  block takes the sentences whose gold tree has at most 40 words without ``-NONE-``
  (punctuation included), errors and skips included in its sentence count.

Where attnmt differs from the C program: F1 is 0.00 where nothing matched (EVALB prints
``nan`` for 0/0); all sentences are scored (EVALB stops after ``MAX_ERROR`` = 10 errors, and
its fixed arrays hold at most 200 words and 200 brackets a sentence and 5,000 characters a
line); and gold and test lists of different lengths raise an error instead of scoring the
common prefix.

No jax here: this runs on trees, e.g. those :func:`attnmt.data.treebank.delinearize` builds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from attnmt.data.treebank import EMPTY_ELEMENT, Tree, escape_word
from attnmt.errors import DataError

__all__ = [
    "CUTOFF_LENGTH",
    "DELETED_LABELS",
    "EQUIVALENT_LABELS",
    "ERROR",
    "SKIP",
    "VALID",
    "ParseScores",
    "SentenceScore",
    "brackets",
    "evalb_label",
    "score_sentence",
    "score_trees",
]

# COLLINS.prm: DELETE_LABEL (words with these tags, brackets with these cut labels),
# DELETE_LABEL_FOR_LENGTH, EQ_LABEL and CUTOFF_LEN.
DELETED_LABELS = frozenset({"TOP", EMPTY_ELEMENT, ",", ":", "``", "''", "."})
LENGTH_DELETED_LABELS = frozenset({EMPTY_ELEMENT})
EQUIVALENT_LABELS = {"PRT": "ADVP"}
CUTOFF_LENGTH = 40

# A sentence's status, EVALB's "Stat." column.
VALID, ERROR, SKIP = 0, 1, 2

Bracket = tuple[str, int, int]


def _percent(part: int, whole: int) -> float:
    """EVALB's ``100.0 * part / whole``, 0.00 where the denominator is zero."""
    return 100.0 * part / whole if whole else 0.0


def _f_measure(precision: float, recall: float) -> float:
    """EVALB's ``2 * p * r / (p + r)``; 0 where p + r is 0 (EVALB prints nan)."""
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def evalb_label(label: str) -> str:
    """A bracket label as EVALB compares it: cut at the first ``-`` or ``=`` (anywhere,
    position 0 included), and ``PRT`` as ``ADVP``."""
    for position, char in enumerate(label):
        if char in "-=":
            label = label[:position]
            break
    return EQUIVALENT_LABELS.get(label, label)


@dataclass(frozen=True)
class _Read:
    """What EVALB reads from one tree: the words kept (escaped as written to a file), the
    brackets with raw labels over their positions, and the length without -NONE-."""

    words: tuple[str, ...]
    spans: tuple[tuple[str, int, int], ...]
    length: int


def _read(tree: Tree) -> _Read:
    """Iterative pre-order walk (deep repaired trees do not hit the recursion limit)."""
    kept: list[str] = []
    spans: list[tuple[str, int, int]] = []
    length = 0
    open_brackets: list[tuple[str, int]] = []
    stack: list[Tree | None] = [tree]
    while stack:
        node = stack.pop()
        if node is None:  # the close of the innermost open bracket
            label, start = open_brackets.pop()
            spans.append((label, start, len(kept)))
        elif node.is_preterminal:
            length += node.label not in LENGTH_DELETED_LABELS
            if node.label not in DELETED_LABELS:
                kept.append(escape_word(node.word or ""))
        else:
            open_brackets.append((node.label, len(kept)))
            stack.append(None)
            stack.extend(reversed(node.children))
    return _Read(tuple(kept), tuple(spans), length)


def _counted(spans: Sequence[tuple[str, int, int]]) -> Counter[Bracket]:
    counted: Counter[Bracket] = Counter()
    for raw_label, start, end in spans:
        if start == end:
            continue
        cut = evalb_label(raw_label)
        if cut not in DELETED_LABELS:
            counted[(cut, start, end)] += 1
    return counted


def _compare(gold: _Read, test: _Read) -> tuple[int, str]:
    """EVALB's status for the pair and, unless valid, why."""
    if not test.words:
        return SKIP, "skip: the test tree has no words after deletion"
    if len(gold.words) != len(test.words):
        return ERROR, f"length unmatch ({len(gold.words)}|{len(test.words)})"
    for gold_word, test_word in zip(gold.words, test.words, strict=True):
        if gold_word != test_word:
            return ERROR, f"words unmatch ({gold_word}|{test_word})"
    return VALID, ""


def brackets(gold: Tree, test: Tree) -> tuple[Counter[Bracket], Counter[Bracket], int]:
    """The gold and test bracket multisets EVALB compares, and the gold length (words
    without -NONE-, punctuation included, as EVALB's "Len." column).

    Raises DataError when EVALB would not score the pair (its error and skip sentences).
    """
    gold_read, test_read = _read(gold), _read(test)
    status, message = _compare(gold_read, test_read)
    if status != VALID:
        raise DataError(message)
    return _counted(gold_read.spans), _counted(test_read.spans), gold_read.length


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
    """One sentence's counts (all 0 unless ``status`` is VALID); ``length`` counts the gold
    words without -NONE- (punctuation included); ``message`` says why an error or skip."""

    index: int
    length: int
    gold_brackets: int
    test_brackets: int
    matched: int
    status: int = VALID
    message: str = ""

    @property
    def exact_match(self) -> bool:
        return self.status == VALID and self.matched == self.gold_brackets == self.test_brackets


@dataclass(frozen=True)
class ParseScores(_BracketRates):
    """Per-sentence counts and the corpus summary computed from their sums (percentages)."""

    sentences: tuple[SentenceScore, ...]

    def _valid(self) -> list[SentenceScore]:
        return [s for s in self.sentences if s.status == VALID]

    @property
    def num_sentences(self) -> int:
        return len(self.sentences)

    @property
    def num_errors(self) -> int:
        return sum(s.status == ERROR for s in self.sentences)

    @property
    def num_skipped(self) -> int:
        return sum(s.status == SKIP for s in self.sentences)

    @property
    def num_valid(self) -> int:
        return self.num_sentences - self.num_errors - self.num_skipped

    @property
    def matched(self) -> int:
        return sum(s.matched for s in self._valid())

    @property
    def gold_brackets(self) -> int:
        return sum(s.gold_brackets for s in self._valid())

    @property
    def test_brackets(self) -> int:
        return sum(s.test_brackets for s in self._valid())

    @property
    def exact_match(self) -> float:
        """Complete matches as a percentage of the valid sentences (EVALB's denominator)."""
        return _percent(sum(s.exact_match for s in self.sentences), self.num_valid)

    def up_to(self, length: int = CUTOFF_LENGTH) -> ParseScores:
        """The sentences whose gold length is at most ``length`` (EVALB's len<=40 block)."""
        return ParseScores(tuple(s for s in self.sentences if s.length <= length))

    def _block(self) -> list[str]:
        rows = [
            ("Number of sentence", f"{self.num_sentences:6d}"),
            ("Number of Error sentence", f"{self.num_errors:6d}"),
            ("Number of Skip  sentence", f"{self.num_skipped:6d}"),
            ("Number of Valid sentence", f"{self.num_valid:6d}"),
            ("Bracketing Recall", f"{self.recall:6.2f}"),
            ("Bracketing Precision", f"{self.precision:6.2f}"),
            ("Bracketing FMeasure", f"{self.f1:6.2f}"),
            ("Complete match", f"{self.exact_match:6.2f}"),
        ]
        return [f"{name:<26}= {value}" for name, value in rows]

    def format(self) -> str:
        """A summary laid out like EVALB's (its ``-- All --`` and ``-- len<=40 --`` blocks,
        without the crossing-bracket and tagging lines)."""
        lines = ["=== Summary ===", "", "-- All --", *self._block()]
        lines += ["", f"-- len<={CUTOFF_LENGTH} --", *self.up_to(CUTOFF_LENGTH)._block()]
        return "\n".join(lines)


def score_sentence(gold: Tree, test: Tree, index: int = 0) -> SentenceScore:
    """Counts for one sentence; ``index`` names it in the result. An error or skip sentence
    (see the module docstring) has status ERROR or SKIP, zero counts and a message."""
    gold_read, test_read = _read(gold), _read(test)
    status, message = _compare(gold_read, test_read)
    if status != VALID:
        return SentenceScore(
            index, gold_read.length, 0, 0, 0, status, f"sentence {index}: {message}"
        )
    gold_brackets, test_brackets = _counted(gold_read.spans), _counted(test_read.spans)
    return SentenceScore(
        index=index,
        length=gold_read.length,
        gold_brackets=sum(gold_brackets.values()),
        test_brackets=sum(test_brackets.values()),
        matched=sum((gold_brackets & test_brackets).values()),
    )


def score_trees(gold: Sequence[Tree], test: Sequence[Tree]) -> ParseScores:
    """EVALB's scores of ``test`` parses against ``gold`` trees, sentence by sentence.

    Sentence indices are 0-based positions in the lists. Error and skip sentences are
    counted (``num_errors``, ``num_skipped``) and left out of the totals, as EVALB does.
    Raises DataError when the lists differ in length.
    """
    if len(gold) != len(test):
        raise DataError(f"{len(gold)} gold trees but {len(test)} test trees")
    pairs = enumerate(zip(gold, test, strict=True))
    return ParseScores(tuple(score_sentence(g, t, index) for index, (g, t) in pairs))
