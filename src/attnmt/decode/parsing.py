"""Parsing with a trained words → linearized-tree model (§6.3): the model's output for each
sentence becomes a well-formed tree over exactly its words (attnmt.data.treebank repairs
what the decoder gets wrong), written as one PTB bracketing per line and scored as EVALB
(COLLINS.prm) scores it.

`attnmt evaluate` on a parsing run writes three files per split into <workdir>/decodes/,
one tree per line, line i for the split's i-th gold tree:

* ``{split}-step{N}-beam{B}.trees``: the parses as decoded, tagged as the model writes its
  leaves (``XX`` for data.treebank_pos=XX, the default; predicted tags for "").
* ``{split}-step{N}-beam{B}.tagged.trees``: the same parses with each word's tag replaced by
  its gold tag, the file that is scored. EVALB finds punctuation by each tree's own tags, so
  it rejects XX-tagged parses ("length unmatch") and would count a mistagged comma as a
  word; with the gold tags, only the brackets are scored (the XX model predicts no tags).
* ``{split}-step{N}-beam{B}.gold.trees``: the gold trees (preprocessed as for training).

``-alpha{α}`` follows B in all three names when α is not the run's own (`--alpha`), then
``-unsmoothed`` (or ``-smoothed``) when decode.unsmooth_words is not.
``evalb -p COLLINS.prm <...>.gold.trees <...>.tagged.trees`` gives the printed scores."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from attnmt.config.data import DataConfig
from attnmt.config.decode import DecodeConfig
from attnmt.config.experiment import Experiment
from attnmt.data.parsing import treebank_trees
from attnmt.data.tokenizer import Tokenizer
from attnmt.data.treebank import (
    Tree,
    delinearize,
    escape_word,
    retag,
    tags,
    to_bracketed,
    words,
)
from attnmt.decode.evaluation import decodes_stem
from attnmt.decode.sharded import writes_outputs
from attnmt.decode.translate import Translator
from attnmt.decode.tree_grammar import TreeGrammar
from attnmt.evaluate.parse_f1 import ParseScores, score_trees
from attnmt.storage import Path
from attnmt.workdir import LoadedRun


def tree_grammar(
    experiment: Experiment, tokenizer: Tokenizer, decode: DecodeConfig
) -> TreeGrammar | None:
    """With decode.tree_grammar, the grammar that lets the decoder write only trees over the
    input's words (when the vocabulary keeps tree tokens whole; older ones cannot)."""
    if not decode.tree_grammar or not hasattr(tokenizer, "whole_words"):
        return None
    return TreeGrammar.from_symbols(
        tokenizer.whole_words(),
        experiment.model.vocab_size,
        copy_words=experiment.data.treebank_leaves == "words",
        label_smoothing=experiment.train.label_smoothing if decode.unsmooth_words else 0.0,
    )


def parsing_translator(run: LoadedRun, decode: DecodeConfig) -> Translator:
    """A Translator for `run` that writes only well-formed trees (`tree_grammar`)."""
    grammar = tree_grammar(run.experiment, run.tokenizer, decode)
    return Translator.from_runs([run], decode, grammar=grammar)


def parse_sentences(
    translator: Translator, sentences: Sequence[str], pos: str, leaves: str = "pos"
) -> list[Tree | None]:
    """A tree per sentence (words split on whitespace); None for an empty sentence. `pos`
    and `leaves` are the run's data.treebank_pos and data.treebank_leaves."""
    # Parentheses in words are escaped as in training, so no word reads as a bracket.
    lines = [" ".join(escape_word(word) for word in s.split()) for s in sentences]
    outputs = translator.translate(lines)
    trees: list[Tree | None] = []
    for sentence, output in zip(sentences, outputs, strict=True):
        tokens = sentence.split()
        tree = delinearize(output.split(), tokens, pos or None, leaves=leaves) if tokens else None
        trees.append(tree)
    return trees


def bracketed_lines(trees: Sequence[Tree | None]) -> list[str]:
    """One line per tree; an empty sentence gives an empty line."""
    return ["" if tree is None else to_bracketed(tree) for tree in trees]


def parse_scalars(s: ParseScores) -> dict[str, float]:
    """The figures logged to TensorBoard for a parsing split (evaluate and training)."""
    return {"f1": s.f1, "precision": s.precision, "recall": s.recall, "exact": s.exact_match}


@dataclasses.dataclass(frozen=True)
class ParseSplitScores:
    split: str
    seconds: float
    scores: ParseScores
    trees_path: Path
    tagged_path: Path
    gold_path: Path

    def scalars(self) -> dict[str, float]:
        return parse_scalars(self.scores)

    def format(self) -> str:
        return (
            f"{self.split}: {self.scores.num_sentences} sentences parsed in {self.seconds:.1f} s\n"
            f"{self.scores.format()}\n"
            f"  trees (as decoded): {self.trees_path}\n"
            f"  scored (gold tags): {self.tagged_path}\n"
            f"  gold:               {self.gold_path}\n"
            f"  the same scores:    evalb -p COLLINS.prm {self.gold_path} {self.tagged_path}"
        )


@dataclasses.dataclass(frozen=True)
class ScoredParses:
    trees: list[Tree]  # as decoded, tagged as the model writes its leaves
    tagged: list[Tree]  # the same with each word's gold tag: what is scored
    scores: ParseScores


def parse_and_score(translator: Translator, gold: Sequence[Tree], data: DataConfig) -> ScoredParses:
    """Parses the sentences of the `gold` trees and scores the parses, with the gold tags,
    against them (the scores `attnmt evaluate` prints, and EVALB gives for its files)."""
    parsed = parse_sentences(
        translator,
        [" ".join(words(tree)) for tree in gold],
        data.treebank_pos,
        data.treebank_leaves,
    )
    # A gold tree always has a word (preprocess refuses one of -NONE- elements alone), so
    # every sentence has a parse, over exactly its words.
    trees = [tree for tree in parsed if tree is not None]
    tagged = [retag(tree, tags(gold_tree)) for tree, gold_tree in zip(trees, gold, strict=True)]
    return ScoredParses(trees, tagged, score_trees(gold, tagged))


def _write_trees(path: Path, trees: Sequence[Tree]) -> None:
    path.write_text("".join(line + "\n" for line in bracketed_lines(trees)), encoding="utf-8")


def evaluate_parse_split(
    run: LoadedRun, split: str, decode: DecodeConfig, output_dir: Path, tag: str = ""
) -> ParseSplitScores:
    """Parses the gold trees' sentences of `split`, writes the parses, the parses with the
    gold tags and the gold trees (see the module docstring), and scores the gold-tagged
    parses against the gold trees. `tag` (e.g. "-ema") names what was decoded when the
    step alone does not."""
    data = run.experiment.data
    gold = treebank_trees(split, data.data_dir, data.treebank_splits)
    translator = parsing_translator(run, decode)
    start = time.monotonic()
    parses = parse_and_score(translator, gold, data)
    seconds = time.monotonic() - start
    stem = decodes_stem(split, run, decode, tag)
    paths = [
        output_dir / f"{stem}{suffix}" for suffix in (".trees", ".tagged.trees", ".gold.trees")
    ]
    if writes_outputs():  # every process of a job parses; process 0 writes
        output_dir.mkdir(parents=True, exist_ok=True)
        for path, written in zip(paths, (parses.trees, parses.tagged, gold), strict=True):
            _write_trees(path, written)
    return ParseSplitScores(split, seconds, parses.scores, *paths)
