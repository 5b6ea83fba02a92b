"""Gradient accumulation through the trainer's own path: an update made of N micro-batches
is the update of one batch holding all of them.

The trainer draws the update's batch, splits it row-wise into micro-batches (filler rows
of padding make them equal), sums their gradients and token counts on the device and
applies one update; the reference is the fused single-batch step on the drawn batch. SGD
makes the update proportional to the gradient, so a
wrong scale (each micro-batch normalised by its own token count, a micro-batch dropped or
counted twice) shows as an update off by ≥ 1/N of itself; tests/equivalence.py gives the
rounding bound.
"""

import functools

import jax
import numpy as np
import pytest

from attnmt.data.pipeline import BatchIterator, split_batch
from attnmt.model.transformer import Transformer
from attnmt.train import step as steps
from attnmt.train.assemble import build_trainer
from attnmt.train.optim import make_optimizer, paper_schedule
from tests.equivalence import assert_same_losses, assert_same_updates
from tests.helpers import reversal_overrides, tiny_experiment


def _reference_update(experiment, state, batch):
    model = Transformer(experiment.model)
    optimizer = make_optimizer(experiment.optim, experiment.model.d_model)
    optim = experiment.optim
    schedule = paper_schedule(
        experiment.model.d_model, optim.warmup_steps, optim.learning_rate_scale
    )
    step = functools.partial(
        steps.train_step, model, optimizer, schedule, experiment.train.label_smoothing
    )
    return jax.jit(step)(state, batch)


@pytest.mark.parametrize("micro_batches", [2, 3])
def test_trainer_accumulates_micro_batches_like_one_batch(
    reversal_corpus,
    tmp_path,
    micro_batches,
):
    overrides = [
        *reversal_overrides(reversal_corpus, 1),
        "--config.optim.algorithm=sgd",
        "--config.data.tokens_per_batch=384",
        f"--config.train.grad_accum_steps={micro_batches}",
        "--config.train.log_every_steps=1",
        "--config.train.memory_preflight=false",
        "--config.train.eval_every_steps=0",
        "--config.parallel.num_devices=1",
    ]
    trainer = build_trainer(tiny_experiment(overrides), tmp_path / "run")
    assert trainer.accumulation_steps == micro_batches
    before = jax.device_get(trainer.state)  # the run donates its state buffers
    position = trainer.train_batches.get_state()
    result = trainer.run()
    assert result.step == 1

    # The batch the trainer drew, replayed from its data position, and its micro-batches.
    replay = BatchIterator(trainer.train_batches.corpus, trainer.train_batches.shapes, seed=0)
    replay.set_state(position)
    whole = next(replay)
    assert replay.get_state() == trainer.train_batches.get_state()
    rows = trainer.plan.process_micro_rows(len(whole["src_tokens"]))
    assert (rows - 1) * micro_batches < len(whole["src_tokens"]) <= rows * micro_batches
    parts = split_batch(whole, micro_batches, rows)
    token_counts = [int(np.count_nonzero(b["tgt_tokens"])) for b in parts]
    # Unequal token counts: a mean of per-micro-batch means would differ from the true mean.
    assert len(set(token_counts)) > 1, token_counts

    expected_state, expected = _reference_update(trainer.experiment, before, whole)
    assert float(expected["tokens"]) == sum(token_counts)
    assert_same_losses([float(expected["loss"])], [result.last_train["loss"]])
    assert_same_updates(before.params, expected_state.params, trainer.state.params, steps=1)
