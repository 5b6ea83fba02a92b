"""What training measures on held-out data: loss, perplexity and accuracy over the whole
evaluation split, and beam-search BLEU (or a parsing run's F1) on (part of) it. Decoding is
called from here; nothing in decode/ knows about training."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from attnmt.data.treebank import Tree
from attnmt.decode.evaluation import score
from attnmt.decode.parsing import parse_and_score, parse_scalars
from attnmt.decode.translate import Translator
from attnmt.parallel.sharding import put_batch
from attnmt.train import step as steps
from attnmt.train.inputs import packing_options
from attnmt.train.program import TrainProgram


@dataclasses.dataclass(frozen=True)
class Validation:
    program: TrainProgram
    split: TokenizedCorpus | None  # None: no loss evaluation (data.eval_split or eval_every)
    shapes: list[tuple[int, int]]  # bucket shapes of the evaluation split
    bleu_pairs: list[tuple[str, str]]  # (source, reference); empty: no BLEU
    translator: Translator  # with the tree grammar when parse_gold is set
    parse_gold: list[Tree] = dataclasses.field(default_factory=list)  # empty: no F1

    def loss(self, params: Any) -> dict[str, float]:
        """Loss, perplexity and accuracy of `params` on the whole split (no dropout)."""
        assert self.split is not None, "no evaluation split (data.eval_split)"
        batches = BatchIterator(
            self.split,
            self.shapes,
            seed=0,
            shuffle=False,
            repeat=False,
            shard_index=jax.process_index(),
            shard_count=jax.process_count(),
            **packing_options(self.program.experiment),
        )
        totals: dict[str, Any] = {}
        for batch in batches:
            sums = self.program.eval_step(params, put_batch(batch, self.program.mesh))
            totals = sums if not totals else {k: totals[k] + sums[k] for k in totals}
        summary = steps.summarize(totals)
        return {k: float(v) for k, v in jax.device_get(summary).items()}

    def bleu(self, params: Any) -> dict[str, float]:
        """Beam-search BLEU of `params` with the experiment's decode settings.

        Every process calls it alike: the translator gathers `params` from the training
        mesh's shards onto every device and splits the sentences over all of them
        (attnmt.decode.sharded), and every process gets every hypothesis and the scores."""
        self.translator.set_params([params])
        hypotheses = self.translator.translate([src for src, _ in self.bleu_pairs])
        references = [tgt for _, tgt in self.bleu_pairs]
        sacre, tokenized, m30k = score(self.program.experiment, hypotheses, references)
        scores = {"sacrebleu": sacre.score, "tokenized_bleu": tokenized.score}
        if m30k is not None:
            scores["multi30k_bleu"] = m30k.score
        return scores

    def f1(self, params: Any) -> dict[str, float]:
        """A parsing run's bracketing scores of `params` on the gold trees: parsed with the
        experiment's decode settings and scored as `attnmt evaluate` scores (EVALB's
        COLLINS.prm figures, the parses given the gold tags), by every process alike."""
        self.translator.set_params([params])
        parses = parse_and_score(self.translator, self.parse_gold, self.program.experiment.data)
        return parse_scalars(parses.scores)
