"""Training orchestration: inputs, steps, evaluation, checkpoints, metrics. No math here."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.data.batching import bucket_shapes
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus, padding_fraction
from attnmt.data.prepare import ensure_vocab, load_split, tokenized_split, vocab_path
from attnmt.decode.evaluation import score
from attnmt.decode.translate import Translator
from attnmt.errors import ConfigError
from attnmt.experiment import Experiment
from attnmt.model.transformer import Transformer
from attnmt.train import step as steps
from attnmt.train.metrics import MetricsSink, progress_bar
from attnmt.train.optim import make_optimizer, paper_schedule

log = logging.getLogger("attnmt.train")


@dataclasses.dataclass
class TrainResult:
    step: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    stopped_because: str


class _StopSignal:
    """Turns SIGTERM (a preemption notice) into a request to checkpoint and stop."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopSignal:
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


def _shapes(experiment: Experiment, tokens: int) -> list[tuple[int, int]]:
    data = experiment.data
    try:
        return bucket_shapes(
            data.max_length,
            tokens,
            min_length=data.min_bucket_length,
            batch_multiple=data.batch_multiple,
        )
    except ValueError as error:
        raise ConfigError(f"data.tokens_per_batch / data.max_length: {error}") from None


class Trainer:
    """Holds the compiled steps and the run's state; `run()` is the loop."""

    def __init__(self, experiment: Experiment, workdir: str | Path) -> None:
        self.experiment = experiment
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "config.json").write_text(json.dumps(experiment.to_dict(), indent=2))
        cfg = experiment
        tokenizer = ensure_vocab(cfg.data, cfg.model.vocab_size, self.workdir)
        if tokenizer.vocab_size > cfg.model.vocab_size:
            raise ConfigError(
                f"the vocabulary at {vocab_path(cfg.data, self.workdir)} has "
                f"{tokenizer.vocab_size} tokens but model.vocab_size is {cfg.model.vocab_size}"
            )
        vocab_file = vocab_path(cfg.data, self.workdir)
        train_corpus, stats = tokenized_split(
            cfg.data, vocab_file, tokenizer, cfg.data.train_split, self.workdir
        )
        log.info("training pairs: %s", stats)
        per_micro_batch = cfg.data.tokens_per_batch // cfg.train.grad_accum_steps
        self.shapes = _shapes(cfg, per_micro_batch)
        log.info("bucket shapes (batch, length): %s", self.shapes)
        self.train_batches = BatchIterator(train_corpus, self.shapes, seed=cfg.train.seed)
        self.eval_corpus: TokenizedCorpus | None = None
        if cfg.train.eval_every_steps and cfg.data.eval_split:
            self.eval_corpus, eval_stats = tokenized_split(
                cfg.data, vocab_file, tokenizer, cfg.data.eval_split, self.workdir
            )
            log.info("evaluation pairs: %s", eval_stats)
            self.eval_shapes = _shapes(cfg, cfg.data.eval_tokens_per_batch or per_micro_batch)

        self.bleu_pairs: list[tuple[str, str]] = []
        if cfg.train.bleu_every_steps and cfg.data.eval_split:
            pairs = load_split(cfg.data, cfg.data.eval_split)
            self.bleu_pairs = pairs[: cfg.train.bleu_max_sentences or None]
            self.translator = Translator([cfg.model], [None], tokenizer, cfg.decode)

        self.model = Transformer(cfg.model)
        self.learning_rate = paper_schedule(
            cfg.model.d_model, cfg.optim.warmup_steps, cfg.optim.learning_rate_scale
        )
        self.optimizer = make_optimizer(cfg.optim, cfg.model.d_model)
        smoothing = cfg.train.label_smoothing
        self._train_step = jax.jit(
            functools.partial(
                steps.train_step, self.model, self.optimizer, self.learning_rate, smoothing
            ),
            donate_argnums=(0,),
        )
        self._grad_step = jax.jit(
            lambda params, batch, rng: steps.compute_gradients(
                self.model, params, batch, rng, smoothing
            )
        )
        self._apply = jax.jit(
            lambda state, grads, sums: steps.apply_gradients(
                self.optimizer, state, grads, sums, self.learning_rate
            ),
            donate_argnums=(0,),
        )
        self._add = jax.jit(lambda a, b: jax.tree_util.tree_map(lambda x, y: x + y, a, b))
        self._eval_step = jax.jit(functools.partial(steps.eval_step, self.model, smoothing))
        self.checkpoints = CheckpointManager(self.workdir, keep=cfg.train.keep_checkpoints)
        self.metrics = MetricsSink(self.workdir, enabled=jax.process_index() == 0)
        self.state = self._initial_state()

    def _initial_state(self) -> steps.TrainState:
        batch_size, length = self.shapes[0]
        example = {
            "src_tokens": np.zeros((batch_size, length), np.int32),
            "tgt_tokens": np.zeros((batch_size, length), np.int32),
        }
        rng = jax.random.PRNGKey(self.experiment.train.seed)
        create = functools.partial(steps.create_train_state, self.model, self.optimizer)
        abstract = jax.eval_shape(create, rng, example)
        restored = self.checkpoints.restore_latest(abstract)
        if restored is None:
            log.info("starting a new run in %s", self.workdir)
            return jax.jit(create)(rng, example)
        step, state, data_state, _ = restored
        self.train_batches.set_state(data_state)
        log.info("resumed from checkpoint step %d in %s", step, self.workdir)
        return state

    def _one_update(self, batches: list[dict[str, np.ndarray]]) -> dict[str, jax.Array]:
        if len(batches) == 1:
            self.state, metrics = self._train_step(self.state, batches[0])
            return metrics
        step_rng = jax.random.fold_in(self.state.dropout_rng, self.state.step)
        grad_sums, sums = None, None
        for index, batch in enumerate(batches):
            grads, micro = self._grad_step(
                self.state.params, batch, jax.random.fold_in(step_rng, index)
            )
            if grad_sums is None:
                grad_sums, sums = grads, micro
            else:
                grad_sums, sums = self._add((grad_sums, sums), (grads, micro))
        self.state, metrics = self._apply(self.state, grad_sums, sums)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracy on the whole evaluation split (no dropout)."""
        assert self.eval_corpus is not None
        batches = BatchIterator(
            self.eval_corpus, self.eval_shapes, seed=0, shuffle=False, repeat=False
        )
        totals: dict[str, Any] = {}
        for batch in batches:
            sums = self._eval_step(self.state.params, batch)
            totals = sums if not totals else {k: totals[k] + sums[k] for k in totals}
        summary = steps.summarize(totals)
        return {k: float(v) for k, v in jax.device_get(summary).items()}

    def bleu(self) -> dict[str, float]:
        """Beam-search BLEU of the current parameters on (part of) the evaluation split."""
        self.translator.params_list = [self.state.params]
        hypotheses = self.translator.translate([src for src, _ in self.bleu_pairs])
        references = [tgt for _, tgt in self.bleu_pairs]
        sacre, tokenized, m30k = score(self.experiment, hypotheses, references)
        scores = {"sacrebleu": sacre.score, "tokenized_bleu": tokenized.score}
        if m30k is not None:
            scores["multi30k_bleu"] = m30k.score
        return scores

    def _save(self) -> None:
        step = int(self.state.step)
        if step in self.checkpoints.all_steps():
            return
        self.checkpoints.save(
            step, self.state, self.train_batches.get_state(), self.experiment.to_dict()
        )

    def run(self) -> TrainResult:
        cfg = self.experiment.train
        start_time = time.monotonic()
        last_checkpoint_time = start_time
        window: list[dict[str, jax.Array]] = []
        window_tokens = window_slots = window_pad = 0.0
        window_start = time.monotonic()
        last_train: dict[str, float] = {}
        last_eval: dict[str, float] = {}
        stopped = "finished"
        step = int(self.state.step)
        with _StopSignal() as stop, progress_bar(cfg.num_steps, step) as bar:
            while step < cfg.num_steps:
                batches = [next(self.train_batches) for _ in range(cfg.grad_accum_steps)]
                for batch in batches:
                    window_tokens += float(np.count_nonzero(batch["tgt_tokens"]))
                    window_pad += padding_fraction(batch)
                    window_slots += 1
                window.append(self._one_update(batches))
                step += 1
                if step % cfg.log_every_steps == 0 or step == cfg.num_steps:
                    last_train = self._log_window(
                        step, window, window_tokens, window_start, window_pad / max(window_slots, 1)
                    )
                    self._check_skips(last_train)
                    window, window_tokens, window_pad, window_slots = [], 0.0, 0.0, 0
                    window_start = time.monotonic()
                    bar.update(
                        bar.task_ids[0], completed=step, status=f"loss {last_train['loss']:.3f}"
                    )
                if (
                    cfg.eval_every_steps
                    and self.eval_corpus is not None
                    and (step % cfg.eval_every_steps == 0 or step == cfg.num_steps)
                ):
                    last_eval = self.evaluate()
                    self.metrics.write("eval", step, last_eval)
                if self.bleu_pairs and (step % cfg.bleu_every_steps == 0 or step == cfg.num_steps):
                    self.metrics.write("bleu", step, self.bleu())
                now = time.monotonic()
                due_by_steps = cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0
                due_by_time = (
                    cfg.checkpoint_every_minutes
                    and now - last_checkpoint_time >= 60 * cfg.checkpoint_every_minutes
                )
                if due_by_steps or due_by_time:
                    self._save()
                    last_checkpoint_time = now
                if stop.requested:
                    stopped = "SIGTERM received"
                    break
                if cfg.time_limit_minutes and now - start_time >= 60 * cfg.time_limit_minutes:
                    stopped = f"time limit of {cfg.time_limit_minutes} minutes reached"
                    break
        self._save()
        self.checkpoints.close()
        self.metrics.close()
        log.info(
            "stopped at step %d: %s; checkpoints in %s",
            int(self.state.step),
            stopped,
            self.checkpoints.directory,
        )
        return TrainResult(int(self.state.step), last_train, last_eval, stopped)

    def _log_window(
        self,
        step: int,
        window: list[dict[str, jax.Array]],
        tokens: float,
        since: float,
        padding: float,
    ) -> dict[str, float]:
        fetched = jax.device_get(window)  # one host sync per logging interval
        elapsed = max(time.monotonic() - since, 1e-9)
        summary = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[-1]}
        summary["skipped"] = float(np.sum([m["skipped"] for m in fetched]))
        summary.update(
            tokens_per_second=tokens / elapsed,
            step_time=elapsed / len(fetched),
            padding_fraction=padding,
        )
        summary.pop("tokens", None)
        self.metrics.write("train", step, summary)
        return summary

    def _check_skips(self, summary: dict[str, float]) -> None:
        consecutive = int(self.state.skipped_steps)
        if consecutive >= self.experiment.train.max_consecutive_skips:
            raise FloatingPointError(
                f"{consecutive} consecutive updates had a non-finite loss or gradient; stopping "
                f"with the last good checkpoint intact in {self.checkpoints.directory}"
            )
        del summary


def train(experiment: Experiment, workdir: str | Path) -> TrainResult:
    """Trains (or resumes) the experiment in `workdir`."""
    return Trainer(experiment, workdir).run()
