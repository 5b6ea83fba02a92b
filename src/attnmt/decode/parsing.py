"""Parsing with a trained words → linearized-tree model (§6.3): the model's output for each
sentence becomes a well-formed tree over exactly its words (attnmt.data.treebank repairs
what the decoder gets wrong), written as one PTB bracketing per line and scored with
EVALB's conventions."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from attnmt.data.parsing import treebank_trees
from attnmt.data.treebank import Tree, delinearize, escape_word, to_bracketed, words
from attnmt.decode.config import DecodeConfig
from attnmt.decode.translate import Translator
from attnmt.decode.tree_grammar import TreeGrammar
from attnmt.evaluate.parse_f1 import ParseScores, score_trees
from attnmt.storage import Path
from attnmt.workdir import LoadedRun


def parsing_translator(run: LoadedRun, decode: DecodeConfig) -> Translator:
    """A Translator for `run` that, with decode.tree_grammar, writes only trees over the
    input's words (when the run's vocabulary keeps tree tokens whole; older ones cannot)."""
    grammar = None
    if decode.tree_grammar and hasattr(run.tokenizer, "whole_words"):
        grammar = TreeGrammar.from_symbols(
            run.tokenizer.whole_words(),
            run.experiment.model.vocab_size,
            copy_words=run.experiment.data.treebank_leaves == "words",
        )
    return Translator([run.experiment.model], [run.params], run.tokenizer, decode, grammar=grammar)


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


@dataclasses.dataclass(frozen=True)
class ParseSplitScores:
    split: str
    seconds: float
    scores: ParseScores
    trees_path: Path

    def scalars(self) -> dict[str, float]:
        s = self.scores
        return {"f1": s.f1, "precision": s.precision, "recall": s.recall, "exact": s.exact_match}

    def format(self) -> str:
        return (
            f"{self.split}: {self.scores.num_sentences} sentences parsed in {self.seconds:.1f} s\n"
            f"{self.scores.format()}\n  trees: {self.trees_path}"
        )


def evaluate_parse_split(
    run: LoadedRun, split: str, decode: DecodeConfig, output_dir: Path
) -> ParseSplitScores:
    """Parses the gold trees' sentences of `split` and scores the trees against them."""
    data = run.experiment.data
    gold = treebank_trees(split, data.data_dir, data.treebank_splits)
    translator = parsing_translator(run, decode)
    start = time.monotonic()
    parsed = parse_sentences(
        translator,
        [" ".join(words(tree)) for tree in gold],
        data.treebank_pos,
        data.treebank_leaves,
    )
    seconds = time.monotonic() - start
    trees = [tree for tree in parsed if tree is not None]
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / f"{split}-step{run.step}-beam{decode.beam_size}.trees"
    path.write_text("\n".join(bracketed_lines(trees)) + "\n", encoding="utf-8")
    return ParseSplitScores(split, seconds, score_trees(gold, trees), path)
