"""Where metrics go: TensorBoard event files in the workdir, log lines, a progress bar.

For a workdir in a bucket the event files are written to a local staging folder and each
one is uploaded whole after every flush (and at close). tensorboardX's own `gs://` writer
would do the same (it re-uploads its whole buffer per flush) but only for gs:// and s3://,
through another client; staging keeps one path, etils.epath, for every remote scheme, and
a killed run loses at most the scalars since its last log line.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import tempfile
import types
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from attnmt.storage import Path, is_remote, upload_tree

log = logging.getLogger("attnmt.train")


def tensorboardx() -> types.ModuleType:
    """tensorboardX, imported without torch. Its writer module imports torch when it is
    installed (as with the `hf` extra: 1.3 s of every `attnmt` start here) only to accept
    torch tensors, which attnmt never logs; torch stays importable afterwards."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return importlib.import_module("tensorboardX")
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` → ImportError
    try:
        return importlib.import_module("tensorboardX")
    finally:
        del sys.modules["torch"]


class MetricsSink:
    """Writes scalars to `<workdir>/tensorboard/<split>` and a one-line summary to the log."""

    def __init__(self, workdir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._writers: dict[str, Any] = {}  # split → tensorboardX.SummaryWriter
        self._root = workdir / "tensorboard"
        self._stage = None
        if enabled and is_remote(self._root):
            self._stage = tempfile.mkdtemp(prefix="attnmt-tensorboard-")

    def _local(self, split: str) -> str:
        return os.path.join(self._stage, split) if self._stage else os.fspath(self._root / split)

    def write(self, split: str, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if split not in self._writers:
            self._writers[split] = tensorboardx().SummaryWriter(self._local(split))
        writer = self._writers[split]
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)
        writer.flush()
        if self._stage:
            upload_tree(self._local(split), self._root / split)
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())
        log.info("[%s] step %d %s", split, step, shown)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        if self._stage:
            for split in self._writers:
                upload_tree(self._local(split), self._root / split)
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None
        self._writers = {}


def _fmt(value: float) -> str:
    if abs(value) >= 1000 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.4g}"


def progress_bar(total: int, start: int) -> Progress:
    """A console bar with ETA; silent when stderr is not a terminal (CI, log files)."""
    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not sys.stderr.isatty(),
        transient=False,
    )
    progress.add_task("train", total=total, completed=start, status="")
    return progress
