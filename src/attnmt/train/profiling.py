"""A jax.profiler trace of chosen training updates."""

from __future__ import annotations

import logging
from pathlib import Path

import jax

log = logging.getLogger("attnmt.train")


class Profiler:
    """A jax.profiler trace of updates [first, first + count) into `directory` (TensorBoard's
    profile tab reads it). The trace ends after the device finished the last traced update."""

    def __init__(self, directory: Path, first: int, count: int) -> None:
        self.directory, self.first, self.count = directory, first, count
        self.active = False

    def before_update(self, step: int) -> None:
        if self.count and not self.active and self.first <= step < self.first + self.count:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True
            log.info(
                "profiling updates %d-%d into %s", step + 1, self.first + self.count, self.directory
            )

    def after_update(self, step: int) -> None:
        # `step` came from the device, so the traced updates have finished.
        if self.active and step >= self.first + self.count:
            jax.profiler.stop_trace()
            self.active = False
            log.info("profile written to %s", self.directory)

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
