"""Packing: several examples per row of a fixed [rows, length] batch (data.pack_length).

Length buckets pad every example up to its bucket's length and compile one program per
bucket; on Multi30K that left about a fifth of every batch as padding. Packing fills rows
end to end instead: one shape, one compiled step, and padding only where no further
example fits. The model keeps each example to itself through segment ids (attention only
within a segment) and per-example positions (attnmt.common), so a packed example is
computed exactly as it would be in a row of its own.
"""

from __future__ import annotations

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


# Examples placed per pass of the Python loop: their lengths become Python lists (small
# ints are shared objects, so 8 bytes per length), bounding memory at any corpus size.
_CHUNK = 1 << 20
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


class _OpenBatch:
    """The batch being filled, as first fit sees it: old rows, the last opened row, and
    empty rows after it. First fit tries the old rows, then the last row, then opens the
    next one. The exact largest free space of the old rows lets most examples skip them
    with two comparisons; that is what makes a 36M-example epoch take seconds, not minutes.
    """

    def __init__(self, rows: int, length: int) -> None:
        self.rows, self.length = rows, length
        self.old = _OldRows()
        self.last_src = self.last_tgt = length

    def place(self, src: list[int], tgt: list[int], first: int, starts: list[int]) -> list[int]:
        """The row of each example (examples ``first, first + 1, …`` of the packing), in
        order; appends to `starts` the position of each example that opens a batch."""
        old, rows, length = self.old, self.rows, self.length
        max_src, max_tgt, last_src, last_tgt = (
            old.max_src,
            old.max_tgt,
            self.last_src,
            self.last_tgt,
        )
        placed: list[int] = []
        put = placed.append
        last = len(old.src)  # the last opened row
        for s, t in zip(src, tgt, strict=True):
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
            if last + 1 == rows:  # no row has room: the batch is complete
                starts.append(first + len(placed))
                old, last = _OldRows(), 0
            else:
                old.add(last_src, last_tgt)
                last += 1
            max_src, max_tgt = old.max_src, old.max_tgt
            last_src, last_tgt = length - s, length - t
            put(last)
        self.old, self.last_src, self.last_tgt = old, last_src, last_tgt
        return placed


def pack_examples(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, order: np.ndarray, rows: int, length: int
) -> list[PackedBatch]:
    """Places the examples of `order`, in that order, into batches of `rows` rows.

    First fit within the open batch: each example goes to the first row with room on both
    sides; when no row has room, the batch is complete and the example opens the next one.
    Examples longer than `length` on either side are left out. Only the open batch is
    searched, so the data order stays (up to a batch) the order given.

    The batches' arrays are views of two flat arrays (ids in `order`'s integer type, rows
    int32): one object per batch, none per example.
    """
    if rows < 1 or length < 1:
        raise ValueError(f"rows and length must be positive, got {rows=} {length=}")
    order = np.asarray(order)
    if not np.issubdtype(order.dtype, np.integer):
        order = order.astype(np.int64)
    src = np.asarray(src_lengths)[order]
    tgt = np.asarray(tgt_lengths)[order]
    fits = (src <= length) & (tgt <= length)
    ids, src, tgt = order[fits], src[fits], tgt[fits]
    batch, starts = _OpenBatch(rows, length), [0]
    placed = np.empty(len(ids), dtype=np.int32)
    for first in range(0, len(ids), _CHUNK):
        last = first + _CHUNK
        placed[first:last] = batch.place(
            src[first:last].tolist(), tgt[first:last].tolist(), first, starts
        )
    ends = [*starts[1:], len(ids)]
    return [PackedBatch(ids[a:b], placed[a:b]) for a, b in zip(starts, ends, strict=True) if b > a]


def pack_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    rows: int,
    length: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[PackedBatch]:
    """The packed batches of one epoch: examples in an order that depends only on (seed,
    epoch) (or in corpus order without ``shuffle``)."""
    count = len(src_lengths)
    if count != len(tgt_lengths):
        raise ValueError(f"{count} source lengths but {len(tgt_lengths)} target")
    # int32 ids below 2**31 examples; shuffling them draws exactly what
    # `rng.permutation(count)` draws (its int64 arange), so the order is the same.
    order = np.arange(count, dtype=np.int32 if count <= np.iinfo(np.int32).max + 1 else np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(order)
    return pack_examples(src_lengths, tgt_lengths, order, rows, length)


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
