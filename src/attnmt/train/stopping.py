"""When to checkpoint and when to stop, decided once for every process of the job.

A checkpoint and the end of training both lead into collectives (Orbax's multi-process
save, the last barrier): if one host took them a step earlier than another, the job would
hang. Steps are the same everywhere, but clocks and signals are not: each host's clock
runs on its own, and a maintenance event sends SIGTERM to some hosts only. So each process
proposes from its own clock and signal, one all-gather of a few flags per update shares
the proposals, and a yes from any process is everyone's.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from attnmt.config.train import TrainConfig
from attnmt.parallel.agreement import any_process

SIGTERM_REASON = "SIGTERM received"


class StopSignal:
    """Turns SIGTERM (a preemption notice) into a request to checkpoint and stop.

    Installed in every process: with several, the request reaches the others through
    `StepDecisions` (it replaces the handler of JAX's preemption service, whose agreement
    this one does instead, tested with local processes).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopSignal:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler, no preemption support
            self._previous = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        del signum, frame
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@dataclasses.dataclass(frozen=True)
class Decision:
    stop: str  # why training stops now; "" to go on
    checkpoint: bool  # a time-based checkpoint is due (step-based ones need no agreement)


class StepDecisions:
    """The stop and time-based checkpoint decisions at each update boundary, agreed.

    `clock` is seconds on a monotonic clock (time.monotonic; tests give each process a
    different one). The time limit counts from the decisions' creation.
    """

    def __init__(
        self,
        train: TrainConfig,
        stop_signal: StopSignal,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._train, self._signal = train, stop_signal
        self._clock = clock or (lambda: time.monotonic())
        self._start = self._last_checkpoint = self._clock()

    def checkpointed(self) -> None:
        """A checkpoint was written now: the time-based interval starts again."""
        self._last_checkpoint = self._clock()

    def at(self, step: int) -> Decision:
        train, now = self._train, self._clock()
        if step >= train.num_steps:  # the same step on every process: nothing to share
            return Decision("finished", False)
        minutes = train.checkpoint_every_minutes
        proposal = np.array(
            [
                self._signal.requested,
                bool(train.time_limit_minutes)
                and now - self._start >= 60 * train.time_limit_minutes,
                bool(minutes) and now - self._last_checkpoint >= 60 * minutes,
            ]
        )
        sigterm, out_of_time, checkpoint = (bool(x) for x in any_process(proposal))
        if sigterm:
            self._signal.requested = True  # this process stops for a peer's signal too
            return Decision(SIGTERM_REASON, False)
        if out_of_time:
            return Decision(f"time limit of {train.time_limit_minutes} minutes reached", False)
        return Decision("", checkpoint)
