"""Where metrics go: TensorBoard event files in the workdir, log lines, a progress bar."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from tensorboardX import SummaryWriter

log = logging.getLogger("attnmt.train")


class MetricsSink:
    """Writes scalars to `<workdir>/tensorboard/<split>` and a one-line summary to the log."""

    def __init__(self, workdir: str | Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._writers: dict[str, SummaryWriter] = {}
        self._root = Path(workdir) / "tensorboard"

    def write(self, split: str, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if split not in self._writers:
            self._writers[split] = SummaryWriter(str(self._root / split))
        writer = self._writers[split]
        for name, value in scalars.items():
            writer.add_scalar(name, value, step)
        writer.flush()
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())
        log.info("[%s] step %d %s", split, step, shown)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


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
