"""Packing: several examples per row of a fixed [rows, length] batch (data.pack_length).

The source side's rows may be shorter than the target's (data.pack_source_length): where
one side is much shorter (a parse tree is twice its sentence), equal rows would leave the
encoder's half padding, computed at every layer for nothing.

Length buckets pad every example up to its bucket's length and compile one program per
bucket; on Multi30K that left about a fifth of every batch as padding. Packing fills rows
end to end instead: one shape, one compiled step, and padding only where no further
example fits. The model keeps each example to itself through segment ids (attention only
within a segment) and per-example positions (attnmt.common), so a packed example is
computed exactly as it would be in a row of its own.

A run packs an epoch batch by batch as it draws them (EpochPacker): first fit only looks
at the open batch, so a batch depends on nothing but where it starts in the epoch's order,
and that position is all a resumed run needs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from attnmt.common import PAD_ID


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """One batch of an epoch: its examples in the order they were placed, and the row of
    each (examples share a row in that order)."""

    example_ids: np.ndarray
    rows: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedBatch):
            return NotImplemented
        return np.array_equal(self.example_ids, other.example_ids) and np.array_equal(
            self.rows, other.rows
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays: equal but not hashable


# Examples whose lengths become Python lists at a time (small ints are shared objects, so
# 8 bytes per length): memory bounded at any corpus size, and a few milliseconds per chunk
# on the thread drawing batches (its cost is spread over the ~100 batches it feeds).
_CHUNK = 1 << 16
# Old rows are searched a block at a time, skipping blocks without room on both sides.
_BLOCK = 8


class _OldRows:
    """The free space of the rows before the last opened one of a batch (most are nearly
    full), with the largest of each block of _BLOCK rows and of all, per side (exact)."""

    def __init__(self) -> None:
        self.src: list[int] = []
        self.tgt: list[int] = []
        self.block_src: list[int] = []
        self.block_tgt: list[int] = []
        self.max_src = self.max_tgt = -1  # -1: no row

    def first_with_room(self, s: int, t: int) -> int:
        """The first row with room for `s` source and `t` target tokens, or -1."""
        free_src, free_tgt, block_tgt = self.src, self.tgt, self.block_tgt
        for block, room in enumerate(self.block_src):
            if room >= s and block_tgt[block] >= t:
                first = block * _BLOCK
                for row in range(first, min(first + _BLOCK, len(free_src))):
                    if free_src[row] >= s and free_tgt[row] >= t:
                        return row
        return -1

    def take(self, row: int, s: int, t: int) -> None:
        """Places `s` and `t` tokens in `row`, which has room for them."""
        block, first = row // _BLOCK, row // _BLOCK * _BLOCK
        for free, maxima, size in ((self.src, self.block_src, s), (self.tgt, self.block_tgt, t)):
            before = free[row]
            free[row] = before - size
            if before == maxima[block]:  # the row may have held its block's largest room
                maxima[block] = max(free[first : first + _BLOCK])
        self.max_src, self.max_tgt = max(self.block_src), max(self.block_tgt)

    def add(self, free_src: int, free_tgt: int) -> None:
        """Appends a row (the last opened row, when the next one opens)."""
        if len(self.src) % _BLOCK == 0:
            self.block_src.append(free_src)
            self.block_tgt.append(free_tgt)
        else:
            self.block_src[-1] = max(self.block_src[-1], free_src)
            self.block_tgt[-1] = max(self.block_tgt[-1], free_tgt)
        self.src.append(free_src)
        self.tgt.append(free_tgt)
        self.max_src, self.max_tgt = max(self.max_src, free_src), max(self.max_tgt, free_tgt)


def _first_fit(
    pairs: Iterator[tuple[int, int]],
    rows: int,
    lengths: tuple[int, int],
    first: tuple[int, int] | None,
) -> tuple[list[int], tuple[int, int] | None]:
    """First fit of one batch: `first` (when given) in row 0, then the examples of `pairs`
    (source and target lengths) in order, until one fits no row and no row is left to open.
    A row holds `lengths` = (source, target) tokens.

    Returns the row of each example drawn, `first` included (-1: longer than a row on
    either side, left out), and the example that did not fit, which opens the next batch (None when
    `pairs` ran out). First fit tries the old rows, then the last opened row, then opens
    the next one; the exact largest free space of the old rows lets most examples skip
    them with two comparisons, which is what makes a 36M-example epoch take seconds.
    """
    src_length, tgt_length = lengths
    old = _OldRows()
    max_src = max_tgt = -1  # no old row yet
    last, last_src, last_tgt = 0, src_length, tgt_length  # row 0 is open, empty
    placed: list[int] = []
    put = placed.append
    if first is not None:
        last_src, last_tgt = src_length - first[0], tgt_length - first[1]
        put(0)
    for s, t in pairs:
        if s <= max_src and t <= max_tgt:  # only then can an old row have room
            row = old.first_with_room(s, t)
            if row >= 0:
                old.take(row, s, t)
                max_src, max_tgt = old.max_src, old.max_tgt
                put(row)
                continue
        if s <= last_src and t <= last_tgt:
            last_src, last_tgt = last_src - s, last_tgt - t
            put(last)
            continue
        # Checked only here: a too-long example never fits a row, so it always gets here.
        if s > src_length or t > tgt_length:
            put(-1)
            continue
        if last + 1 == rows:  # no row has room: the batch is complete
            return placed, (s, t)
        old.add(last_src, last_tgt)
        max_src, max_tgt = old.max_src, old.max_tgt
        last += 1
        last_src, last_tgt = src_length - s, tgt_length - t
        put(last)
    return placed, None


def _lengths_from(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, order: np.ndarray, start: int
) -> Iterator[tuple[int, int]]:
    """(source, target) length of each example of `order[start:]`, as Python ints read a
    chunk at a time (chained in C: no Python frame per example)."""
    chunks = (
        zip(
            src_lengths[order[a : a + _CHUNK]].tolist(),
            tgt_lengths[order[a : a + _CHUNK]].tolist(),
            strict=True,
        )
        for a in range(start, len(order), _CHUNK)
    )
    return itertools.chain.from_iterable(chunks)


class EpochPacker:
    """The packed batches of the examples of `order`, each packed when it is drawn.

    Packing is first fit within the open batch (see pack_examples, which is a loop over
    this): a batch depends only on where in `order` it starts, so `offset` (the position
    of the next batch's first example; ``len(order)`` at the end) is all it takes to go
    on from any batch boundary. Rows hold `length` target tokens and `source_length`
    source tokens (None: `length`). Costs the examples of one batch per batch (and converting
    the next _CHUNK lengths to Python ints every _CHUNK examples).
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        order: np.ndarray,
        rows: int,
        length: int,
        offset: int = 0,
        source_length: int | None = None,
    ) -> None:
        source_length = length if source_length is None else source_length
        if rows < 1 or length < 1 or source_length < 1:
            raise ValueError(
                f"rows and lengths must be positive, got {rows=} {length=} {source_length=}"
            )
        order = np.asarray(order)
        if not np.issubdtype(order.dtype, np.integer):
            order = order.astype(np.int64)
        if not 0 <= offset <= len(order):
            raise ValueError(f"offset {offset} is outside an order of {len(order)} examples")
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        self.order, self.rows, self.length = order, rows, length
        self.source_length = source_length
        self.offset = offset
        self._pairs = _lengths_from(self.src_lengths, self.tgt_lengths, order, offset)
        self._first: tuple[int, int] | None = None  # the example at `offset`, once drawn

    def __iter__(self) -> Iterator[PackedBatch]:
        return self

    def __next__(self) -> PackedBatch:
        """The batch starting at `offset` (its ids in `order`'s integer type, rows int32);
        StopIteration once no example that fits is left."""
        start = self.offset
        lengths = (self.source_length, self.length)
        placed, self._first = _first_fit(self._pairs, self.rows, lengths, self._first)
        self.offset = start + len(placed)
        rows = np.asarray(placed, dtype=np.int32)
        kept = rows >= 0
        if not kept.any():  # the order ran out (or only too-long examples were left)
            raise StopIteration
        return PackedBatch(self.order[start : self.offset][kept], rows[kept])


