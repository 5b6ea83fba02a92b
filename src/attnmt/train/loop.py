"""Training orchestration: iterate, step, log, evaluate, checkpoint, stop. No math here."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import numpy as np

from attnmt.checkpoint.ema_state import find_ema_params
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.model import ModelConfig
from attnmt.data.pipeline import padding_fraction, split_batch
from attnmt.decode.evaluation import ranked_bleu
from attnmt.metrics import MetricsSink, progress_bar
from attnmt.model.flops import example_lengths, train_flops
from attnmt.parallel.agreement import any_process, sum_over_processes
from attnmt.parallel.sharding import put_batch
from attnmt.train import step as steps
from attnmt.train.inputs import TrainInputs
from attnmt.train.prefetch import Prefetcher
from attnmt.train.profiling import Profiler
from attnmt.train.program import TrainProgram
from attnmt.train.stopping import (
    SIGTERM_REASON,
    BestSoFar,
    Decision,
    StepDecisions,
    StopSignal,
)
from attnmt.train.validation import Validation

log = logging.getLogger("attnmt.train")

# 128 + SIGTERM, what a shell reports for a process SIGTERM killed: job schedulers read it
# as "did not finish" and restart the job, which then resumes from the checkpoint.
EXIT_PREEMPTED = 143


@dataclasses.dataclass
class TrainResult:
    step: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    stopped_because: str
    exit_code: int = 0  # EXIT_PREEMPTED after a SIGTERM: the run is to be resumed
    best_step: int | None = None  # train.keep_best_by: the best step kept (`--step best`)
    best_value: float | None = None


@dataclasses.dataclass(frozen=True)
class BatchFigures:
    """What the log counts of one update's batch (this process's rows): computed on the
    prefetch thread, off the loop's path."""

    tokens: float  # real (non-pad) target tokens
    flops: float  # model FLOPs of the real tokens (attnmt.model.flops.train_flops)
    padding: float  # padding_fraction

    @classmethod
    def of(cls, batch: dict[str, np.ndarray], model: ModelConfig) -> BatchFigures:
        return cls(
            float(np.count_nonzero(batch["tgt_tokens"])),
            train_flops(model, *example_lengths(batch)),
            padding_fraction(batch),
        )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One update's input, made ready on the prefetch thread."""

    batch: dict[str, np.ndarray]  # this process's rows of the update, on the host
    placed: list[dict[str, jax.Array]]  # its micro-batches, on the devices
    figures: BatchFigures


@dataclasses.dataclass
class _Window:
    """What happened since the last log line (metrics stay on device until then)."""

    metrics: list[dict[str, jax.Array]] = dataclasses.field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0  # model FLOPs of the real tokens (attnmt.model.flops.train_flops)
    padding: float = 0.0
    batches: int = 0
    start: float = dataclasses.field(default_factory=time.monotonic)

    def add(self, figures: BatchFigures, metrics: dict[str, jax.Array]) -> None:
        self.tokens += figures.tokens
        self.flops += figures.flops
        self.padding += figures.padding
        self.batches += 1
        self.metrics.append(metrics)


