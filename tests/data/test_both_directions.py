"""data.train_both_directions: the training split holds every pair and then every pair
reversed, each side tokenized as sentencepiece tokenizes it alone; the other splits, the
cache key without the option, and configurations it cannot serve are left as they were."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import sentencepiece as spm

from attnmt.cli.main import main
from attnmt.common import EOS_ID
from attnmt.config.data import DataConfig
from attnmt.data.prepare import cache_folder, iter_training_pairs, tokenized_split
from attnmt.data.token_cache import Layout
from attnmt.errors import ConfigError
from tests.helpers import tiny_train_args, write_reversal_corpus

MAX_LENGTH = 24


def files_config(folder: Path, corpus_pairs, **options) -> DataConfig:
    splits = {"train": corpus_pairs[:300], "val": corpus_pairs[300:]}
    for split, pairs in splits.items():
        for lang, side in (("en", 0), ("de", 1)):
            lines = "".join(pair[side] + "\n" for pair in pairs)
            (folder / f"{split}.{lang}").write_text(lines, encoding="utf-8")
    return DataConfig(
        source="files",
        src_path=str(folder / "{split}.{src}"),
        tgt_path=str(folder / "{split}.{tgt}"),
        max_length=MAX_LENGTH,
        **options,
    )


def test_the_training_split_is_every_pair_then_every_pair_reversed(
    tmp_path, corpus_pairs, tokenizer, vocab_path
):
    data = files_config(tmp_path, corpus_pairs, train_both_directions=True)
    train = corpus_pairs[:300]
    assert list(iter_training_pairs(data, "train")) == [*train, *((t, s) for s, t in train)]
    assert list(iter_training_pairs(data, "val")) == corpus_pairs[300:]

    layout = Layout(pairs_per_shard=128, chunk_pairs=32, workers=1)
    corpus, stats = tokenized_split(data, vocab_path, tokenizer, "train", tmp_path, layout=layout)
    sp = spm.SentencePieceProcessor(model_file=str(vocab_path))

    def ids(text: str) -> list[int]:
        return [*sp.encode(text), EOS_ID]

    want = [(ids(s), ids(t)) for s, t in train]
    want += [(tgt, src) for src, tgt in want]
    assert all(max(map(len, pair)) <= MAX_LENGTH for pair in want)
    assert stats.total == stats.kept == len(corpus) == 600
    assert corpus.source_indices.tolist() == list(range(600))
    for i in range(600):
        assert [side.tolist() for side in corpus.example(i)] == list(want[i]), i

    val, val_stats = tokenized_split(data, vocab_path, tokenizer, "val", tmp_path, layout=layout)
    assert len(val) == val_stats.total == 100
    assert [side.tolist() for side in val.example(0)] == [ids(s) for s in corpus_pairs[300]]


def test_only_the_training_split_gets_another_cache(tmp_path, corpus_pairs, tokenizer, vocab_path):
    one = files_config(tmp_path, corpus_pairs)
    both = files_config(tmp_path, corpus_pairs, train_both_directions=True)

    def folder(data: DataConfig, split: str) -> Path:
        return cache_folder(data, vocab_path, tokenizer, split, tmp_path)

    assert folder(one, "train") != folder(both, "train")
    assert folder(one, "val") == folder(both, "val")


@pytest.mark.parametrize("sampled", [False, True], ids=["token cache", "BPE-dropout"])
def test_the_trainer_reads_both_directions(tmp_path, caplog, sampled):
    corpus = write_reversal_corpus(tmp_path / "corpus", train=150, dev=0)
    args = tiny_train_args(
        tmp_path / "run",
        corpus,
        1,
        "--config.data.train_both_directions=true",
        "--config.train.eval_every_steps=0",
        "--config.train.memory_preflight=false",
        *(["--config.data.subword_dropout=0.1"] if sampled else []),
    )
    with caplog.at_level(logging.INFO, logger="attnmt.train"):
        assert main(args) == 0
    # 150 pairs read, 150 more turned round (a few may be too long for max_length 8)
    assert re.search(r"training pairs 'train': kept \d+ of 300 pairs", caplog.text)


@pytest.mark.parametrize(
    "options",
    [
        {"source": "treebank", "data_dir": "x", "treebank_splits": "train=1-2"},
        {"vocab_kind": "pair"},
    ],
)
def test_it_is_refused_where_a_pair_cannot_be_turned_round(options):
    with pytest.raises(ConfigError, match=r"data\.train_both_directions"):
        DataConfig(train_both_directions=True, **options)
