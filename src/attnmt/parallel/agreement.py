"""Small host-side values combined over every process of the job (one all-gather each).

Used where processes must act alike (stop, checkpoint) or report the job as a whole
(tokens per second over all hosts). With one process nothing is communicated.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def _gathered(values: np.ndarray) -> np.ndarray:
    """[processes, n]: every process's `values` (1-D), in process order."""
    gathered = multihost_utils.process_allgather(values)
    return np.asarray(gathered).reshape(jax.process_count(), -1)


def any_process(flags: np.ndarray) -> np.ndarray:
    """Element-wise OR of `flags` (bool[n]) over all processes."""
    flags = np.asarray(flags, bool)
    if jax.process_count() == 1:
        return flags
    return _gathered(flags.astype(np.int32)).any(axis=0)


def sum_over_processes(values: np.ndarray) -> np.ndarray:
    """Element-wise sum of `values` (float[n]) over all processes, in float64."""
    values = np.asarray(values, np.float64)
    if jax.process_count() == 1:
        return values
    # float32 on the wire (x64 is off): 7 significant digits, plenty for the throughput
    # figures summed here.
    return _gathered(values.astype(np.float32)).astype(np.float64).sum(axis=0)


def any_and_mean(flags: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`any_process(flags)` and the element-wise mean of `values` (float[n]) over all
    processes, the same on each, in one all-gather: one round trip where a decision needs
    both."""
    flags, values = np.asarray(flags, bool), np.asarray(values, np.float64)
    if jax.process_count() == 1:
        return flags, values
    # float32 on the wire: exact for the 0/1 flags, 7 digits for the values.
    both = np.concatenate([flags.astype(np.float32), values.astype(np.float32)])
    gathered = _gathered(both)
    n = flags.size
    return gathered[:, :n].any(axis=0), gathered[:, n:].astype(np.float64).mean(axis=0)
