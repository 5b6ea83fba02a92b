"""How many sentences one decoding batch may hold: as many as decode.batch_sentences asks,
fewer when XLA's analysis of the compiled search says they would not fit.

A beam search holds every beam's self-attention caches, up to input length + max_len_offset
positions, and the reordered copies of them; with the parser's beam 21 and outputs of input
+ 300 a batch of 64 long sentences needs ≈11 GiB, and a decode killed for memory loses its
work with no message. The search is compiled for the longest inputs first (the compile that
decoding them needs anyway, which JAX then reuses) and its peak compared with
decode.memory_fraction of what the device offers; on a CPU all devices share the host's
memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from attnmt.parallel.memory import (
    NoMemoryAnalysisError,
    compiled_peak_bytes,
    compiled_stats,
    device_memory_limit,
    format_bytes,
    shared_limit,
)


def per_device_budget(
    fraction: float, devices: list[jax.Device], reserved_bytes: int = 0
) -> tuple[int | None, str]:
    """(bytes one device's share of a batch may take, where the figure comes from).

    `reserved_bytes` per device stay held by someone else while decoding runs (training's
    state, when BLEU is measured during training): the budget is the smaller of the
    fraction of the device and what that leaves free."""
    limit, where = shared_limit(*device_memory_limit(devices[0]), devices)
    if limit is None or fraction <= 0:
        return None, where
    if reserved_bytes <= 0:
        return int(fraction * limit), where
    where = f"{where}, less {format_bytes(reserved_bytes)} held by training"
    return max(0, min(int(fraction * limit), limit - reserved_bytes)), where


def fitting_sentences(
    compile_rows: Callable[[int], Any],
    sentences: int,
    shards: int,
    budget: int,
    warn: Callable[[str], None],
    what: str,
) -> int:
    """The most sentences per batch, a multiple of `shards` and at most `sentences`, whose
    compiled search (`compile_rows(n)`, on the longest inputs) fits in `budget` bytes per
    device; at least `shards` (one per device), with a warning if even that does not fit.
    `what` describes the batch (inputs, beam) for the warning."""
    rows = sentences
    first_peak = None
    while True:
        try:
            compiled = compile_rows(rows)
            peak = compiled_peak_bytes(compiled)
        except NoMemoryAnalysisError:
            return rows
        except jax.errors.JaxRuntimeError as error:
            # Some compilers (TPU) refuse at compile time a program that cannot fit.
            if "RESOURCE_EXHAUSTED" not in str(error) or rows <= shards:
                raise
            rows = max(shards, rows // 2 // shards * shards)
            continue
        first_peak = first_peak or peak
        if peak <= budget:
            break
        if rows <= shards:
            warn(
                f"warning: decoding {rows} sentence(s) per batch ({what}) needs "
                f"{format_bytes(peak)} per device, more than the budget of "
                f"{format_bytes(budget)} (decode.memory_fraction); it may run out of memory"
            )
            return rows
        # The parameters (arguments) stay; the caches and temporaries scale with the rows.
        fixed = compiled_stats(compiled).argument_size_in_bytes
        scaled = int(rows * max(budget - fixed, 0) / max(peak - fixed, 1))
        rows = max(shards, min(rows - shards, scaled // shards * shards))
    if rows < sentences:
        need = f"{format_bytes(first_peak)} per device" if first_peak else "more than fits"
        warn(
            f"decoding {rows} sentences per batch instead of {sentences} ({what}): "
            f"{sentences} would need {need}, more than the budget of {format_bytes(budget)} "
            "(decode.memory_fraction)"
        )
    return rows


def agreed(rows: int) -> int:
    """The smallest of every process's `rows`: all processes must decode the same batches."""
    if jax.process_count() == 1:
        return rows
    return int(np.min(multihost_utils.process_allgather(np.int32(rows))))
