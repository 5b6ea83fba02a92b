"""Training orchestration: inputs, steps, evaluation, checkpoints, metrics. No math here."""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.data.pipeline import BatchIterator, padding_fraction
from attnmt.decode.evaluation import score
from attnmt.decode.translate import Translator
from attnmt.experiment import Experiment
from attnmt.model.config import ModelConfig
from attnmt.model.flops import nonpad_lengths, train_flops
from attnmt.parallel.mesh import make_mesh
from attnmt.parallel.sharding import put_batch
from attnmt.train import step as steps
from attnmt.train.inputs import prepare_inputs, with_recorded_data_dir
from attnmt.train.metrics import MetricsSink, progress_bar
from attnmt.train.preflight import memory_preflight
from attnmt.train.program import build_program

log = logging.getLogger("attnmt.train")

# 128 + SIGTERM, what a shell reports for a process SIGTERM killed: job schedulers read it
# as "did not finish" and restart the job, which then resumes from the checkpoint.
EXIT_PREEMPTED = 143
SIGTERM_REASON = "SIGTERM received"


@dataclasses.dataclass
class TrainResult:
    step: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    stopped_because: str
    exit_code: int = 0  # EXIT_PREEMPTED after a SIGTERM: the run is to be resumed


class _StopSignal:
    """Turns SIGTERM (a preemption notice) into a request to checkpoint and stop.

    With several processes, JAX's preemption service (enabled by jax.distributed) owns
    SIGTERM and makes all processes agree on the step to stop at; a Python handler would
    replace its own, so none is installed there and `should_stop` asks the service.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopSignal:
        if jax.process_count() > 1:
            return self
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler, no preemption support
            self._previous = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        del signum, frame
        self.requested = True

    def should_stop(self, step: int) -> bool:
        if self.requested or jax.process_count() == 1:
            return self.requested
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # the preemption service is off: preemption is not seen
            return False

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@dataclasses.dataclass
class _Window:
    """What happened since the last log line (metrics stay on device until then)."""

    metrics: list[dict[str, jax.Array]] = dataclasses.field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0  # model FLOPs of the real tokens (attnmt.model.flops.train_flops)
    padding: float = 0.0
    batches: int = 0
    start: float = dataclasses.field(default_factory=time.monotonic)

    def add(
        self,
        batches: list[dict[str, np.ndarray]],
        metrics: dict[str, jax.Array],
        model: ModelConfig,
    ) -> None:
        for batch in batches:
            self.tokens += float(np.count_nonzero(batch["tgt_tokens"]))
            self.flops += train_flops(
                model, nonpad_lengths(batch["src_tokens"]), nonpad_lengths(batch["tgt_tokens"])
            )
            self.padding += padding_fraction(batch)
            self.batches += 1
        self.metrics.append(metrics)


class _Profiler:
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


class Trainer:
    """The run's state and the loop over it (`run()`): iterate, step, log, evaluate,
    checkpoint, stop. Its parts come from `train/inputs.py` (what the run reads) and
    `train/program.py` (the compiled training program).

    `memory_limit_bytes` replaces the device's memory figure in the pre-flight check.
    """

    def __init__(
        self,
        experiment: Experiment,
        workdir: str | Path,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.experiment = experiment = with_recorded_data_dir(experiment)
        self.workdir = Path(workdir)
        self.mesh = make_mesh(experiment.parallel)
        inputs = prepare_inputs(experiment, self.workdir, self.mesh)
        self.train_batches, self.shapes = inputs.train_batches, inputs.shapes
        self.accumulation_steps, self.evaluation = inputs.accumulation_steps, inputs.evaluation
        self.bleu_pairs = inputs.bleu_pairs
        self.translator = Translator(
            [experiment.model], [None], inputs.tokenizer, experiment.decode
        )
        self.program = build_program(experiment, self.mesh)
        # The trainer is the only writer, so it may delete saves a killed run left unfinished.
        self.checkpoints = CheckpointManager(
            self.workdir, keep=experiment.train.keep_checkpoints, clean_up_unfinished=True
        )
        self.metrics = MetricsSink(self.workdir, enabled=jax.process_index() == 0)
        if experiment.train.memory_preflight:
            program = self.program
            memory_preflight(
                experiment,
                program.train_step,
                program.grad_step,
                program.abstract_state,
                self.shapes,
                memory_limit_bytes,
            )
        self.state = self._initial_state(self.program.abstract_state)

    def _initial_state(self, abstract: steps.TrainState) -> steps.TrainState:
        restored = self.checkpoints.restore_latest(abstract)
        if restored is None:
            log.info("starting a new run in %s", self.workdir)
            return self.program.init_state()
        step, state, data_state, _ = restored
        # The position saved with the same step: the batches after it are those the
        # uninterrupted run would have drawn next.
        self.train_batches.set_state(data_state)
        log.info("resumed from checkpoint step %d in %s", step, self.workdir)
        return state

    def _one_update(self, batches: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
        if len(batches) == 1:
            self.state, metrics = self.program.train_step(self.state, batches[0])
            return metrics
        step_rng = jax.random.fold_in(self.state.dropout_rng, self.state.step)
        grad_sums, sums = None, None
        for index, batch in enumerate(batches):
            grads, micro = self.program.grad_step(
                self.state.params, batch, jax.random.fold_in(step_rng, index)
            )
            if grad_sums is None:
                grad_sums, sums = grads, micro
            else:
                grad_sums, sums = self.program.add((grad_sums, sums), (grads, micro))
        self.state, metrics = self.program.apply_step(self.state, grad_sums, sums)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy on the whole evaluation split (no dropout)."""
        assert self.evaluation is not None, "no evaluation split (data.eval_split)"
        corpus, shapes = self.evaluation
        batches = BatchIterator(
            corpus,
            shapes,
            seed=0,
            shuffle=False,
            repeat=False,
            shard_index=jax.process_index(),
            shard_count=jax.process_count(),
        )
        totals: dict[str, Any] = {}
        for batch in batches:
            sums = self.program.eval_step(self.state.params, put_batch(batch, self.mesh))
            totals = sums if not totals else {k: totals[k] + sums[k] for k in totals}
        summary = steps.summarize(totals)
        return {k: float(v) for k, v in jax.device_get(summary).items()}

    def bleu(self) -> dict[str, float]:
        """Beam-search BLEU of the current parameters on (part of) the evaluation split."""
        self.translator.set_params([self.state.params])
        hypotheses = self.translator.translate([src for src, _ in self.bleu_pairs])
        references = [tgt for _, tgt in self.bleu_pairs]
        sacre, tokenized, m30k = score(self.experiment, hypotheses, references)
        scores = {"sacrebleu": sacre.score, "tokenized_bleu": tokenized.score}
        if m30k is not None:
            scores["multi30k_bleu"] = m30k.score
        return scores

    def _save(self) -> None:
        """Checkpoints the state and the data position after the last update drawn."""
        step, skipping = (
            int(x) for x in jax.device_get((self.state.step, self.state.skipped_steps))
        )
        if skipping:
            # Mid-way through non-finite updates: the last good checkpoint stays the newest.
            log.info("no checkpoint at step %d: the last %d updates were skipped", step, skipping)
            return
        if step in self.checkpoints.all_steps():
            return
        self.checkpoints.save(
            step, self.state, self.train_batches.get_state(), self.experiment.to_dict()
        )
        self._last_checkpoint_time = time.monotonic()

    def run(self) -> TrainResult:
        cfg = self.experiment.train
        self._start_time = self._last_checkpoint_time = time.monotonic()
        self._window = _Window()
        self._profiler = _Profiler(
            self.workdir / "profile", cfg.profile_first_step, cfg.profile_num_steps
        )
        self._last_train: dict[str, float] = {}
        self._last_eval: dict[str, float] = {}
        step = int(self.state.step)
        try:
            with _StopSignal() as stop, progress_bar(cfg.num_steps, step) as bar:
                stopped = self._stop_reason(stop, step)
                while not stopped:
                    step, consecutive = self._train_once()
                    if consecutive:
                        self._check_skips(step, consecutive)
                    else:
                        self._after_update(step, bar)
                    stopped = self._stop_reason(stop, step)
                # Saved and written inside the handler: a second SIGTERM cannot cut it short.
                self._save()
                self.checkpoints.wait()
        finally:
            # Also on errors: let a save in flight finish, so the newest checkpoint is whole.
            self._profiler.close()
            self.checkpoints.close()
            self.metrics.close()
        if stopped == SIGTERM_REASON:
            stopped += "; rerun the same command to resume"
        log.info(
            "stopped at step %d: %s; checkpoints in %s", step, stopped, self.checkpoints.directory
        )
        exit_code = EXIT_PREEMPTED if stopped.startswith(SIGTERM_REASON) else 0
        return TrainResult(step, self._last_train, self._last_eval, stopped, exit_code)

    def _train_once(self) -> tuple[int, int]:
        """One optimizer update; returns (updates applied, consecutive updates skipped)."""
        batches = [next(self.train_batches) for _ in range(self.accumulation_steps)]
        if self._profiler.count:  # reading the step is a host sync: only when tracing
            self._profiler.before_update(int(self.state.step))
        metrics = self._one_update([put_batch(b, self.mesh) for b in batches])
        self._window.add(batches, metrics, self.experiment.model)
        # One small host sync per update: the non-finite guard and every step boundary
        # (checkpoint, SIGTERM) must see each update, not only those at logging intervals.
        step, consecutive = jax.device_get((self.state.step, self.state.skipped_steps))
        self._profiler.after_update(int(step))
        return int(step), int(consecutive)

    def _after_update(self, step: int, bar: Any) -> None:
        """Logging, evaluation and checkpoints due at `step` (an update that was applied)."""
        cfg = self.experiment.train
        last = step == cfg.num_steps
        if step % cfg.log_every_steps == 0 or last:
            self._last_train = self._log_window(step)
            bar.update(
                bar.task_ids[0], completed=step, status=f"loss {self._last_train['loss']:.3f}"
            )
        if (
            cfg.eval_every_steps
            and self.evaluation is not None
            and (step % cfg.eval_every_steps == 0 or last)
        ):
            self._last_eval = self.evaluate()
            self.metrics.write("eval", step, self._last_eval)
        if self.bleu_pairs and (step % cfg.bleu_every_steps == 0 or last):
            self.metrics.write("bleu", step, self.bleu())
        due_by_steps = cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0
        # Saving never changes the state, so a time-based save cannot change the result.
        due_by_time = (
            cfg.checkpoint_every_minutes
            and time.monotonic() - self._last_checkpoint_time >= 60 * cfg.checkpoint_every_minutes
        )
        if due_by_steps or due_by_time:
            self._save()

    def _stop_reason(self, stop: _StopSignal, step: int) -> str:
        cfg = self.experiment.train
        if step >= cfg.num_steps:
            return "finished"
        if stop.should_stop(step):
            return SIGTERM_REASON
        elapsed = time.monotonic() - self._start_time
        if cfg.time_limit_minutes and elapsed >= 60 * cfg.time_limit_minutes:
            return f"time limit of {cfg.time_limit_minutes} minutes reached"
        return ""

    def _log_window(self, step: int) -> dict[str, float]:
        window, self._window = self._window, _Window()
        fetched = jax.device_get(window.metrics)  # one host sync per logging interval
        elapsed = max(time.monotonic() - window.start, 1e-9)
        summary = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[-1]}
        summary["skipped"] = float(np.sum([m["skipped"] for m in fetched]))
        tflops = window.flops / elapsed / 1e12  # this process's devices together
        summary.update(
            tokens_per_second=window.tokens / elapsed,
            step_time=elapsed / len(fetched),
            padding_fraction=window.padding / max(window.batches, 1),
            model_tflops_per_second=tflops,
        )
        peak = self.experiment.train.peak_tflops_per_device
        if peak:
            summary["mfu"] = tflops / (peak * jax.local_device_count())
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


def train(
    experiment: Experiment, workdir: str | Path, memory_limit_bytes: int | None = None
) -> TrainResult:
    """Trains (or resumes) the experiment in `workdir`."""
    return Trainer(experiment, workdir, memory_limit_bytes).run()
