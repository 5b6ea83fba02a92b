"""Typed configuration of the input pipeline (the `data` section of a config file)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnmt.config.typed import check_types
from attnmt.errors import ConfigError
from attnmt.storage import local_only


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: Literal["multi30k", "tfds", "files", "treebank"] = "multi30k"
    tfds_name: str = ""  # e.g. "wmt14_translate/de-en" when source == "tfds"
    data_dir: str = ""  # local copy (multi30k), TFDS data_dir, or "" for the default
    download_url: str = ""  # multi30k: where to download from when no local copy exists
    src_path: str = ""  # files: template such as "corpus/{split}.{src}" (plain or .gz)
    tgt_path: str = ""  # files: template such as "corpus/{split}.{tgt}"
    # treebank (parsing, §6.3): data_dir holds the .mrg files; NAME=FIRST-LAST file ranges
    treebank_splits: str = ""  # e.g. "train=200-2199,dev=2200-2299,test=2300-2399"
    treebank_pos: str = "XX"  # every POS tag becomes this target token ("" keeps the tags)
    # "pos": each leaf of the target is its POS token (treebank_pos); "words": the word itself,
    # which decoding copies from the input (attnmt.data.treebank.linearize)
    treebank_leaves: Literal["pos", "words"] = "pos"
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_split: str = "train"
    eval_split: str = "val"
    test_split: str = "test_2016_flickr"
    vocab_path: str = ""  # "" = <workdir>/vocab.model, trained on first use (model.vocab_size)
    # "sentencepiece": one model shared by both sides (vocab_path); "pair": vocab.json with
    # source.spm and target.spm beside it (vocab_path, "" = <workdir>/vocab.json), as an
    # imported Marian model has them (data/pair_tokenizer.py); never trained here.
    vocab_kind: Literal["sentencepiece", "pair"] = "sentencepiece"
    vocab_model_type: Literal["bpe", "unigram"] = "bpe"
    vocab_max_sentences: int = 2_000_000
    # >0: BPE-dropout (Provilkov et al., 2020) on the training split: each epoch segments
    # the text anew, every merge skipped with this probability (0.1 in the paper), the same
    # for every process and on resume (train.seed, the epoch); validation, test and
    # decoding keep the standard segmentation. The text is held in memory and tokenized
    # again at each epoch's start (attnmt.data.subword_sampling). A `bpe` vocabulary only.
    subword_dropout: float = 0.0
    # False: BPE-dropout on the source side only; targets keep the standard segmentation,
    # so the decoder learns the one it is scored and decodes with.
    subword_dropout_target: bool = True
    # True: the training split also holds every pair reversed (target → source), so one
    # model learns both directions over the shared vocabulary (bidirectional training, Niu
    # et al. 2018). No language tag is needed with two languages: the source's language
    # names the direction. Validation, test and decoding keep src_lang → tgt_lang.
    train_both_directions: bool = False
    # "lc.norm.tok": train and translate on the text as the official Multi30K tok/ files
    # have it (lowercased, punctuation-normalised, Moses-tokenized), the form published
    # Multi30K results train on; sources take that form before translation and hypotheses
    # are detokenized (still lowercase) after it (attnmt.data.text_form). Translation only.
    text_form: Literal["raw", "lc.norm.tok"] = "raw"
    # Where tokenized splits are cached ("" = <workdir>/data): a local folder or gs://…
    # shared by a sweep's runs; each split is tokenized once per key (attnmt.data.token_cache)
    cache_dir: str = ""
    # Pairs per shard of a new cache (process p of P writes shards p, p+P, …); only the
    # layout depends on it, so a cache written with another value is still used.
    cache_shard_pairs: int = 262_144
    max_length: int = 256  # tokens incl. EOS; longer training pairs are counted and dropped
    tokens_per_batch: int = 25_000  # per side, per optimizer step (§5.1: ≈25k + 25k)
    min_bucket_length: int = 8
    batch_multiple: int = 8  # batch sizes are multiples of this (device counts divide it)
    eval_tokens_per_batch: int = 0  # 0 = same as tokens_per_batch
    # >0: pack several examples into each row of this many tokens per side (one compiled
    # shape, little padding; attention stays within each example) instead of length buckets
    pack_length: int = 0
    # >0 (with pack_length): the source side's rows hold this many tokens instead. Where the
    # source is much shorter than the target (parsing: a tree is about twice its sentence)
    # equal rows leave the encoder's half padding; pairs whose source is longer than this
    # are left out of training and validation (the run logs how many).
    pack_source_length: int = 0

    @property
    def packed(self) -> bool:
        return self.pack_length > 0

    def require_source_keys(self) -> None:
        """Checked when data is actually read, so `attnmt params` works without paths."""
        if self.source == "tfds" and not self.tfds_name:
            raise ConfigError("data.tfds_name is required when data.source == 'tfds'")
        if self.source == "treebank" and not (self.data_dir and self.treebank_splits):
            raise ConfigError(
                "data.data_dir (a folder of .mrg files) and data.treebank_splits are required "
                "when data.source == 'treebank'"
            )
        if self.source == "files" and not (self.src_path and self.tgt_path):
            raise ConfigError(
                "data.src_path and data.tgt_path are required when data.source == 'files'"
            )

    def __post_init__(self) -> None:
        check_types(self, "data")
        for name in (
            "vocab_max_sentences",
            "cache_shard_pairs",
            "max_length",
            "tokens_per_batch",
            "min_bucket_length",
            "batch_multiple",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"data.{name} must be positive, got {getattr(self, name)}")
        if self.eval_tokens_per_batch < 0:
            raise ConfigError("data.eval_tokens_per_batch must be ≥ 0")
        if self.packed and self.pack_length < self.max_length:
            raise ConfigError(
                f"data.pack_length={self.pack_length} must be 0 (no packing) or at least "
                f"data.max_length={self.max_length}, so that every example fits in a row"
            )
        if self.pack_source_length < 0 or (self.pack_source_length and not self.packed):
            raise ConfigError(
                f"data.pack_source_length={self.pack_source_length} must be 0 (as long as "
                "the target's rows) or positive with data.pack_length > 0 (packed rows)"
            )
        if self.min_bucket_length > self.max_length:
            raise ConfigError("data.min_bucket_length must not exceed data.max_length")
        if not 0.0 <= self.subword_dropout <= 1.0:
            raise ConfigError(
                f"data.subword_dropout={self.subword_dropout} must be in [0, 1] (0: off)"
            )
        if self.subword_dropout and (
            self.vocab_kind != "sentencepiece"
            or self.vocab_model_type != "bpe"
            or self.source == "treebank"
        ):
            raise ConfigError(
                "data.subword_dropout (BPE-dropout) needs data.vocab_kind='sentencepiece' "
                "with data.vocab_model_type='bpe', and translation data: a tree's symbols and "
                "copied words must keep one segmentation on both sides"
            )
        if self.train_both_directions and (
            self.source == "treebank" or self.vocab_kind != "sentencepiece"
        ):
            raise ConfigError(
                "data.train_both_directions needs translation data and one sentencepiece "
                "vocabulary for both sides (data.vocab_kind='sentencepiece'): a tree is no "
                "source, and an imported (vocab_kind='pair') model segments each side its own way"
            )
        if self.text_form != "raw" and (self.source == "treebank" or self.vocab_kind == "pair"):
            raise ConfigError(
                f"data.text_form={self.text_form!r} is for translation with a vocabulary "
                "trained here: a treebank's trees and an imported (vocab_kind='pair') model's "
                "vocabulary keep their own text, so use data.text_form='raw'"
            )
        if self.source == "treebank":  # read with a local folder walk (attnmt.data.parsing)
            local_only(self.data_dir, "treebank data.data_dir")
