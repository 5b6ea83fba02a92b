"""Length buckets under a token budget, and the per-epoch plan of which examples go where.

A small fixed set of (batch_size, length) shapes keeps the number of compiled programs
small; each shape holds about the same number of tokens, as in the paper's batches of
roughly 25k source and 25k target tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Lengths are multiples of 8 so that padded arrays tile well on accelerators.
LENGTH_MULTIPLE = 8


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def bucket_lengths(max_length: int, min_length: int = 8, growth: float = 1.25) -> list[int]:
    """Bucket lengths growing about geometrically from ``min_length`` to ``max_length``.

    All are multiples of 8; the last is ``max_length`` rounded up to a multiple of 8.
    """
    if max_length < 1 or min_length < 1:
        raise ValueError(f"lengths must be positive, got {min_length=} {max_length=}")
    if growth <= 1.0:
        raise ValueError(f"growth must be > 1, got {growth}")
    last = _round_up(max_length, LENGTH_MULTIPLE)
    length = min(_round_up(min_length, LENGTH_MULTIPLE), last)
    lengths = []
    while length < last:
        # Skip a bucket barely shorter than the last one: it would cost a compiled shape
        # while saving almost no padding.
        if length * growth**0.5 < last:
            lengths.append(length)
        nearest = round(length * growth / LENGTH_MULTIPLE) * LENGTH_MULTIPLE
        length = max(length + LENGTH_MULTIPLE, nearest)
    lengths.append(last)
    return lengths


def bucket_shapes(
    max_length: int,
    tokens_per_batch: int,
    min_length: int = 8,
    growth: float = 1.25,
    batch_multiple: int = 8,
) -> list[tuple[int, int]]:
    """(batch_size, length) shapes, shortest first, each holding ≤ ``tokens_per_batch``.

    ``tokens_per_batch`` is the budget per side: padded source tokens and padded target
    tokens each stay within it. Batch sizes are multiples of ``batch_multiple``.
    """
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
    if tokens_per_batch < 1:
        raise ValueError(f"tokens_per_batch must be >= 1, got {tokens_per_batch}")
    shapes = []
    for length in bucket_lengths(max_length, min_length, growth):
        batch_size = tokens_per_batch // length // batch_multiple * batch_multiple
        if batch_size < batch_multiple:
            raise ValueError(
                f"tokens_per_batch={tokens_per_batch} is too small for a batch of "
                f"{batch_multiple} rows of length {length} ({batch_multiple * length} tokens); "
                "raise tokens_per_batch, or lower max_length or batch_multiple"
            )
        shapes.append((batch_size, length))
    return shapes


@dataclass(frozen=True, eq=False)
class PlannedBatch:
    """One batch of an epoch: which shape it uses and which examples fill its rows."""

    shape_index: int
    example_ids: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlannedBatch):
            return NotImplemented
        return self.shape_index == other.shape_index and np.array_equal(
            self.example_ids, other.example_ids
        )

    __hash__ = None  # type: ignore[assignment]  # holds an array: equal but not hashable


def _smallest_int(limit: int) -> type:
    """int16 or int32 or int64: the smallest that holds every value up to ``limit``."""
    for dtype in (np.int16, np.int32):
        if limit <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def assign_buckets(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, shapes: list[tuple[int, int]]
) -> np.ndarray:
    """Index of the smallest shape that fits each example, or ``len(shapes)`` if none does."""
    lengths = np.asarray([length for _, length in shapes])
    if len(lengths) == 0 or np.any(np.diff(lengths) <= 0):
        raise ValueError(f"shapes must be non-empty with increasing lengths, got {shapes}")
    # One lookup per example in a table indexed by length, in the smallest integer type:
    # at 36M examples a searchsorted per example would make a 288 MB int64 array.
    longest = int(lengths[-1])
    table = np.searchsorted(lengths, np.arange(longest + 2), side="left")
    table = table.astype(_smallest_int(len(shapes)))
    need = np.maximum(np.asarray(src_lengths), np.asarray(tgt_lengths))
    return table[np.clip(need, 0, longest + 1)]


def plan_epoch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    shapes: list[tuple[int, int]],
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[PlannedBatch]:
    """Groups examples into batches for one epoch.

    Lengths include EOS. Each example goes to the smallest bucket that fits both sides;
    examples that fit no bucket are left out. With ``shuffle`` the order within buckets
    and of batches depends only on (seed, epoch); without, it is sorted by length.
    The last batch of a bucket may hold fewer examples than its batch size.

    The batches' ``example_ids`` are views of one array per bucket (int32 below 2**31
    examples): at 36M examples the plan holds 144 MB of ids and one object per batch.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target")
    buckets = assign_buckets(src_lengths, tgt_lengths, shapes)
    ids_type = np.int32 if len(buckets) <= np.iinfo(np.int32).max + 1 else np.int64
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    plans = []
    for index, (batch_size, _) in enumerate(shapes):
        # Increasing ids: the order a stable sort by bucket gives, which the shuffle (or
        # the sort by length) starts from.
        members = np.flatnonzero(buckets == index).astype(ids_type)
        if rng is not None:
            # In place; the same draws as `rng.permutation(members)`, without its copy.
            rng.shuffle(members)
        else:
            need = np.maximum(np.asarray(src_lengths)[members], np.asarray(tgt_lengths)[members])
            members = members[np.argsort(need, kind="stable")]
        plans.extend(
            PlannedBatch(index, members[start : start + batch_size])
            for start in range(0, len(members), batch_size)
        )
    if rng is not None:
        plans = [plans[i] for i in rng.permutation(len(plans))]
    return plans
