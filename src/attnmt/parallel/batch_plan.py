"""Automatic token budget: the paper's batch at any device count, in the same order.

The paper's update sees ≈25k source + 25k target tokens. The iterator draws each update's
sentences from bucket shapes that depend on the token budget alone (and on
`data.batch_multiple`), never on the device count, so the data order is the same on 1, 8
or 64 devices. When the devices cannot hold an update at once, it is split row-wise into
micro-batches whose gradients are summed before one optimizer step; all-padding rows fill
a micro-batch up to a whole number of rows per device (they weigh nothing in the loss).
"""

from __future__ import annotations

import dataclasses
import math

from attnmt.errors import ConfigError

Shape = tuple[int, int]  # (sentences, tokens per sentence)


def micro_batch_rows(rows: int, parts: int, multiple: int) -> int:
    """Rows of each of `parts` equal micro-batches holding `rows` rows, a multiple of
    `multiple` (the devices they are split over)."""
    return math.ceil(math.ceil(rows / parts) / multiple) * multiple


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    update_shapes: list[Shape]  # global sentences per update: what the iterator draws
    accumulation_steps: int  # micro-batches per update
    micro_shapes: list[Shape]  # global sentences per micro-batch: what a step compiles
    batch_shards: int  # devices a batch is split over (data × fsdp)
    processes: int  # each feeds its own rows of every batch

    @property
    def rows_multiple(self) -> int:
        """Rows of a process's part of a micro-batch are a multiple of this."""
        return self.batch_shards // self.processes

    def process_micro_rows(self, update_rows: int) -> int:
        """Rows of this process's part of each micro-batch, given its part of the update."""
        return micro_batch_rows(update_rows, self.accumulation_steps, self.rows_multiple)

    @property
    def max_tokens_per_device(self) -> int:
        """Padded tokens per side one device holds at once, over every bucket."""
        return max(b // self.batch_shards * length for b, length in self.micro_shapes)

    def describe(self) -> str:
        update = max(b * length for b, length in self.update_shapes)
        return (
            f"batch plan: up to {update:,} tokens per side per update = "
            f"{self.accumulation_steps} micro-batch(es) × {self.batch_shards} device(s) × "
            f"at most {self.max_tokens_per_device:,} tokens"
        )


def plan_batches(
    update_shapes: list[Shape],
    batch_shards: int,
    processes: int = 1,
    max_tokens_per_device: int = 0,
    accumulation_steps: int = 1,
) -> BatchPlan:
    """The fewest micro-batches (at least `accumulation_steps`) for which no device holds
    more than `max_tokens_per_device` padded tokens per side at once (0 = no limit)."""
    if batch_shards <= 0 or processes <= 0 or batch_shards % processes:
        raise ConfigError(
            f"the batch is split over {batch_shards} devices, which {processes} processes "
            "cannot share evenly (parallel.* mesh sizes)"
        )
    bad = [b for b, _ in update_shapes if b % processes]
    if bad:
        raise ConfigError(
            f"batch sizes {bad} do not split over {processes} processes: make "
            f"data.batch_multiple a multiple of {processes}"
        )
    longest = max(length for _, length in update_shapes)
    if max_tokens_per_device and longest > max_tokens_per_device:
        raise ConfigError(
            f"train.max_tokens_per_device={max_tokens_per_device} is below one sentence of "
            f"the longest bucket ({longest} tokens; data.max_length)"
        )
    local = batch_shards // processes
    steps = max(accumulation_steps, 1)
    while True:
        micro = [
            (micro_batch_rows(b // processes, steps, local) * processes, length)
            for b, length in update_shapes
        ]
        plan = BatchPlan(list(update_shapes), steps, micro, batch_shards, processes)
        if not max_tokens_per_device or plan.max_tokens_per_device <= max_tokens_per_device:
            return plan
        steps += 1
