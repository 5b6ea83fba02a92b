"""train.keep_best_by and train.early_stop_patience on a run whose validation curve turns.

The model learns to reverse letters while its validation split holds the reversed letters
shifted by one (a→b, …, h→a): the validation loss falls while the model learns what any
target looks like (letters, lengths, the end), then rises as it grows sure of the true
letter. The best step is read back from the run's own TensorBoard scalars.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.train import TrainConfig
from attnmt.errors import ConfigError
from attnmt.train import stopping
from attnmt.train.assemble import build_trainer
from attnmt.train.stopping import (
    BestSoFar,
    Decision,
    StepDecisions,
    best_after_resume,
    early_stop_reason,
)
from attnmt.workdir import abstract_params_on_one_device, load_run
from tests.helpers import (
    corpus_overrides,
    event_scalars,
    tiny_experiment,
    write_turning_corpus,
)

EVERY = 10  # train.eval_every_steps = train.checkpoint_every_steps
PATIENCE = 3


def overrides(corpus: Path, steps: int, *extra: str) -> list[str]:
    return [
        *corpus_overrides(corpus),
        "--config.model.num_layers=1",
        "--config.data.tokens_per_batch=128",
        f"--config.train.num_steps={steps}",
        f"--config.train.eval_every_steps={EVERY}",
        f"--config.train.checkpoint_every_steps={EVERY}",
        f"--config.train.log_every_steps={EVERY}",
        "--config.train.keep_checkpoints=2",
        "--config.train.keep_best_by=loss",
        f"--config.train.early_stop_patience={PATIENCE}",
        "--config.optim.warmup_steps=20",
        "--config.optim.learning_rate_scale=1.0",
        *extra,
    ]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One run to 150 steps at most, early stopping on; its workdir, result and scalars."""
    root = tmp_path_factory.mktemp("best")
    corpus = write_turning_corpus(root / "corpus")
    result = build_trainer(tiny_experiment(overrides(corpus, 150)), root / "run").run()
    losses = event_scalars(root / "run" / "tensorboard" / "eval", "loss")
    return root, corpus, result, losses


def test_the_best_step_is_the_minimum_of_the_logged_validation_loss_and_survives_rotation(
    straight,
):
    root, _, result, losses = straight
    best = min(losses, key=lambda step: (losses[step], step))
    assert result.best_step == best
    assert result.best_value == pytest.approx(losses[best], rel=1e-6)
    steps = CheckpointManager(root / "run").all_steps()
    # keep_checkpoints=2: the last two, and the best beside them; those between are gone.
    assert steps == [best, result.step - EVERY, result.step]
    assert best + EVERY not in steps
    loaded = load_run(root / "run", "best")
    assert loaded.step == best
    newest = load_run(root / "run")
    leaves = zip(jax.tree.leaves(loaded.params), jax.tree.leaves(newest.params), strict=True)
    assert any(not np.array_equal(a, b) for a, b in leaves)


def test_early_stopping_stops_patience_evaluations_after_the_best_with_a_checkpoint(straight):
    root, _, result, losses = straight
    best = result.best_step
    assert result.exit_code == 0
    assert result.stopped_because.startswith(
        f"early stopping: validation loss did not improve in {PATIENCE} evaluations"
    )
    assert f"at step {best}" in result.stopped_because
    assert result.step == best + PATIENCE * EVERY < 150  # the curve turned before the end
    assert max(losses) == result.step  # no evaluation after the stop
    assert sorted(s for s in losses if s > best) == [best + EVERY * k for k in (1, 2, 3)]
    assert CheckpointManager(root / "run").latest_step() == result.step


def test_a_resumed_run_keeps_the_best_and_the_evaluations_since_it(straight, tmp_path):
    _, corpus, uninterrupted, _ = straight
    stop, best = uninterrupted.step, uninterrupted.best_step
    paused = stop - EVERY  # two evaluations after the best: one more stops it
    assert best < paused
    workdir = tmp_path / "run"
    first = build_trainer(tiny_experiment(overrides(corpus, paused)), workdir).run()
    assert first.stopped_because.startswith("finished") and first.best_step == best
    trainer = build_trainer(tiny_experiment(overrides(corpus, 150)), workdir)
    assert (trainer.best.step, trainer.best.since_best) == (best, PATIENCE - 1)
    resumed = trainer.run()
    assert (resumed.step, resumed.best_step) == (stop, best)
    assert resumed.best_value == uninterrupted.best_value
    assert resumed.stopped_because == uninterrupted.stopped_because
    assert load_run(workdir, "best").step == best


def test_a_rerun_of_an_early_stopped_run_stops_at_once(straight, tmp_path):
    root, corpus, result, _ = straight
    workdir = tmp_path / "copy"
    shutil.copytree(root / "run", workdir)
    again = build_trainer(tiny_experiment(overrides(corpus, 150)), workdir).run()
    assert (again.step, again.best_step) == (result.step, result.best_step)
    assert again.stopped_because == result.stopped_because


