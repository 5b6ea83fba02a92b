"""The sharded token cache (attnmt.data.token_cache): its arrays are a plain sentencepiece
tokenization, its bytes do not depend on how many processes or workers wrote it, a
half-written cache is rewritten, and a second run with the same key tokenizes nothing.

Two writers are two threads here, joined by a threading.Barrier (the processes' barrier);
tests/parallel/test_shared_token_cache.py runs two real JAX processes."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
import sentencepiece as spm

from attnmt.cli.main import main
from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.data import DataConfig
from attnmt.data import token_cache
from attnmt.data.pipeline import FilterStats
from attnmt.data.prepare import ensure_vocab, tokenized_split, vocab_path
from attnmt.data.token_cache import Layout, Processes, load_or_write
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import DataError
from attnmt.storage import as_path
from attnmt.workdir import load_run
from tests.helpers import (
    make_pairs,
    tiny_train_args,
    token_cache_writes,
    write_reversal_corpus,
)

MAX_LENGTH = 12
# 300 pairs, an empty side, a too-long pair: 5 shards of 64, the last one short.
PAIRS = [*make_pairs(296, seed=11), ("", "ein hund"), ("a dog", ""), ("a " * 40, "ein"), ("", "")]
SMALL = Layout(pairs_per_shard=64, chunk_pairs=16, workers=1)


@pytest.fixture
def debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "debug"
    folder.mkdir()
    monkeypatch.setenv(token_cache.DEBUG_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def tokenizer(vocab_path: Path) -> Tokenizer:
    return Tokenizer.load(vocab_path)


def reference(pairs: list[tuple[str, str]], model: Path, max_length: int) -> tuple[list, dict]:
    """(index, source ids + EOS, target ids + EOS) of every kept pair, and the counts:
    sentencepiece directly, a pair by itself."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    kept, counts = [], {"total": len(pairs), "kept": 0, "too_long": 0, "empty": 0}
    for index, (source, target) in enumerate(pairs):
        src, tgt = [*sp.encode(source), EOS_ID], [*sp.encode(target), EOS_ID]
        if len(src) == 1 or len(tgt) == 1:
            counts["empty"] += 1
        elif max(len(src), len(tgt)) > max_length:
            counts["too_long"] += 1
        else:
            kept.append((index, src, tgt))
    counts["kept"] = len(kept)
    return kept, counts


def write(folder: Path, tokenizer: Tokenizer, processes: int = 1, layout: Layout = SMALL):
    """`load_or_write` of PAIRS by `processes` writers at once (threads); process 0's result."""
    barrier = threading.Barrier(processes)
    results: list = [None] * processes
    errors: list[BaseException] = []

    def run(index: int) -> None:
        group = Processes(index, processes, lambda name: barrier.wait(timeout=60))
        try:
            results[index] = load_or_write(
                as_path(folder), lambda: iter(PAIRS), tokenizer, MAX_LENGTH,
                processes=group, layout=layout,
            )  # fmt: skip
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results[0]


