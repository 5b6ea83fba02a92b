"""A jax.profiler trace of chosen training updates."""

from __future__ import annotations

import logging
import shutil
import tempfile

import jax

from attnmt.storage import Path, is_remote, upload_tree

log = logging.getLogger("attnmt.train")


class Profiler:
    """A jax.profiler trace of updates [first, first + count) into `directory` (TensorBoard's
    profile tab reads it). The trace ends after the device finished the last traced update.

    jax's profiler writes through its own filesystem layer, so a trace for a bucket is
    written to a local folder and uploaded when it ends."""

    def __init__(self, directory: Path, first: int, count: int) -> None:
        self.directory, self.first, self.count = directory, first, count
        self.active = False
        self._local: str | None = None

    def before_update(self, step: int) -> None:
        if self.count and not self.active and self.first <= step < self.first + self.count:
            if is_remote(self.directory):
                self._local = tempfile.mkdtemp(prefix="attnmt-profile-")
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(self._local or str(self.directory))
            self.active = True
            log.info(
                "profiling updates %d-%d into %s", step + 1, self.first + self.count, self.directory
            )

    def after_update(self, step: int) -> None:
        # `step` came from the device, so the traced updates have finished.
        if self.active and step >= self.first + self.count:
            self._stop()
            log.info("profile written to %s", self.directory)

    def _stop(self) -> None:
        jax.profiler.stop_trace()
        self.active = False
        if self._local is not None:
            upload_tree(self._local, self.directory)
            shutil.rmtree(self._local, ignore_errors=True)
            self._local = None

    def close(self) -> None:
        if self.active:
            self._stop()