def test_keep_best_by_loss_needs_an_evaluation_split(tmp_path):
    corpus = write_turning_corpus(tmp_path / "corpus")
    experiment = tiny_experiment(overrides(corpus, 20, "--config.data.eval_split="))
    with pytest.raises(ConfigError, match=r"train\.keep_best_by='loss'.*data\.eval_split"):
        build_trainer(experiment, tmp_path / "run")


def test_best_params_are_those_of_the_best_step(straight):
    root, _, result, _ = straight
    manager = CheckpointManager(root / "run")
    try:
        abstract = abstract_params_on_one_device(load_run(root / "run").experiment.model)
        saved = manager.restore_params(result.best_step, abstract)
    finally:
        manager.close()
    loaded = load_run(root / "run", "best").params
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(loaded), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"keep_best_by": "bleu"}, ["train.keep_best_by", "train.bleu_every_steps"]),
        ({"keep_best_by": "loss", "eval_every_steps": 0}, ["train.eval_every_steps"]),
        ({"early_stop_patience": 2}, ["train.early_stop_patience", "train.keep_best_by"]),
        ({"keep_best_by": "nll"}, ["train.keep_best_by"]),
        ({"keep_best_by": "loss", "early_stop_patience": -1}, ["train.early_stop_patience"]),
    ],
)
def test_inconsistent_best_and_patience_keys_are_refused(changes, named):
    with pytest.raises(ConfigError) as error:
        TrainConfig(**changes)
    for key in named:
        assert key in str(error.value)


def test_consistent_keys_are_accepted():
    TrainConfig(keep_best_by="bleu", bleu_every_steps=5, early_stop_patience=2)
    TrainConfig(keep_best_by="loss", early_stop_patience=0)


class _Signal:
    requested = False


def test_a_peers_early_stop_stops_every_process_with_the_same_reason(monkeypatch):
    train = TrainConfig(keep_best_by="loss", early_stop_patience=2, num_steps=100)
    decisions = StepDecisions(train, _Signal(), clock=lambda: 0.0)
    assert decisions.at(10) == Decision("", False)
    alone = decisions.at(10, early_stop=True)
    assert alone == Decision(early_stop_reason(train), False)
    # A second process whose patience ran out: the gathered flags are OR-ed.
    peer = np.array([False, False, False, True])
    monkeypatch.setattr(
        stopping,
        "any_and_mean",
        lambda flags, values: (np.asarray(flags) | peer, np.asarray(values, float)),
    )
    assert decisions.at(10, early_stop=False) == alone
    assert decisions.at(100, early_stop=True).stop == "finished"  # the last step: finished


def test_patience_counts_evaluations_without_strict_improvement():
    best = BestSoFar("bleu", patience=2)
    for step, value, improves in [(5, 10.0, True), (10, 10.0, False), (15, 12.0, True)]:
        assert best.improves(value) is improves
        best.record(step, value, improves)
    assert (best.step, best.value, best.since_best, best.exhausted) == (15, 12.0, 0, False)
    assert not best.improves(float("nan"))
    best.record(20, 11.0, False)
    best.record(25, 11.0, False)
    assert best.exhausted and best.step == 15
    assert BestSoFar("loss", 0, since_best=99).exhausted is False  # 0: never
    loss = BestSoFar("loss", patience=1, step=10, value=2.0)
    assert loss.improves(1.9) and not loss.improves(2.0) and not loss.improves(2.1)


def test_after_resume_the_evaluations_since_the_best_follow_the_schedule():
    train = TrainConfig(keep_best_by="bleu", bleu_every_steps=50, early_stop_patience=3)
    resumed = best_after_resume(train, (100, 20.0), resumed_step=230)
    assert (resumed.step, resumed.value, resumed.since_best) == (100, 20.0, 2)  # 150, 200
    assert best_after_resume(train, None, 230).step is None
    assert best_after_resume(train, (300, 1.0), 230).step is None  # not this run's past


def test_the_command_line_decodes_the_best_step(straight, tmp_path, capsys):
    """`attnmt evaluate --step best` decodes the kept best step, not the newest one."""
    from attnmt.cli.main import main

    root, _, result, _ = straight
    fast = ["--beam", "1", "--max-len-offset", "2", "--xla-opt-level", "0"]
    run = ["evaluate", "--workdir", str(root / "run"), "--split", "dev"]
    code = main([*run, "--step", "best", *fast])
    assert code == 0, capsys.readouterr().err
    decodes = sorted(p.name for p in (root / "run" / "decodes").glob("*"))
    assert any(f"step{result.best_step}-" in name for name in decodes), decodes
    assert not any(f"step{result.step}-" in name for name in decodes), decodes
    with pytest.raises(SystemExit) as refused:  # argparse: a step number or 'best'
        main([*run, "--step", "newest"])
    assert refused.value.code == 2
