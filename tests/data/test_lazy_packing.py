"""A packed epoch packed batch by batch as it is drawn (EpochPacker, BatchIterator with
pack=True): exactly the batches of the reference first fit (tests/helpers.py) for every
(seed, epoch, index), and a position (``packed_offset``) that resumes without packing the
epoch again; positions saved without it are packed again up to, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnmt.common import PAD_ID
from attnmt.data import packing, pipeline
from attnmt.data.packing import EpochPacker, pack_epoch
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from tests.helpers import reference_pack

ROWS, LENGTH, COUNT = 4, 16, 300


def _random_corpus(seed: int, count: int = COUNT) -> TokenizedCorpus:
    """Random tokens, 1 to LENGTH + 3 per side: some examples fit no row."""
    rng = np.random.default_rng(seed)
    sides = []
    for _ in range(2):
        lengths = rng.integers(1, LENGTH + 4, size=count)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        sides += [rng.integers(3, 90, size=int(offsets[-1])).astype(np.int32), offsets]
    return TokenizedCorpus(*sides)


@pytest.fixture(scope="module")
def corpus() -> TokenizedCorpus:
    return _random_corpus(0)


def reference_epoch(
    corpus: TokenizedCorpus,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    source_length: int = LENGTH,
):
    """[(ids, rows, offset after the batch)] of one epoch: the reference first fit of the
    examples in `rng([seed, epoch]).permutation`; the offset is where in that order the
    next batch's first example is (the order's length after the last batch)."""
    count = len(corpus)
    order = np.random.default_rng([seed, epoch]).permutation(count) if shuffle else range(count)
    order = list(order)
    src, tgt = corpus.src_lengths, corpus.tgt_lengths
    batches = reference_pack(src, tgt, order, ROWS, LENGTH, source_length)
    following = [order.index(ids[0]) for ids, _ in batches[1:]] + [count]
    return [(ids, rows, end) for (ids, rows), end in zip(batches, following, strict=True)]


def reference_arrays(
    corpus: TokenizedCorpus, ids, rows, source_length: int = LENGTH
) -> dict[str, np.ndarray]:
    """A packed batch built by hand: each row its examples end to end, in placement order,
    segments 1, 2, … and positions from 0 in each example, PAD / 0 after; the source side
    `source_length` wide."""
    out = {}
    for side, name, width in ((0, "src", source_length), (1, "tgt", LENGTH)):
        tokens = np.full((ROWS, width), PAD_ID, dtype=np.int32)
        segments = np.zeros((ROWS, width), dtype=np.int32)
        positions = np.zeros((ROWS, width), dtype=np.int32)
        used, count = [0] * ROWS, [0] * ROWS
        for example, row in zip(ids, rows, strict=True):
            seq = corpus.example(int(example))[side]
            start, count[row] = used[row], count[row] + 1
            tokens[row, start : start + len(seq)] = seq
            segments[row, start : start + len(seq)] = count[row]
            positions[row, start : start + len(seq)] = np.arange(len(seq))
            used[row] += len(seq)
        out |= {f"{name}_tokens": tokens, f"{name}_segments": segments}
        out[f"{name}_positions"] = positions
    return out


def reference_stream(corpus: TokenizedCorpus, seed: int, epochs: int, source_length: int = LENGTH):
    """[(arrays, state after drawing them)] of the first `epochs` epochs."""
    stream = []
    for epoch in range(epochs):
        batches = reference_epoch(corpus, seed, epoch, source_length=source_length)
        for index, (ids, rows, end) in enumerate(batches):
            state = {"epoch": epoch, "index": index + 1, "seed": seed, "packed_offset": end}
            stream.append((reference_arrays(corpus, ids, rows, source_length), state))
    return stream


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _iterator(corpus: TokenizedCorpus, seed: int = 0, **kwargs) -> BatchIterator:
    return BatchIterator(corpus, [(ROWS, LENGTH)], seed=seed, pack=True, **kwargs)


# ---- the packer -------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(10))
def test_the_packer_is_the_reference_first_fit_from_every_batch_start(
    case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case % 2:  # batches that span chunks of lengths read
        monkeypatch.setattr(packing, "_CHUNK", 5)
    rng = np.random.default_rng(case)
    rows, length = int(rng.integers(1, 8)), int(rng.integers(4, 30))
    count = int(rng.integers(0, 300)) if case else 0
    src = rng.integers(1, length + 4, size=count)
    tgt = np.clip(src + rng.integers(-3, 4, size=count), 1, None)
    # From case 6 on, source rows shorter than the target's (data.pack_source_length), so
    # that either side can be the one without room.
    source_length = int(rng.integers(2, length)) if case >= 6 else None
    if source_length is not None:
        src = np.clip(src // 2, 1, None)
    order = rng.permutation(count)
    expected = reference_pack(src, tgt, order, rows, length, source_length)
    starts = [list(order).index(ids[0]) for ids, _ in expected] + [count]
    packer = EpochPacker(src, tgt, order, rows, length, source_length=source_length)
    for (ids, placed), end in zip(expected, starts[1:], strict=True):
        batch = next(packer)
        assert (batch.example_ids.tolist(), batch.rows.tolist()) == (ids, placed)
        assert packer.offset == end
    assert next(packer, None) is None and next(packer, None) is None
    for k, start in enumerate(starts[:-1]):  # the rest of the epoch from each batch start
        rest = list(EpochPacker(src, tgt, order, rows, length, start, source_length))
        assert [(b.example_ids.tolist(), b.rows.tolist()) for b in rest] == expected[k:]


def test_pack_epoch_still_packs_the_whole_epoch_at_once(corpus: TokenizedCorpus) -> None:
    for shuffle in (True, False):
        batches = pack_epoch(
            corpus.src_lengths, corpus.tgt_lengths, ROWS, LENGTH, 3, 2, shuffle=shuffle
        )
        expected = reference_epoch(corpus, 3, 2, shuffle)
        got = [(b.example_ids.tolist(), b.rows.tolist()) for b in batches]
        assert got == [(ids, rows) for ids, rows, _ in expected]


# ---- the iterator -----------------------------------------------------------------------


def test_the_iterator_draws_the_reference_batches_and_positions_across_epochs(
    corpus: TokenizedCorpus,
) -> None:
    stream = reference_stream(corpus, seed=4, epochs=3)
    batches = _iterator(corpus, seed=4)
    assert batches.get_state() == {"epoch": 0, "index": 0, "seed": 4, "packed_offset": 0}
    for want, state in stream:
        assert_same_arrays(next(batches), want)
        assert json.loads(json.dumps(batches.get_state())) == state


def test_one_epoch_then_stop(corpus: TokenizedCorpus) -> None:
    batches = _iterator(corpus, seed=2, repeat=False)
    expected = reference_epoch(corpus, 2, 0)
    for ids, rows, _ in expected:
        assert_same_arrays(next(batches), reference_arrays(corpus, ids, rows))
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(batches)
    assert batches.get_state() == {
        "epoch": 0,
        "index": len(expected),
        "seed": 2,
        "packed_offset": len(corpus),
    }


@pytest.mark.parametrize("with_offset", [True, False])
def test_resume_from_any_position_with_or_without_the_offset(
    corpus: TokenizedCorpus, with_offset: bool
) -> None:
    stream = reference_stream(corpus, seed=5, epochs=2)
    per_epoch = len(reference_epoch(corpus, 5, 0))
    # Mid-epoch, the end of epoch 0 (offset = the corpus size) and mid-epoch 1.
    for drawn in (1, 7, per_epoch - 1, per_epoch, per_epoch + 3):
        state = dict(stream[drawn - 1][1])
        if not with_offset:
            del state["packed_offset"]
        resumed = _iterator(corpus, seed=0)
        resumed.set_state(state)
        assert resumed.get_state() == state  # not known before the first draw: left out
        for want, want_state in stream[drawn : drawn + 3]:
            assert_same_arrays(next(resumed), want)
            assert resumed.get_state() == want_state


def test_an_old_state_at_an_epoch_start_knows_its_offset(corpus: TokenizedCorpus) -> None:
    resumed = _iterator(corpus)
    resumed.set_state({"epoch": 3, "index": 0, "seed": 1})
    assert resumed.get_state() == {"epoch": 3, "index": 0, "seed": 1, "packed_offset": 0}


def test_shards_are_the_rows_of_the_reference_batches_and_resume(
    corpus: TokenizedCorpus,
) -> None:
    stream = reference_stream(corpus, seed=6, epochs=2)
    half = ROWS // 2
    shards = [_iterator(corpus, seed=6, shard_index=i, shard_count=2) for i in range(2)]
    for want, state in stream:
        for i, shard in enumerate(shards):
            rows = {key: value[i * half : (i + 1) * half] for key, value in want.items()}
            assert_same_arrays(next(shard), rows)
            assert shard.get_state() == state
    resumed = _iterator(corpus, shard_index=1, shard_count=2)
    resumed.set_state(stream[10][1])
    want = stream[11][0]
    assert_same_arrays(next(resumed), {key: value[half:] for key, value in want.items()})


@pytest.mark.parametrize(
    ("index", "offset", "problem"),
    [
        (3, -1, "can start"),
        (3, COUNT + 1, "can start"),
        (0, 5, "can start"),
        (3, 0, "can start"),
        (9, 8, "can start"),  # batches hold one example at least
        (3, "x", "invalid literal"),
    ],
)
def test_set_state_rejects_impossible_offsets(
    corpus: TokenizedCorpus, index: int, offset, problem: str
) -> None:
    batches = _iterator(corpus)
    state = {"epoch": 0, "index": index, "seed": 0, "packed_offset": offset}
    with pytest.raises(ValueError, match=problem):
        batches.set_state(state)


def test_an_offset_at_an_example_that_fits_no_row_is_refused_when_drawn(
    corpus: TokenizedCorpus,
) -> None:
    order = np.random.default_rng([0, 0]).permutation(len(corpus))
    too_long = np.maximum(corpus.src_lengths, corpus.tgt_lengths)[order] > LENGTH
    offset = int(np.flatnonzero(too_long)[-1])
    batches = _iterator(corpus)
    batches.set_state({"epoch": 0, "index": 1, "seed": 0, "packed_offset": offset})
    with pytest.raises(ValueError, match=f"packed_offset={offset} does not start a batch"):
        next(batches)


def test_a_batch_cut_short_is_packed_again_from_its_start(
    corpus: TokenizedCorpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = reference_stream(corpus, seed=0, epochs=1)
    batches = _iterator(corpus)
    next(batches)
    first_fit = packing._first_fit

    def interrupted(pairs, *args):
        next(pairs)  # an example drawn, then the packing stops
        raise KeyboardInterrupt

    monkeypatch.setattr(packing, "_first_fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        next(batches)
    monkeypatch.setattr(packing, "_first_fit", first_fit)
    assert batches.get_state() == stream[0][1]
    assert_same_arrays(next(batches), stream[1][0])


def test_restoring_a_position_of_the_same_epoch_draws_no_new_order(
    corpus: TokenizedCorpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training loop restores its last consumed position when it stops: that must not
    shuffle the corpus again (seconds at 36M pairs)."""
    drawn = []
    epoch_order = pipeline.epoch_order
    monkeypatch.setattr(pipeline, "epoch_order", lambda *a: drawn.append(a) or epoch_order(*a))
    stream = reference_stream(corpus, seed=0, epochs=1)
    batches = _iterator(corpus)
    for _ in range(5):
        next(batches)
    batches.set_state(stream[2][1])
    assert_same_arrays(next(batches), stream[3][0])
    assert drawn == [(len(corpus), 0, 0, True)]


