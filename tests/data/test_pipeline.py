"""Tokenized corpus and the resumable, shardable batch iterator."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from attnmt.common import EOS_ID, PAD_ID
from attnmt.data.batching import bucket_shapes
from attnmt.data.pipeline import (
    BatchIterator,
    FilterStats,
    TokenizedCorpus,
    padding_fraction,
    split_batch,
)
from attnmt.data.tokenizer import Tokenizer
from attnmt.errors import DataError
from tests.helpers import interleave, make_pairs, shared_data_dir

MAX_LENGTH = 24
SHAPES = bucket_shapes(MAX_LENGTH, tokens_per_batch=128, batch_multiple=4)


@pytest.fixture(scope="module")
def corpus(tokenizer: Tokenizer) -> TokenizedCorpus:
    corpus, _ = TokenizedCorpus.from_pairs(make_pairs(300, seed=5), tokenizer, MAX_LENGTH)
    return corpus


def test_from_pairs_filter_stats(tokenizer: Tokenizer) -> None:
    normal = [("a dog", "ein hund"), ("the red ball", "der rote ball"), ("cat", "katze")]
    long_text = " ".join(["small street"] * 30)
    limit = len(tokenizer.encode(normal[1][0])) + 1  # "the red ball" + EOS fits exactly
    assert len(tokenizer.encode(normal[1][1])) + 1 <= limit
    pairs = [
        normal[0],
        ("", "ein hund"),  # empty source
        normal[1],
        ("a dog", "   "),  # whitespace only: no tokens, so empty
        (long_text, "hund"),  # too long source
        ("dog", long_text),  # too long target
        ("", long_text),  # empty and too long: counted as empty
        normal[2],
    ]
    corpus, stats = TokenizedCorpus.from_pairs(pairs, tokenizer, max_length=limit)
    assert stats == FilterStats(total=8, kept=3, too_long=2, empty=3)
    assert len(corpus) == 3
    assert list(corpus.source_indices) == [0, 2, 7]
    for i, (src, tgt) in enumerate(normal):
        got_src, got_tgt = corpus.example(i)
        assert list(got_src) == [*tokenizer.encode(src), EOS_ID]
        assert list(got_tgt) == [*tokenizer.encode(tgt), EOS_ID]
        assert corpus.src_lengths[i] == len(got_src) and corpus.tgt_lengths[i] == len(got_tgt)
    # One token less of room and the exact-fit pair is dropped.
    _, tighter = TokenizedCorpus.from_pairs(pairs, tokenizer, max_length=limit - 1)
    assert tighter.too_long >= 3 and tighter.kept <= 2


def test_from_pairs_many_chunks_matches_reference(tokenizer: Tokenizer) -> None:
    pairs = make_pairs(20_000, seed=2)  # more than one encode chunk
    corpus, stats = TokenizedCorpus.from_pairs(iter(pairs), tokenizer, MAX_LENGTH)
    assert stats.total == 20_000 and stats.kept == len(corpus)
    for k in (0, 1, len(corpus) // 2, len(corpus) - 1):
        src, tgt = pairs[corpus.source_indices[k]]
        assert list(corpus.example(k)[0]) == [*tokenizer.encode(src), EOS_ID]
        assert list(corpus.example(k)[1]) == [*tokenizer.encode(tgt), EOS_ID]


def test_save_load_roundtrip(corpus: TokenizedCorpus, tmp_path: Path) -> None:
    path = tmp_path / "cache" / "train.npz"
    corpus.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["train.npz"]  # no temp files left
    loaded = TokenizedCorpus.load(path)
    assert len(loaded) == len(corpus)
    np.testing.assert_array_equal(loaded.src_lengths, corpus.src_lengths)
    np.testing.assert_array_equal(loaded.source_indices, corpus.source_indices)
    for i in range(len(corpus)):
        for a, b in zip(loaded.example(i), corpus.example(i), strict=True):
            np.testing.assert_array_equal(a, b)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"none\.npz"):
        TokenizedCorpus.load(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"bad\.npz"):
        TokenizedCorpus.load(bad)


def rows_to_examples(batch: dict[str, np.ndarray], length: int) -> list[tuple]:
    """Checks row layout and returns the (src, tgt) token tuples of non-filler rows."""
    src, tgt = batch["src_tokens"], batch["tgt_tokens"]
    assert src.dtype == np.int32 and tgt.dtype == np.int32
    assert src.shape == tgt.shape and src.shape[1] == length
    examples = []
    for s, t in zip(src, tgt, strict=True):
        if not s.any() and not t.any():
            continue  # filler row
        pieces = []
        for row in (s, t):
            n = int(np.count_nonzero(row))
            assert np.all(row[:n] != PAD_ID) and np.all(row[n:] == PAD_ID)  # right-padded
            assert row[n - 1] == EOS_ID
            pieces.append(tuple(row[:n].tolist()))
        examples.append(tuple(pieces))
    return examples


def corpus_examples(corpus: TokenizedCorpus) -> Counter:
    return Counter(
        (tuple(s.tolist()), tuple(t.tolist())) for s, t in map(corpus.example, range(len(corpus)))
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_one_epoch_visits_each_example_once(corpus: TokenizedCorpus, shuffle: bool) -> None:
    it = BatchIterator(corpus, SHAPES, seed=1, shuffle=shuffle, repeat=False)
    seen: Counter = Counter()
    lengths = {length: batch for batch, length in SHAPES}
    for batch in it:
        length = batch["src_tokens"].shape[1]
        assert batch["src_tokens"].shape[0] == lengths[length]  # a planned shape
        seen.update(rows_to_examples(batch, length))
    assert seen == corpus_examples(corpus)
    assert it.examples_per_epoch == len(corpus)


def batches(it: BatchIterator, n: int) -> list[dict[str, np.ndarray]]:
    return list(itertools.islice(it, n))


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_restore_mid_epoch_and_at_boundary(corpus: TokenizedCorpus) -> None:
    per_epoch = sum(1 for _ in BatchIterator(corpus, SHAPES, seed=7, repeat=False))
    reference = batches(BatchIterator(corpus, SHAPES, seed=7), 2 * per_epoch + 3)
    for k in (0, 5, per_epoch - 1, per_epoch, per_epoch + 1, 2 * per_epoch):
        it = BatchIterator(corpus, SHAPES, seed=7)
        batches(it, k)
        state = json.loads(json.dumps(it.get_state()))  # must survive JSON
        fresh = BatchIterator(corpus, SHAPES, seed=123)  # the state's seed wins
        fresh.set_state(state)
        assert_same(batches(fresh, 3), reference[k : k + 3])
    # Epochs really continue (and differ): epoch 1 is not a replay of epoch 0.
    it = BatchIterator(corpus, SHAPES, seed=7)
    batches(it, per_epoch + 1)
    assert it.epoch == 1
    first = reference[:per_epoch]
    second = reference[per_epoch : 2 * per_epoch]
    assert any(
        a["src_tokens"].shape != b["src_tokens"].shape
        or not np.array_equal(a["src_tokens"], b["src_tokens"])
        for a, b in zip(first, second, strict=True)
    )


def test_shards_concatenate_to_global_batch(corpus: TokenizedCorpus) -> None:
    whole = BatchIterator(corpus, SHAPES, seed=3)
    shards = [BatchIterator(corpus, SHAPES, seed=3, shard_index=i, shard_count=2) for i in (0, 1)]
    for _ in range(40):
        expected = next(whole)
        parts = [next(s) for s in shards]
        for key in ("src_tokens", "tgt_tokens"):
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), expected[key])


def test_shard_validation(corpus: TokenizedCorpus) -> None:
    with pytest.raises(ValueError, match="shard_count=3"):
        BatchIterator(corpus, SHAPES, seed=0, shard_count=3)  # batch sizes are multiples of 4
    with pytest.raises(ValueError):
        BatchIterator(corpus, SHAPES, seed=0, shard_index=2, shard_count=2)


def test_nothing_fits_endless_iterator_refused(corpus: TokenizedCorpus) -> None:
    tiny = [(8, 1)]  # every example is longer than one token
    with pytest.raises(ValueError, match="never yield"):
        BatchIterator(corpus, tiny, seed=0)
    assert list(BatchIterator(corpus, tiny, seed=0, repeat=False)) == []


def test_padding_fraction_hand_computed() -> None:
    batch = {
        "src_tokens": np.array([[5, 1, 0, 0], [5, 6, 7, 1], [0, 0, 0, 0]], dtype=np.int32),
        "tgt_tokens": np.array([[5, 6, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=np.int32),
    }
    # Two rows present, 8 slots each; pads: src 2 + 0, tgt 1 + 3 → 6 of 16.
    assert padding_fraction(batch) == pytest.approx(6 / 16)
    empty = {k: np.zeros((2, 4), np.int32) for k in batch}
    assert padding_fraction(empty) == 0.0


@pytest.mark.parametrize(("rows", "parts", "size"), [(7, 3, 3), (6, 3, 2), (5, 1, 8)])
def test_split_batch_keeps_every_row_in_order_and_pads_the_rest(rows, parts, size) -> None:
    rng = np.random.default_rng(rows)
    batch = {
        k: rng.integers(1, 9, (rows, 4)).astype(np.int32) for k in ("src_tokens", "tgt_tokens")
    }
    pieces = split_batch(batch, parts, size)
    assert [len(p["src_tokens"]) for p in pieces] == [size] * parts
    for key in batch:
        joined = np.concatenate([p[key] for p in pieces])
        np.testing.assert_array_equal(joined[:rows], batch[key])
        assert (joined[rows:] == PAD_ID).all()  # filler rows hold no token
    with pytest.raises(ValueError, match="cannot hold"):
        split_batch(batch, parts, (rows - 1) // parts)


def test_real_multi30k_end_to_end(tmp_path: Path) -> None:
    from attnmt.data.sources import multi30k_pairs
    from attnmt.data.tokenizer import train_vocab

    directory = shared_data_dir() / "multi30k"
    if not (directory / "val.de").is_file():
        pytest.skip(f"real Multi30K not found in {directory} (set ATTNMT_DATA_DIR)")
    pairs = multi30k_pairs("val", "de", "en", data_dir=str(directory))
    tok = Tokenizer.load(train_vocab(interleave(pairs), tmp_path / "v.model", 1000))
    corpus, stats = TokenizedCorpus.from_pairs(pairs, tok, max_length=64)
    assert stats.total == 1014 and stats.kept == len(corpus) > 1000
    for k in (0, len(corpus) - 1):  # decoding gives back the (normalised) sentences
        src, tgt = pairs[corpus.source_indices[k]]
        assert tok.decode(corpus.example(k)[0]) == tok.decode(tok.encode(src))
        assert tok.decode(corpus.example(k)[1]) == tok.decode(tok.encode(tgt))
    seen: Counter = Counter()
    for batch in BatchIterator(corpus, bucket_shapes(64, 2048), seed=0, repeat=False):
        seen.update(rows_to_examples(batch, batch["src_tokens"].shape[1]))
    assert seen == corpus_examples(corpus)
