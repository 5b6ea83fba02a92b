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


def pack_examples(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, order: np.ndarray, rows: int, length: int
) -> list[PackedBatch]:
    """Places the examples of `order`, in that order, into batches of `rows` rows.

    First fit within the open batch: each example goes to the first row with room on both
    sides; when no row has room, the batch is complete and the example opens the next one.
    Examples longer than `length` on either side are left out. Only the open batch is
    searched, so the data order stays (up to a batch) the order given.
    """
    if rows < 1 or length < 1:
        raise ValueError(f"rows and length must be positive, got {rows=} {length=}")
    src_lengths = np.asarray(src_lengths)
    tgt_lengths = np.asarray(tgt_lengths)
    batches: list[PackedBatch] = []
    free_src = np.full(rows, length, dtype=np.int64)
    free_tgt = np.full(rows, length, dtype=np.int64)
    ids: list[int] = []
    placed_rows: list[int] = []
    for example in np.asarray(order, dtype=np.int64):
        s, t = int(src_lengths[example]), int(tgt_lengths[example])
        if s > length or t > length:
            continue
        fits = np.flatnonzero((free_src >= s) & (free_tgt >= t))
        if len(fits) == 0:
            batches.append(PackedBatch(np.asarray(ids, np.int64), np.asarray(placed_rows)))
            ids, placed_rows = [], []
            free_src[:] = length
            free_tgt[:] = length
            fits = np.zeros(1, dtype=np.int64)
        row = int(fits[0])
        free_src[row] -= s
        free_tgt[row] -= t
        ids.append(int(example))
        placed_rows.append(row)
    if ids:
        batches.append(PackedBatch(np.asarray(ids, np.int64), np.asarray(placed_rows)))
    return batches


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
    order = np.random.default_rng([seed, epoch]).permutation(count) if shuffle else np.arange(count)
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
