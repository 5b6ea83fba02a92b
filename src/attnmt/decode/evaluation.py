"""Translate a held-out split and score it: sacreBLEU, the paper's tokenized BLEU and, for
Multi30K, the lowercased-tokenized convention. Writes hypotheses; logs to TensorBoard."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from attnmt.config.decode import DecodeConfig
from attnmt.config.experiment import Experiment
from attnmt.data.prepare import load_split
from attnmt.decode.sharded import writes_outputs
from attnmt.decode.translate import Translator
from attnmt.evaluate.bleu import (
    BleuResult,
    multi30k_bleu,
    multi30k_tokenize,
    sacre_bleu,
    tokenized_bleu,
)
from attnmt.storage import Path
from attnmt.workdir import LoadedRun


@dataclasses.dataclass(frozen=True)
class SplitScores:
    split: str
    sentences: int
    seconds: float
    sacrebleu: BleuResult
    tokenized: BleuResult
    multi30k: BleuResult | None
    hypotheses_path: Path
    # False for a run trained on lowercased tokens (data.text_form): its sacreBLEU, which
    # is cased, is low by construction.
    cased: bool = True

    def scalars(self) -> dict[str, float]:
        values = {
            "sacrebleu": self.sacrebleu.score,
            "tokenized_bleu": self.tokenized.score,
            "sentences_per_second": self.sentences / max(self.seconds, 1e-9),
        }
        if self.multi30k is not None:
            values["multi30k_bleu"] = self.multi30k.score
        return values

    def format(self) -> str:
        lines = [
            f"{self.split}: {self.sentences} sentences in {self.seconds:.1f} s "
            f"({self.sentences / max(self.seconds, 1e-9):.1f} sentences/s)",
            f"  sacreBLEU       {self.sacrebleu.score:6.2f}  {self.sacrebleu.signature}"
            + ("" if self.cased else "  (cased: this run writes lowercase)"),
            f"  tokenized BLEU  {self.tokenized.score:6.2f}  {self.tokenized.signature}",
        ]
        if self.multi30k is not None:
            lines.append(f"  Multi30K BLEU   {self.multi30k.score:6.2f}  {self.multi30k.signature}")
        lines.append(f"  hypotheses: {self.hypotheses_path}")
        return "\n".join(lines)


def ranked_bleu(experiment: Experiment) -> str:
    """The score train.keep_best_by="bleu" ranks: sacreBLEU, or Multi30K BLEU for a run
    trained on lowercased tokens (data.text_form), whose cased sacreBLEU says little."""
    return "sacrebleu" if experiment.data.text_form == "raw" else "multi30k_bleu"


def scores_multi30k_bleu(experiment: Experiment) -> bool:
    """Whether `score` adds Multi30K BLEU: for Multi30K data, and for a run trained on
    lowercased tokens (data.text_form) on any data."""
    return experiment.data.source == "multi30k" or experiment.data.text_form != "raw"


def score(
    experiment: Experiment, hypotheses: list[str], references: list[str]
) -> tuple[BleuResult, BleuResult, BleuResult | None]:
    lang = experiment.data.tgt_lang
    sacre = sacre_bleu(hypotheses, references)
    tokenized = tokenized_bleu(hypotheses, references, lang=lang)
    m30k = None
    if scores_multi30k_bleu(experiment):
        # The official tok/*.lc.norm.tok.* references are exactly this preprocessing of
        # the raw references (checked in tests), so downloaded data scores the same way.
        m30k = multi30k_bleu(hypotheses, multi30k_tokenize(references, lang=lang), lang=lang)
    return sacre, tokenized, m30k


def _mbr_choice(decode: DecodeConfig) -> tuple[Any, ...]:
    """The minimum-Bayes-risk choice decode makes: its weights matter only when it is on,
    how its samples are drawn only when it draws some."""
    if not decode.mbr:
        return ("", "", 0)
    if not decode.mbr_samples:
        return (decode.mbr, decode.mbr_weights, 0)
    return (decode.mbr, decode.mbr_weights, decode.mbr_samples, *_sampling(decode))


def _sampling(decode: DecodeConfig) -> tuple[Any, ...]:
    return (
        decode.mbr_sample_share,
        decode.temperature,
        decode.top_k,
        decode.top_p,
        decode.epsilon,
        decode.seed,
    )


def _samples_variant(decode: DecodeConfig) -> str:
    """`-s{S}`, then each way the samples are drawn that differs from the defaults."""
    defaults = DecodeConfig()
    names = ("share", "temp", "topk", "topp", "eps", "seed")
    return f"-s{decode.mbr_samples}" + "".join(
        f"-{name}{value:g}"
        for name, value, default in zip(names, _sampling(decode), _sampling(defaults), strict=True)
        if value != default
    )


def decodes_stem(split: str, run: LoadedRun, decode: DecodeConfig, tag: str = "") -> str:
    """`{split}-step{N}{tag}-beam{B}`, with `-alpha{α}` when α is not the run's own, then
    `-cov{β}` when the coverage penalty is not (and
    `-unsmoothed` / `-smoothed` when decode.unsmooth_words is not), so that a sweep keeps
    every sweep point's decodes instead of overwriting one file; `-mbr{utility}` (and
    `-uniform`, `-s{samples}` and how they are drawn where not the defaults, e.g.
    `-s16-eps0.02`) when the minimum-Bayes-risk choice is not the run's own, `-nombr` when
    the run's own is switched off."""
    own = run.experiment.decode
    variant = "" if decode.alpha == own.alpha else f"-alpha{decode.alpha:g}"
    if decode.coverage_penalty != own.coverage_penalty:
        variant += f"-cov{decode.coverage_penalty:g}"
    if decode.unsmooth_words != own.unsmooth_words:
        variant += "-unsmoothed" if decode.unsmooth_words else "-smoothed"
    if _mbr_choice(decode) != _mbr_choice(own):
        utility, weights, samples = _mbr_choice(decode)[:3]
        variant += f"-mbr{utility}" if utility else "-nombr"
        variant += "-uniform" if weights == "uniform" else ""
        variant += _samples_variant(decode) if samples else ""
    return f"{split}-step{run.step}{tag}-beam{decode.beam_size}{variant}"


def evaluate_split(
    runs: list[LoadedRun], split: str, decode: DecodeConfig, output_dir: Path, tag: str = ""
) -> SplitScores:
    """Translates `split` with the run (an ensemble if several) and scores it.

    `tag` (e.g. "-avg5") names what was decoded when the step alone does not. Every process
    of a job decodes (its rows of each batch) and gets every score; process 0 alone writes
    the hypotheses.
    """
    main = runs[0]
    pairs = load_split(main.experiment.data, split, as_trained=False)
    sources = [src for src, _ in pairs]
    references = [tgt for _, tgt in pairs]
    translator = Translator.from_runs(runs, decode)
    start = time.monotonic()
    hypotheses = translator.translate(sources)
    seconds = time.monotonic() - start
    sacre, tokenized, m30k = score(main.experiment, hypotheses, references)
    path = output_dir / f"{decodes_stem(split, main, decode, tag)}.{main.experiment.data.tgt_lang}"
    if writes_outputs():
        output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    cased = main.experiment.data.text_form == "raw"
    return SplitScores(split, len(pairs), seconds, sacre, tokenized, m30k, path, cased)