def test_bucketed_positions_have_no_offset(corpus: TokenizedCorpus) -> None:
    shapes = [(4, 8), (4, LENGTH)]
    batches = BatchIterator(corpus, shapes, seed=0)
    next(batches)
    assert batches.get_state() == {"epoch": 0, "index": 1, "seed": 0}
    reference = BatchIterator(corpus, shapes, seed=0)
    for _ in range(2):
        want = next(reference)
    # A packed run's position, resumed without packing: its epoch and index, as before.
    batches.set_state({"epoch": 0, "index": 1, "seed": 0, "packed_offset": 40})
    assert_same_arrays(next(batches), want)


# ---- source rows shorter than the target's (data.pack_source_length) ---------------------

SOURCE_LENGTH = 9  # the random corpus has sources of 1-19 tokens: many fit no source row


def test_shorter_source_rows_draw_the_reference_batches_shards_and_positions(
    corpus: TokenizedCorpus,
) -> None:
    stream = reference_stream(corpus, seed=7, epochs=2, source_length=SOURCE_LENGTH)
    batches = _iterator(corpus, seed=7, pack_source_length=SOURCE_LENGTH)
    fits = (corpus.src_lengths <= SOURCE_LENGTH) & (corpus.tgt_lengths <= LENGTH)
    assert batches.examples_per_epoch == int(fits.sum()) < len(corpus)
    for want, state in stream:
        got = next(batches)
        assert got["src_tokens"].shape == (ROWS, SOURCE_LENGTH)
        assert got["tgt_tokens"].shape == (ROWS, LENGTH)
        assert_same_arrays(got, want)
        assert batches.get_state() == state
    half = ROWS // 2
    for drawn in (1, len(stream) // 2):  # mid-epoch 0 and later, from a saved position
        shard = _iterator(corpus, shard_index=1, shard_count=2, pack_source_length=SOURCE_LENGTH)
        shard.set_state(stream[drawn - 1][1])
        want = stream[drawn][0]
        assert_same_arrays(next(shard), {key: value[half:] for key, value in want.items()})


def test_an_offset_at_a_source_too_long_for_its_row_is_refused(corpus: TokenizedCorpus) -> None:
    """An example that would fit rows of LENGTH on both sides, but not the source row."""
    order = np.random.default_rng([0, 0]).permutation(len(corpus))
    src, tgt = corpus.src_lengths[order], corpus.tgt_lengths[order]
    wide = (src > SOURCE_LENGTH) & (src <= LENGTH) & (tgt <= LENGTH)
    position = int(np.flatnonzero(wide[1:])[0]) + 1
    batches = _iterator(corpus, pack_source_length=SOURCE_LENGTH)
    batches.set_state({"epoch": 0, "index": 1, "seed": 0, "packed_offset": position})
    with pytest.raises(ValueError, match="does not start a batch"):
        next(batches)


def test_source_rows_need_packing(corpus: TokenizedCorpus) -> None:
    with pytest.raises(ValueError, match="pack_source_length"):
        BatchIterator(corpus, [(ROWS, LENGTH)], seed=0, pack_source_length=8)
