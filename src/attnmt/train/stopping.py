"""When to checkpoint and when to stop, decided once for every process of the job.

A checkpoint and the end of training both lead into collectives (Orbax's multi-process
save, the last barrier): if one host took them a step earlier than another, the job would
hang. Steps are the same everywhere, but clocks and signals are not: each host's clock
runs on its own, and a maintenance event sends SIGTERM to some hosts only. So each process
proposes from its own clock and signal, one all-gather of a few flags shares the
proposals, and a yes from any process is everyone's. Early stopping (no improvement of
train.keep_best_by in train.early_stop_patience evaluations) is agreed the same way.

An all-gather waits for the devices (it queues behind the updates in flight) and crosses
the network, so it is not done every update: processes agree at most
train.agree_every_steps updates apart, at steps every process knows in advance (the next
one is set at each agreement, from agreed figures only), and about every
AGREE_WITHIN_SECONDS when updates are slower than that allows. A SIGTERM, a due time-based
checkpoint or the time limit is acted on at the next agreement.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from attnmt.checkpoint.manager import BEST_MODES
from attnmt.config.train import TrainConfig
from attnmt.parallel.agreement import any_and_mean

SIGTERM_REASON = "SIGTERM received"
# When updates are slow, agree about this often (seconds) rather than every
# train.agree_every_steps updates: at 3 s an update, 10 updates would let a SIGTERM wait 30
# s, a whole preemption grace period.
AGREE_WITHIN_SECONDS = 1.0


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


def early_stop_reason(train: TrainConfig) -> str:
    """The same words on every process, whichever of them proposed the stop."""
    return (
        f"early stopping: validation {train.keep_best_by} did not improve in "
        f"{train.early_stop_patience} evaluations"
    )


@dataclasses.dataclass
class BestSoFar:
    """The best `train.keep_best_by` value so far, its step, and the evaluations since."""

    metric: str  # "loss", "bleu" or "f1"
    patience: int  # 0: never exhausted
    step: int | None = None
    value: float | None = None
    since_best: int = 0

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value < self.value if BEST_MODES[self.metric] == "min" else value > self.value

    def record(self, step: int, value: float, improved: bool) -> None:
        """One evaluation at `step`; `improved` as agreed by every process."""
        if improved:
            self.step, self.value, self.since_best = step, value, 0
        else:
            self.since_best += 1

    @property
    def exhausted(self) -> bool:
        return bool(self.patience) and self.since_best >= self.patience


def best_after_resume(
    train: TrainConfig, best: tuple[int, float] | None, resumed_step: int
) -> BestSoFar:
    """What the interrupted run knew at `resumed_step`: its best (saved with the best step's
    checkpoint) and the evaluations since it, counted on the evaluation schedule (those
    after the checkpoint are run again, so they do not count)."""
    tracker = BestSoFar(train.keep_best_by, train.early_stop_patience)
    if best is None or best[0] > resumed_step:
        return tracker
    every = train.best_every_steps
    tracker.step, tracker.value = best
    tracker.since_best = resumed_step // every - best[0] // every
    return tracker


class StepDecisions:
    """The stop and time-based checkpoint decisions, agreed at the steps `due` names.

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
        self._next = 0  # the step of the next agreement (the first: wherever the run starts)
        self._agreed: tuple[int, float] | None = None  # (step, clock) of the last agreement
        # Alone, a process agrees with itself at no cost: its own signal and clock are
        # looked at after every update, and a SIGTERM stops it at the next step.
        self._alone = jax.process_count() == 1

    def due(self, step: int) -> bool:
        """Whether every process calls `at` once `step` is reached: the scheduled agreement,
        an evaluation that can exhaust the early-stopping patience, and the last step. The
        same answer on every process (it depends on the step and agreed figures only).
        A process alone also calls it whenever its own signal or clock proposes something."""
        train = self._train
        if step >= self._next or step >= train.num_steps:
            return True
        if self._alone and self._proposal(self._clock(), False).any():
            return True
        if not train.early_stop_patience:
            return False
        return step % train.best_every_steps == 0

    def checkpointed(self) -> None:
        """A checkpoint was written now: the time-based interval starts again."""
        self._last_checkpoint = self._clock()

    def at(self, step: int, early_stop: bool = False) -> Decision:
        """`early_stop`: this process's patience ran out (BestSoFar.exhausted)."""
        train, now = self._train, self._clock()
        if step >= train.num_steps:  # the same step on every process: nothing to share
            return Decision("finished", False)
        proposal = self._proposal(now, early_stop)
        # The flags and the time per update travel in one all-gather.
        flags, (seconds,) = any_and_mean(proposal, [self._seconds_per_update(step, now)])
        sigterm, out_of_time, checkpoint, patience_out = (bool(x) for x in flags)
        self._schedule(step, now, float(seconds))
        if sigterm:
            self._signal.requested = True  # this process stops for a peer's signal too
            return Decision(SIGTERM_REASON, False)
        if patience_out:  # a finished run (exit 0), so it comes before the time limit
            return Decision(early_stop_reason(train), False)
        if out_of_time:
            return Decision(f"time limit of {train.time_limit_minutes} minutes reached", False)
        return Decision("", checkpoint)

    def _proposal(self, now: float, early_stop: bool) -> np.ndarray:
        """This process's [SIGTERM, time limit reached, time-based checkpoint due, patience
        out], from its own signal handler and clock."""
        train, minutes = self._train, self._train.checkpoint_every_minutes
        return np.array(
            [
                self._signal.requested,
                bool(train.time_limit_minutes)
                and now - self._start >= 60 * train.time_limit_minutes,
                bool(minutes) and now - self._last_checkpoint >= 60 * minutes,
                early_stop,
            ]
        )

    def _seconds_per_update(self, step: int, now: float) -> float:
        """This process's time per update since the last agreement; 0 when none was timed
        (the first agreement, whose updates also compile): the same case on every process,
        as agreements fall on the same steps everywhere."""
        last = self._agreed
        if last is None or step <= last[0]:
            return 0.0
        return (now - last[1]) / (step - last[0])

    def _schedule(self, step: int, now: float, seconds: float) -> None:
        """Sets the next agreement step from `seconds`, the agreed (mean over processes)
        time per update since the last agreement: every train.agree_every_steps updates,
        fewer when that would take longer than AGREE_WITHIN_SECONDS."""
        every, last = self._train.agree_every_steps, self._agreed
        interval = 1  # no update timed yet (the first ones also compile)
        if last is not None and step > last[0]:
            interval = every if seconds <= 0 else int(AGREE_WITHIN_SECONDS // seconds)
            interval = min(max(interval, 1), every)
        if last is None or step > last[0]:
            self._agreed = (step, now)
            self._next = step + interval
