"""Packing several examples into each row (data.pack_length): placement, the arrays the
model reads, and the packed iterator (whole epochs, shards, resume)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnmt.common import PAD_ID
from attnmt.data.packing import PackedBatch, pack_epoch, pack_examples
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from attnmt.data.tokenizer import Tokenizer
from tests.helpers import make_pairs

LENGTH = 24
ROWS = 4


@pytest.fixture(scope="module")
def corpus(tokenizer: Tokenizer) -> TokenizedCorpus:
    corpus, _ = TokenizedCorpus.from_pairs(make_pairs(300, seed=7), tokenizer, LENGTH)
    return corpus


def _row_loads(batch: PackedBatch, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """[ROWS, 2] tokens per row and side, summed by brute force."""
    loads = np.zeros((ROWS, 2), dtype=np.int64)
    for example, row in zip(batch.example_ids, batch.rows, strict=True):
        loads[row] += (src[example], tgt[example])
    return loads


def test_every_fitting_example_is_placed_once_and_no_row_overflows() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(1, 14, size=200)
    tgt = rng.integers(1, 14, size=200)
    src[5], tgt[9] = 30, 25  # longer than a row on one side: left out
    batches = pack_examples(src, tgt, np.arange(200), ROWS, LENGTH)
    placed = np.concatenate([b.example_ids for b in batches])
    assert sorted(placed) == sorted(set(range(200)) - {5, 9})
    for batch in batches:
        assert _row_loads(batch, src, tgt).max() <= LENGTH
        assert batch.rows.min() >= 0 and batch.rows.max() < ROWS


def test_a_batch_closes_only_when_the_next_example_fits_in_none_of_its_rows() -> None:
    rng = np.random.default_rng(1)
    src = rng.integers(1, 12, size=150)
    tgt = rng.integers(1, 12, size=150)
    order = rng.permutation(150)
    batches = pack_examples(src, tgt, order, ROWS, LENGTH)
    # Placement follows `order`, batch after batch.
    assert list(itertools.chain.from_iterable(b.example_ids for b in batches)) == list(order)
    for batch, following in itertools.pairwise(batches):
        free = LENGTH - _row_loads(batch, src, tgt)
        nxt = following.example_ids[0]
        assert not np.any((free[:, 0] >= src[nxt]) & (free[:, 1] >= tgt[nxt]))
    for batch in batches:  # first fit: each example went to the first row with room
        loads = np.zeros((ROWS, 2), dtype=np.int64)
        for example, row in zip(batch.example_ids, batch.rows, strict=True):
            room = (LENGTH - loads >= (src[example], tgt[example])).all(axis=1)
            assert row == np.flatnonzero(room)[0]
            loads[row] += (src[example], tgt[example])


def test_the_epoch_order_depends_only_on_seed_and_epoch() -> None:
    lengths = np.random.default_rng(2).integers(1, 10, size=100)
    first = pack_epoch(lengths, lengths, ROWS, LENGTH, seed=3, epoch=1)
    assert first == pack_epoch(lengths, lengths, ROWS, LENGTH, seed=3, epoch=1)
    assert first != pack_epoch(lengths, lengths, ROWS, LENGTH, seed=3, epoch=2)
    unshuffled = pack_epoch(lengths, lengths, ROWS, LENGTH, seed=3, epoch=1, shuffle=False)
    assert list(np.concatenate([b.example_ids for b in unshuffled])) == list(range(100))


def _examples_of(batch: dict[str, np.ndarray], side: str) -> list[list[int]]:
    """Each segment's tokens, read back from tokens, segment ids and positions."""
    tokens, segments = batch[f"{side}_tokens"], batch[f"{side}_segments"]
    positions = batch[f"{side}_positions"]
    found = []
    for row in range(len(tokens)):
        assert np.all((segments[row] == 0) == (tokens[row] == PAD_ID))
        for segment in range(1, int(segments[row].max(initial=0)) + 1):
            columns = np.flatnonzero(segments[row] == segment)
            assert len(columns) > 0, "segment ids are consecutive from 1"
            assert list(columns) == list(range(columns[0], columns[0] + len(columns)))
            assert list(positions[row, columns]) == list(range(len(columns)))
            found.append(tokens[row, columns].tolist())
        assert np.all(positions[row][segments[row] == 0] == 0)
    return found


def test_one_packed_epoch_holds_every_example_exactly_once(corpus: TokenizedCorpus) -> None:
    batches = BatchIterator(corpus, [(ROWS, LENGTH)], seed=0, repeat=False, pack=True)
    seen = []
    for batch in batches:
        assert all(value.shape == (ROWS, LENGTH) for value in batch.values())
        pairs = zip(_examples_of(batch, "src"), _examples_of(batch, "tgt"), strict=True)
        seen.extend((tuple(s), tuple(t)) for s, t in pairs)
    expected = [tuple(map(tuple, corpus.example(i))) for i in range(len(corpus))]
    assert sorted(seen) == sorted(expected)
    batch_count = len(list(BatchIterator(corpus, [(ROWS, LENGTH)], 0, repeat=False, pack=True)))
    # Rows are filled, not given one example each (these examples are 2-12 tokens long).
    assert corpus.tgt_lengths.sum() / (batch_count * ROWS * LENGTH) > 0.8


def test_packed_shards_are_the_rows_of_the_global_batch(corpus: TokenizedCorpus) -> None:
    whole = BatchIterator(corpus, [(ROWS, LENGTH)], seed=4, pack=True)
    halves = [
        BatchIterator(corpus, [(ROWS, LENGTH)], seed=4, pack=True, shard_index=i, shard_count=2)
        for i in range(2)
    ]
    for _ in range(5):
        full = next(whole)
        parts = [next(half) for half in halves]
        for key, value in full.items():
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)


def test_a_packed_iterator_resumes_where_it_stopped(corpus: TokenizedCorpus) -> None:
    reference = BatchIterator(corpus, [(ROWS, LENGTH)], seed=5, pack=True)
    expected = [next(reference) for _ in range(60)]  # past the end of an epoch
    resumed = BatchIterator(corpus, [(ROWS, LENGTH)], seed=5, pack=True)
    for _ in range(37):
        next(resumed)
    state = resumed.get_state()
    fresh = BatchIterator(corpus, [(ROWS, LENGTH)], seed=0, pack=True)
    fresh.set_state(state)
    for want in expected[37:]:
        got = next(fresh)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_packing_takes_exactly_one_shape(corpus: TokenizedCorpus) -> None:
    with pytest.raises(ValueError, match="one"):
        BatchIterator(corpus, [(4, 16), (2, 24)], seed=0, pack=True)