def pack_examples(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    rows: int,
    length: int,
    source_length: int | None = None,
) -> list[PackedBatch]:
    """Places the examples of `order`, in that order, into batches of `rows` rows.

    First fit within the open batch: each example goes to the first row with room on both
    sides; when no row has room, the batch is complete and the example opens the next one.
    A row holds `length` target and `source_length` (None: `length`) source tokens;
    examples longer than that on either side are left out. Only the open batch is
    searched, so the data order stays (up to a batch) the order given.
    """
    packer = EpochPacker(src_lengths, tgt_lengths, order, rows, length, 0, source_length)
    return list(packer)


def epoch_order(count: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order in which an epoch packs `count` examples: a permutation that depends only
    on (seed, epoch), or corpus order without ``shuffle``."""
    # int32 ids below 2**31 examples; shuffling them draws exactly what
    # `rng.permutation(count)` draws (its int64 arange), so the order is the same.
    order = np.arange(count, dtype=np.int32 if count <= np.iinfo(np.int32).max + 1 else np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(order)
    return order


def pack_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    rows: int,
    length: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    source_length: int | None = None,
) -> list[PackedBatch]:
    """The packed batches of one epoch, all at once (a run packs them one at a time as it
    draws them: EpochPacker over epoch_order)."""
    count = len(src_lengths)
    if count != len(tgt_lengths):
        raise ValueError(f"{count} source lengths but {len(tgt_lengths)} target")
    order = epoch_order(count, seed, epoch, shuffle)
    return pack_examples(src_lengths, tgt_lengths, order, rows, length, source_length)


def fill_rows(
    tokens: np.ndarray,
    offsets: np.ndarray,
    batch: PackedBatch,
    first_row: int,
    rows: int,
    length: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, segment ids, positions), each [rows, length] int32, of rows
    ``first_row … first_row + rows - 1`` of `batch`, for one side of the corpus (its flat
    `tokens` and `offsets`, example i being ``tokens[offsets[i]:offsets[i + 1]]``)."""
    out_tokens = np.full((rows, length), PAD_ID, dtype=np.int32)
    out_segments = np.zeros((rows, length), dtype=np.int32)
    out_positions = np.zeros((rows, length), dtype=np.int32)
    keep = (batch.rows >= first_row) & (batch.rows < first_row + rows)
    ids, row_of = batch.example_ids[keep], batch.rows[keep] - first_row
    if len(ids) == 0:
        return out_tokens, out_segments, out_positions
    # Group by row, keeping the order of placement inside each row.
    order = np.lexsort((np.arange(len(ids)), row_of))
    ids, row_of = ids[order], row_of[order]
    lengths = (offsets[ids + 1] - offsets[ids]).astype(np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    first_of_row = np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]])
    group = np.cumsum(np.r_[False, row_of[1:] != row_of[:-1]])  # index of each row's group
    offset_in_row = starts - starts[first_of_row][group]
    segment = np.arange(len(ids)) - first_of_row[group] + 1
    example = np.repeat(np.arange(len(ids)), lengths)
    position = np.arange(int(ends[-1])) - np.repeat(starts, lengths)
    columns = offset_in_row[example] + position
    if columns.max() >= length:
        raise ValueError(f"a packed row holds more than {length} tokens")
    out_tokens[row_of[example], columns] = tokens[offsets[ids][example] + position]
    out_segments[row_of[example], columns] = segment[example]
    out_positions[row_of[example], columns] = position
    return out_tokens, out_segments, out_positions
