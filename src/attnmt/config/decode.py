"""Typed configuration of decoding (the `decode` section of a config file)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnmt.config.typed import check_types
from attnmt.config.xla import OptimizationLevel
from attnmt.errors import ConfigError

# "" decodes in the model's own compute dtype (model.dtype, as trained).
DecodeDType = Literal["", "float32", "bfloat16"]
# Minimum Bayes-risk choice among the beam's hypotheses (attnmt.decode.mbr): its
# sentence-level utility ("" = the beam's best) and how the candidates are weighted.
MbrUtility = Literal["", "bleu", "chrf"]
MbrWeights = Literal["model", "uniform"]


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 4  # §6.1
    alpha: float = 0.6  # GNMT length penalty ((5 + |Y|) / 6)^α
    max_len_offset: int = 50  # maximum output length = input length + offset (§6.1)
    # β of GNMT's coverage penalty, β Σ_i log min(Σ_j p_ij, 1) added to a finished
    # hypothesis's score, p_ij the last decoder layer's head-averaged attention of output
    # token j on source token i (attnmt.decode.coverage). Beam search only; 0 = off.
    coverage_penalty: float = 0.0
    batch_sentences: int = 64
    # Share of the device's memory (on a CPU the host's, which its devices share) one
    # batch's search may hold, read from XLA's analysis of the compiled search on the
    # longest inputs: a batch that needs more decodes fewer sentences at a time (a beam-21
    # parser batch of 64 long sentences holds ≈11 GiB). 0 = no check.
    memory_fraction: float = 0.5
    # Self-attention caches start with room for this many output positions and double
    # when a batch needs more (0 = room for the longest output from the start): steps then
    # attend over, and beam search reorders, about as many slots as are filled.
    initial_cache_length: int = 16
    # XLA backend (LLVM) optimisation level of the search, 0-3; -1 = XLA's own. Lower
    # levels shorten the compile of every bucket shape.
    xla_backend_optimization_level: OptimizationLevel = -1
    # Sampling instead of search: each output token drawn from softmax(logits / temperature),
    # restricted to the top_k most likely (0 = all), then to the top_p nucleus (the fewest
    # most likely tokens whose probability reaches top_p; 1 = all), then to the tokens of
    # probability ≥ epsilon (epsilon sampling; 0 = all, the most likely always kept). Line
    # i of an input is drawn from fold_in(PRNGKey(seed), i), so a seed gives the same
    # samples whatever the batching.
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    seed: int = 0
    # Parsing runs: greedy and beam search may only write well-formed trees with one leaf
    # per input word (attnmt.decode.tree_grammar); false leaves it all to the repair.
    tree_grammar: bool = True
    # Parsing runs with the words as leaves: score under the copying grammar with the
    # label smoothing taken back out of the model's probabilities, p ↦ (p - ε/K) / (1 - ε)
    # (train.label_smoothing ε over K pieces, the target the model was fit to). Summed over
    # every word piece, the smoothing alone gives "a word here" about ε of probability at
    # every position, brackets included (attnmt.decode.tree_grammar.TreeGrammar.constrain).
    unsmooth_words: bool = False
    # The model's compute dtype while decoding (translate, evaluate, BLEU during training):
    # "" = model.dtype as trained; "bfloat16" decodes a float32-trained run in bf16
    # (parameters are stored float32 either way).
    dtype: DecodeDType = ""
    # Return, of the beam's decode.beam_size finished hypotheses, the one with the highest
    # expected sentence BLEU ("bleu") or chrF ("chrf") against the others, weighted by the
    # model's probabilities renormalised over them ("model") or alike ("uniform"), instead
    # of the best-scored one (attnmt.decode.mbr). Beam search only.
    mbr: MbrUtility = ""
    mbr_weights: MbrWeights = "model"
    # With decode.mbr: also draw this many samples per input (temperature, top_k, top_p
    # and epsilon above, from decode.seed) and weigh the beam's hypotheses against them
    # too: the samples carry mbr_sample_share of the pseudo-references' weight, the beam's
    # hypotheses the rest (attnmt.decode.mbr). The candidates stay the beam's. 0 = none.
    mbr_samples: int = 0
    mbr_sample_share: float = 0.5

    def __post_init__(self) -> None:
        check_types(self, "decode")
        for name in ("beam_size", "batch_sentences"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"decode.{name} must be positive, got {getattr(self, name)}")
        if self.initial_cache_length < 0:
            raise ConfigError(
                f"decode.initial_cache_length must be ≥ 0, got {self.initial_cache_length}"
            )
        if not 0 <= self.memory_fraction <= 1:
            raise ConfigError(
                f"decode.memory_fraction must be in [0, 1] (0 = no check), got "
                f"{self.memory_fraction}"
            )
        if self.alpha < 0 or self.max_len_offset < 0 or self.coverage_penalty < 0:
            raise ConfigError(
                "decode.alpha, decode.max_len_offset and decode.coverage_penalty must be ≥ 0"
            )
        for name in ("temperature", "top_k", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"decode.{name} must be ≥ 0, got {getattr(self, name)}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"decode.top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.epsilon < 1:
            raise ConfigError(f"decode.epsilon must be in [0, 1) (0 = off), got {self.epsilon}")
        if self.mbr_samples < 0 or not 0 <= self.mbr_sample_share <= 1:
            raise ConfigError(
                f"decode.mbr_samples must be ≥ 0 (got {self.mbr_samples}) and "
                f"decode.mbr_sample_share in [0, 1] (got {self.mbr_sample_share})"
            )
        if self.mbr_samples and not self.mbr:
            raise ConfigError(
                f"decode.mbr_samples={self.mbr_samples} draws samples for minimum Bayes risk: "
                'it needs decode.mbr ("bleu" or "chrf")'
            )
        if self.mbr and (self.sample or self.beam_size < 2):
            raise ConfigError(
                f"decode.mbr={self.mbr!r} chooses among a beam's hypotheses: it needs beam "
                f"search with decode.beam_size ≥ 2 (got beam_size {self.beam_size}"
                + (", sample=True)" if self.sample else ")")
            )
