"""Automatic token budget: the same effective batch at any device count.

The paper's step sees ≈25k source + 25k target tokens. With few or small devices that
does not fit at once, so each optimizer step accumulates gradients over micro-batches;
with many devices each holds a slice. The plan keeps micro-batch × shards × accumulation
equal to the target (up to rounding down to whole sentences).
"""

from __future__ import annotations

import dataclasses
import math

from attnmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    global_tokens: int  # per side, per optimizer step (target)
    batch_shards: int  # devices the batch is split over (data × fsdp)
    accumulation_steps: int
    micro_batch_tokens: int  # per side, global, per micro-batch
    tokens_per_device: int  # per side, per device, per micro-batch

    def describe(self) -> str:
        return (
            f"batch plan: {self.global_tokens:,} tokens per side per update = "
            f"{self.accumulation_steps} micro-batch(es) × {self.batch_shards} device(s) × "
            f"{self.tokens_per_device:,} tokens"
        )


def plan_batches(
    global_tokens: int,
    batch_shards: int,
    max_tokens_per_device: int = 0,
    accumulation_steps: int = 1,
) -> BatchPlan:
    """Chooses gradient accumulation so no device sees more than `max_tokens_per_device`
    tokens per side at once (0 = no limit: use `accumulation_steps` as configured)."""
    if batch_shards <= 0 or global_tokens <= 0:
        raise ConfigError("data.tokens_per_batch and the device count must be positive")
    if max_tokens_per_device > 0:
        accumulation_steps = max(
            accumulation_steps, math.ceil(global_tokens / (batch_shards * max_tokens_per_device))
        )
    micro = global_tokens // accumulation_steps
    per_device = micro // batch_shards
    if per_device == 0:
        raise ConfigError(
            f"data.tokens_per_batch={global_tokens} is too small for {batch_shards} devices × "
            f"{accumulation_steps} accumulation steps"
        )
    return BatchPlan(global_tokens, batch_shards, accumulation_steps, micro, per_device)