def files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_the_cache_holds_a_plain_tokenization(tmp_path, tokenizer, vocab_path):
    corpus, stats = write(tmp_path / "cache", tokenizer)
    kept, counts = reference(PAIRS, vocab_path, MAX_LENGTH)
    assert stats == FilterStats(**counts) and stats.too_long > 0 and stats.empty == 3
    # The files: each shard's arrays, end to end, are the reference's.
    shards = sorted((tmp_path / "cache").glob("shard-*.src_tokens.npy"))
    assert len(shards) == 5

    def joined(name: str) -> np.ndarray:
        arrays = [np.load(str(p).replace("src_tokens", name)) for p in shards]
        assert all(a.dtype == (np.int64 if name == "source_indices" else np.uint16) for a in arrays)
        return np.concatenate(arrays)

    assert joined("src_tokens").tolist() == [t for _, src, _ in kept for t in src]
    assert joined("tgt_tokens").tolist() == [t for _, _, tgt in kept for t in tgt]
    assert joined("src_lengths").tolist() == [len(src) for _, src, _ in kept]
    assert joined("source_indices").tolist() == [index for index, _, _ in kept]
    # The reader: lengths, examples, and padded rows (id -1: all padding).
    assert len(corpus) == len(kept)
    assert corpus.tgt_lengths.tolist() == [len(tgt) for _, _, tgt in kept]
    assert corpus.source_indices.tolist() == [index for index, _, _ in kept]
    for i in (0, 63, 64, len(kept) - 1):
        assert [a.tolist() for a in corpus.example(i)] == list(kept[i][1:])
    ids = np.array([len(kept) - 1, -1, 0, 70, 130])
    src, tgt = corpus.gather(ids, MAX_LENGTH)
    for row, i in enumerate(ids):
        want = kept[i] if i >= 0 else (-1, [], [])
        for got, tokens in ((src[row], want[1]), (tgt[row], want[2])):
            assert got.tolist() == tokens + [PAD_ID] * (MAX_LENGTH - len(tokens))


def test_bytes_do_not_depend_on_writers_or_workers(tmp_path, tokenizer, debug):
    write(tmp_path / "one", tokenizer, processes=1, layout=SMALL)
    assert token_cache_writes(debug) == [(shard, 0) for shard in range(5)]
    (debug / "writes.log").unlink()
    two_workers = Layout(pairs_per_shard=64, chunk_pairs=16, workers=2)
    write(tmp_path / "two", tokenizer, processes=2, layout=two_workers)
    # Each shard written once, by process shard mod 2.
    assert sorted(token_cache_writes(debug)) == [(shard, shard % 2) for shard in range(5)]
    assert files(tmp_path / "one") == files(tmp_path / "two")


@pytest.mark.parametrize("damage", ["no manifest", "short shard", "missing shard"])
def test_a_half_written_cache_is_rewritten(tmp_path, tokenizer, debug, damage):
    folder = tmp_path / "cache"
    write(folder, tokenizer)
    whole = files(folder)
    shard = folder / "shard-00002.tgt_tokens.npy"
    if damage == "no manifest":
        (folder / token_cache.MANIFEST).unlink()
    elif damage == "short shard":
        shard.write_bytes(shard.read_bytes()[:-2])
    else:
        shard.unlink()
    (debug / "writes.log").unlink()
    corpus, _ = write(folder, tokenizer)
    assert token_cache_writes(debug) == [(shard, 0) for shard in range(5)]
    assert files(folder) == whole
    assert len(corpus) == len(reference(PAIRS, Path(tokenizer.path), MAX_LENGTH)[0])


@pytest.mark.parametrize("text", ["{", '{"format": 1}', '{"format": 1, "stats": {}, "shards": 3}'])
def test_a_corrupt_manifest_is_a_data_error_naming_it(tmp_path, tokenizer, text):
    folder = tmp_path / "cache"
    write(folder, tokenizer)
    (folder / token_cache.MANIFEST).write_text(text)
    with pytest.raises(DataError, match=f"{folder / token_cache.MANIFEST}: not a readable"):
        write(folder, tokenizer)


class WideTokenizer:
    """Ids past uint16 (a vocabulary of 70,000): word i of a sentence is id 65,536 + its
    length in letters."""

    vocab_size = 70_000
    path = None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[65_536 + len(word) for word in text.split()] for text in texts]

    encode_target_batch = encode_batch


def test_ids_past_uint16_are_stored_as_int32(tmp_path):
    corpus, stats = load_or_write(as_path(tmp_path), lambda: iter(PAIRS), WideTokenizer(), 99)
    assert np.load(tmp_path / "shard-00000.src_tokens.npy").dtype == np.int32
    kept = [pair for pair in PAIRS if pair[0].split() and pair[1].split()]  # none too long
    assert stats.kept == len(corpus) == len(kept) and stats.empty == len(PAIRS) - len(kept)
    want = [65_536 + len(word) for word in kept[-1][0].split()] + [EOS_ID]
    assert corpus.example(len(corpus) - 1)[0].tolist() == want