class Trainer:
    """The loop over a run (`run()`): iterate, step, log, evaluate, checkpoint, stop.

    It builds nothing: the compiled program, the inputs, the state to start from, where
    checkpoints and metrics go and what validation measures are given to it
    (`attnmt.train.assemble.build_trainer` wires them for a workdir).
    """

    def __init__(
        self,
        program: TrainProgram,
        inputs: TrainInputs,
        state: steps.TrainState,
        checkpoints: CheckpointManager,
        metrics: MetricsSink,
        validation: Validation,
        best: BestSoFar | None = None,
    ) -> None:
        self.program = program
        self.experiment = program.experiment
        self.mesh = program.mesh
        self.train_batches = inputs.train_batches
        self.plan = inputs.plan
        self.state = state
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.validation = validation
        train = self.experiment.train
        # train.keep_best_by: what was best so far (a resumed run's comes from assemble).
        self.best = best
        if train.keep_best_by and best is None:
            self.best = BestSoFar(train.keep_best_by, train.early_stop_patience)
        self.profiler = Profiler(
            inputs.workdir / "profile", train.profile_first_step, train.profile_num_steps
        )
        # What the newest log line and evaluation said (TrainResult reports them).
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self._window = _Window()
        # The loop's view of the run (run() sets them): the step and consecutive skips of
        # the newest update read from the device, the outcomes (`skipped` metrics) of the
        # updates dispatched but not read yet, oldest first, and the data position after
        # the last batch the loop consumed (what a checkpoint saves; the prefetcher has
        # drawn further).
        self._step, self._consecutive = 0, 0
        self._pending: list[jax.Array] = []
        self._position: dict[str, Any] | None = None
        self._feed: Prefetcher[Prepared] | None = None
        self._decisions: StepDecisions | None = None

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The micro-batch shapes: what the steps compile."""
        return self.plan.micro_shapes

    @property
    def accumulation_steps(self) -> int:
        return self.plan.accumulation_steps

    def _one_update(self, batches: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
        if len(batches) == 1:
            self.state, metrics = self.program.train_step(self.state, batches[0])
            return metrics
        step_rng = jax.random.fold_in(self.state.dropout_rng, self.state.step)
        grad_sums, sums = None, None
        for index, batch in enumerate(batches):
            grads, micro = self.program.grad_step(
                self.state.params, batch, jax.random.fold_in(step_rng, index), self.state.step
            )
            if grad_sums is None:
                grad_sums, sums = grads, micro
            else:
                grad_sums, sums = self.program.add((grad_sums, sums), (grads, micro))
        self.state, metrics = self.program.apply_step(self.state, grad_sums, sums)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy on the whole evaluation split (no dropout); with
        optim.ema_decay also the moving average's, as ema_loss, ema_nll, …"""
        figures = self.validation.loss(self.state.params)
        average = find_ema_params(self.state.opt_state)
        if average is not None:
            figures.update({f"ema_{k}": v for k, v in self.validation.loss(average).items()})
        return figures

    @property
    def _scored(self) -> str:
        """ "ema_" when the run keeps a moving average: then what the run is for (the
        average: train.test_at_end, `--ema`) is what BLEU and F1 during training decode and
        what train.keep_best_by ranks; "" otherwise."""
        return "ema_" if self.experiment.optim.ema_decay > 0 else ""

    def _scored_params(self) -> Any:
        if self._scored:
            return find_ema_params(self.state.opt_state)
        return self.state.params

    def _prefixed(self, figures: dict[str, float]) -> dict[str, float]:
        return {self._scored + name: value for name, value in figures.items()}

    def _save(self, metric: float | None = None) -> bool:
        """Checkpoints the state and the data position after the last update drawn; False
        when nothing was written (mid-way through skipped updates, or saved already).
        `metric`: the step's train.keep_best_by value, when it is a new best."""
        step, skipping = (
            int(x) for x in jax.device_get((self.state.step, self.state.skipped_steps))
        )
        if skipping:
            # Mid-way through non-finite updates: the last good checkpoint stays the newest.
            log.info("no checkpoint at step %d: the last %d updates were skipped", step, skipping)
            return False
        if step in self.checkpoints.all_steps():
            return False
        # The metric is passed only when there is one: the plain call is what wrappers of
        # CheckpointManager.save (tests/parallel/probe.py) expect.
        best = {} if metric is None else {"metric": metric}
        position = self._position or self.train_batches.get_state()
        self.checkpoints.save(step, self.state, position, self.experiment.to_dict(), **best)
        return True

    def _track_best(self, step: int, value: float) -> bool:
        """Records an evaluation of train.keep_best_by; a new best is checkpointed at once
        (with its value, which keeps it from rotation). True when a checkpoint was written."""
        assert self.best is not None
        # Agreed, so that every process takes part in the save (the values are job-wide).
        improved = bool(any_process([self.best.improves(value)])[0])
        self.best.record(step, value, improved)
        if improved:
            log.info("step %d: new best validation %s %.4f", step, self.best.metric, value)
        return improved and self._save(metric=value)

    def run(self) -> TrainResult:
        train = self.experiment.train
        self._window = _Window()
        step = self._start()
        # The handler stays until the end, so a SIGTERM while closing (a launcher stopping
        # the group once a peer has exited) cannot kill a process that is still writing.
        with StopSignal() as signal:
            try:
                with progress_bar(train.num_steps, step) as bar:
                    decision, step = self._loop(StepDecisions(train, signal), step, bar)
                    # Saved and written under the handler: a second SIGTERM cannot cut it short.
                    self._save()
                    self.checkpoints.wait()
            finally:
                # Also on errors: let a save in flight finish, so the newest one is whole.
                self._stop_feed()
                self.profiler.close()
                self.checkpoints.close()
                self.metrics.close()
        stopped = decision.stop
        best_step, best_value = (self.best.step, self.best.value) if self.best else (None, None)
        if best_step is not None:
            stopped += f"; best validation {self.best.metric} {best_value:.4f} at step {best_step}"
        if decision.stop == SIGTERM_REASON:
            stopped += "; rerun the same command to resume"
        log.info(
            "stopped at step %d: %s; checkpoints in %s", step, stopped, self.checkpoints.directory
        )
        exit_code = EXIT_PREEMPTED if decision.stop == SIGTERM_REASON else 0
        return TrainResult(
            step, self.last_train, self.last_eval, stopped, exit_code, best_step, best_value
        )

    def _start(self) -> int:
        """The step to start from (one host read, before any update)."""
        step, skipped = (
            int(x) for x in jax.device_get((self.state.step, self.state.skipped_steps))
        )
        self._step, self._consecutive, self._pending = step, skipped, []
        self._position = self.train_batches.get_state()
        return step

    def _loop(self, decisions: StepDecisions, step: int, bar: Any) -> tuple[Decision, int]:
        """Updates until the agreed decision is to stop; returns it and the last step."""
        self._decisions = decisions
        decision = decisions.at(step, self._patience_out())
        if not decision.stop:
            self._feed = self._start_feed(step)
        while not decision.stop:
            step, consecutive = self._train_once()
            if consecutive or self._pending:
                continue  # skipped, or read later: nothing happens at its step
            if self._after_update(step, bar):
                decisions.checkpointed()
            if decisions.due(step):
                decision = decisions.at(step, self._patience_out())
                # Saving never changes the state: a time-based save cannot change the results.
                if decision.checkpoint and self._save():
                    decisions.checkpointed()
        return decision, step

    def _patience_out(self) -> bool:
        return self.best is not None and self.best.exhausted

    def _start_feed(self, step: int) -> Prefetcher[Prepared]:
        """Batches drawn ahead: no more than the updates left need (a skipped update's is
        added when it is read), so nothing is drawn that a finished run does not use."""
        train = self.experiment.train
        return Prefetcher(
            self.train_batches, self._prepare, train.prefetch_depth, train.num_steps - step
        )

    def _prepare(self, batch: dict[str, np.ndarray]) -> Prepared:
        """On the prefetch thread: the update's micro-batches, split and placed on the
        devices (placing is no collective: each process puts its own rows), and the
        figures the log counts."""
        rows = self.plan.process_micro_rows(len(batch["src_tokens"]))
        micro_batches = split_batch(batch, self.accumulation_steps, rows)
        placed = [put_batch(b, self.mesh) for b in micro_batches]
        return Prepared(batch, placed, BatchFigures.of(batch, self.experiment.model))

    def _stop_feed(self) -> None:
        """Stops the prefetcher and puts the iterator back after the last batch consumed:
        the batches drawn ahead are the next run's (or the next call's) to draw again."""
        if self._feed is None:
            return
        self._feed.close()
        self._feed = None
        if self._position is not None and self.train_batches.get_state() != self._position:
            self.train_batches.set_state(self._position)

    def _train_once(self) -> tuple[int, int]:
        """One optimizer update from the next prefetched batch; returns (step, consecutive
        skips) after it. The update before it is read once this one is dispatched (the host
        may wait for it, the device never waits for the host: this one is queued); this one
        is read at once only when something happens at the step it can reach. Otherwise
        this returns (step + 1, 0), what the host expects, checked after the next update is
        dispatched: a skip is noticed one update late, at the same update on every process."""
        assert self._feed is not None
        item = next(self._feed)  # this process's rows of the update
        if self.profiler.count and not self._pending:
            self.profiler.before_update(self._step)
        metrics = self._one_update(item.value.placed)
        self._position = item.position
        self._window.add(item.value.figures, metrics)
        # The outcome comes from the metrics: the state's step is donated to the next update.
        self._pending.append(metrics["skipped"])
        self._read(keep=1)
        if not self._eventful(self._step + 1):
            return self._step + 1, 0
        self._read(keep=0)
        return self._step, self._consecutive

    def _read(self, keep: int) -> None:
        """Takes in the outcomes of the updates dispatched, oldest first, but the newest
        `keep` (one host read: it waits for the newest of them)."""
        count = max(len(self._pending) - keep, 0)
        outcomes, self._pending = self._pending[:count], self._pending[count:]
        for skipped in jax.device_get(outcomes) if outcomes else []:
            if int(skipped):
                self._consecutive += 1
                assert self._feed is not None
                self._feed.allow(1)  # the update is drawn again, from the next batch
                self._check_skips(self._step, self._consecutive)
            else:
                self._step, self._consecutive = self._step + 1, 0
            self.profiler.after_update(self._step)

    def _eventful(self, step: int) -> bool:
        """Whether anything happens once `step` is reached: a log line, an evaluation, a
        checkpoint, the end, a profiled update or an agreement (`StepDecisions.due`)."""
        train, profiler = self.experiment.train, self.profiler
        every = [train.log_every_steps, train.checkpoint_every_steps]
        if train.eval_every_steps and self.validation.split is not None:
            every.append(train.eval_every_steps)
        if self.validation.bleu_pairs:
            every.append(train.bleu_every_steps)
        if self.validation.parse_gold:
            every.append(train.f1_every_steps)
        profiled = profiler.count and profiler.first <= step <= profiler.first + profiler.count
        return (
            step >= train.num_steps
            or bool(profiled)
            or any(n and step % n == 0 for n in every)
            or (self._decisions is not None and self._decisions.due(step))
        )

    def _after_update(self, step: int, bar: Any) -> bool:
        """Logging, evaluation and step-based checkpoints due at `step` (an update that was
        applied): all decided by the step alone, so the same on every process. True when a
        checkpoint was written."""
        train = self.experiment.train
        last, saved = step == train.num_steps, False
        if step % train.log_every_steps == 0 or last:
            self.last_train = self._log_window(step)
            bar.update(
                bar.task_ids[0], completed=step, status=f"loss {self.last_train['loss']:.3f}"
            )
        if (
            train.eval_every_steps
            and self.validation.split is not None
            and (step % train.eval_every_steps == 0 or last)
        ):
            self.last_eval = self.evaluate()
            self.metrics.write("eval", step, self.last_eval)
            if train.keep_best_by == "loss":
                saved = self._track_best(step, self.last_eval[self._scored + "loss"])
        if self.validation.bleu_pairs and (step % train.bleu_every_steps == 0 or last):
            bleu = self._prefixed(self.validation.bleu(self._scored_params()))
            self.metrics.write("bleu", step, bleu)
            if train.keep_best_by == "bleu":
                saved = self._track_best(step, bleu[self._scored + ranked_bleu(self.experiment)])
        if self.validation.parse_gold and (step % train.f1_every_steps == 0 or last):
            f1 = self._prefixed(self.validation.f1(self._scored_params()))
            self.metrics.write("f1", step, f1)
            if train.keep_best_by == "f1":
                saved = self._track_best(step, f1[self._scored + "f1"])
        if train.checkpoint_every_steps and step % train.checkpoint_every_steps == 0:
            saved = self._save() or saved
        return saved

    def _log_window(self, step: int) -> dict[str, float]:
        window, self._window = self._window, _Window()
        fetched = jax.device_get(window.metrics)  # one host sync per logging interval
        elapsed = max(time.monotonic() - window.start, 1e-9)
        summary = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[-1]}
        summary["skipped"] = float(np.sum([m["skipped"] for m in fetched]))
        # The job's figures: every process's rows of the batches, all devices.
        tokens, flops, padding, batches = sum_over_processes(
            [window.tokens, window.flops, window.padding, window.batches]
        )
        tflops = flops / elapsed / 1e12
        summary.update(
            target_tokens=tokens,  # real (non-pad) target tokens of the window, job-wide
            tokens_per_second=tokens / elapsed,
            step_time=elapsed / len(fetched),
            padding_fraction=padding / max(batches, 1),
            model_tflops_per_second=tflops,
        )
        peak = self.experiment.train.peak_tflops_per_device
        if peak:
            summary["mfu"] = tflops / (peak * self.mesh.devices.size)  # the job-wide mesh
        summary.pop("tokens", None)
        self.metrics.write("train", step, summary)
        return summary

    def _check_skips(self, step: int, consecutive: int) -> None:
        """Warns about a skipped update; stops once `train.max_consecutive_skips` in a row."""
        limit = self.experiment.train.max_consecutive_skips
        log.warning(
            "update %d skipped: non-finite loss or gradient (%d in a row, limit %d)",
            step + 1,
            consecutive,
            limit,
        )
        if consecutive < limit:
            return
        last = self.checkpoints.latest_step()
        kept = (
            f"the last good checkpoint (step {last}) is intact in {self.checkpoints.directory}"
            if last is not None
            else "no checkpoint had been written yet"
        )
        raise FloatingPointError(
            f"{consecutive} consecutive updates had a non-finite loss or gradient; stopping "
            f"at step {step}; {kept}"
        )