def test_a_second_run_with_the_same_key_tokenizes_nothing(tmp_path, debug, caplog):
    corpus_dir = write_reversal_corpus(tmp_path / "corpus", train=200, dev=0)
    shared = tmp_path / "shared-cache"
    config = DataConfig(
        source="files",
        src_path=f"{corpus_dir}/{{split}}.src",
        tgt_path=f"{corpus_dir}/{{split}}.tgt",
        max_length=8,
        cache_dir=str(shared),
        cache_shard_pairs=64,
    )
    prepared = []
    for run in ("a", "b"):  # each run trains its vocabulary: the same bytes
        workdir = as_path(tmp_path / run)
        tokenizer = ensure_vocab(config, 32, workdir)
        with caplog.at_level(logging.INFO, logger="attnmt.data.token_cache"):
            caplog.clear()
            corpus, stats = tokenized_split(
                config, vocab_path(config, workdir), tokenizer, "train", workdir
            )
        prepared.append((corpus, stats, caplog.text))
    assert token_cache_writes(debug) == [(shard, 0) for shard in range(4)]  # run a's only
    assert "tokenizing into" in prepared[0][2] and "reusing" not in prepared[0][2]
    assert "reusing the token cache" in prepared[1][2] and "tokenizing" not in prepared[1][2]
    assert [folder.name.split("-")[0] for folder in shared.iterdir()] == ["train"]
    assert not (tmp_path / "a" / "data").exists()  # data.cache_dir, not the workdir
    (a, a_stats, _), (b, b_stats, _) = prepared
    assert a_stats == b_stats and a_stats.total == 200
    ids = np.arange(len(a))
    assert all(
        np.array_equal(x, y) for x, y in zip(a.gather(ids, 8), b.gather(ids, 8), strict=True)
    )


@pytest.mark.slow
def test_train_with_a_shared_cache_resumes_bit_exact(tmp_path, caplog):
    corpus = write_reversal_corpus(tmp_path / "corpus", train=160, dev=0)
    cache, straight, resumed = tmp_path / "cache", tmp_path / "straight", tmp_path / "resumed"

    def train(workdir: Path) -> None:
        extra = (
            f"--config.data.cache_dir={cache}",
            "--config.model.dropout_rate=0.1",
            "--config.train.eval_every_steps=0",
            "--config.train.memory_preflight=false",
            "--config.train.checkpoint_every_steps=2",
            "--config.train.xla_backend_optimization_level=0",
        )
        assert main(tiny_train_args(workdir, corpus, 4, *extra)) == 0

    train(straight)
    assert not (straight / "data").exists()  # the cache is in data.cache_dir
    # The run as if killed after saving step 2: it resumes there, reopening the cache.
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "4")
    with caplog.at_level(logging.INFO, logger="attnmt.data.token_cache"):
        train(resumed)
    assert "reusing the token cache" in caplog.text
    a, b = load_run(straight), load_run(resumed)
    assert a.step == b.step == 4
    leaves = zip(*map(jax.tree_util.tree_leaves, (a.params, b.params)), strict=True)
    assert all(np.array_equal(x, y) for x, y in leaves)


def test_a_plain_pathlib_folder_is_written_and_reused(tmp_path):
    """bench/ passes pathlib.Path folders: the second call must find the first's cache
    complete (pathlib's stat() has st_size where epath's has length)."""
    folder = Path(tmp_path) / "plain"
    first, _ = load_or_write(folder, lambda: iter(PAIRS), WideTokenizer(), 99)

    def no_pairs():
        raise AssertionError("a complete cache was tokenized again")

    second, stats = load_or_write(folder, no_pairs, WideTokenizer(), 99)
    assert stats.kept == len(second) == len(first) > 0
