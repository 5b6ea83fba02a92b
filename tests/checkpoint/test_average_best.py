"""train.keep_best_checkpoints and `attnmt average --best N`: the N best steps saved with a
validation metric are kept beside the last K (through a resume too), and averaged."""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.checkpoint.average import average_checkpoints
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.arguments import load_runs
from attnmt.cli.main import main
from attnmt.config.train import TrainConfig
from attnmt.errors import CheckpointError, ConfigError
from attnmt.workdir import abstract_params_on_one_device
from tests.helpers import event_scalars, tiny_train_args, write_turning_corpus

KEEP_LAST = 2
# One validation value per step 1, 2, …: improving (with a tie and a relapse on the way),
# then worsening after step 9.
LOSSES = [5.0, 4.0, 4.5, 3.0, 3.0, 2.5, 2.0, 2.2, 1.9, 2.6, 3.1, 3.5, 4.0]
BLEUS = [10.0 * (6.0 - loss) for loss in LOSSES]  # the same curve, higher is better


def new_bests(values: list[float], higher_is_better: bool) -> list[int]:
    """The steps (from 1) whose value strictly beats every earlier one: those the trainer
    saves with their metric."""
    steps, best = [], None
    for step, value in enumerate(values, start=1):
        if best is None or (value > best if higher_is_better else value < best):
            steps.append(step)
            best = value
    return steps


def expected_kept(values: list[float], higher_is_better: bool, n_best: int) -> list[int]:
    """Brute force: the n best of the new bests, and the last KEEP_LAST steps."""
    by_value = sorted(
        new_bests(values, higher_is_better),
        key=lambda step: values[step - 1],
        reverse=higher_is_better,
    )
    last = range(max(1, len(values) - KEEP_LAST + 1), len(values) + 1)
    return sorted(set(by_value[:n_best]) | set(last))


def random_state(step: int) -> dict:
    """A train state with random float parameters (scaled so float32 rounding shows)."""
    rng = np.random.default_rng(step)
    return {
        "params": {
            "w": jnp.asarray(rng.normal(size=(16, 8)) * 100, jnp.float32),
            "b": jnp.asarray(rng.normal(size=(8,)) * 100, jnp.float32),
        },
        "step": jnp.asarray(step, jnp.int32),
    }


ABSTRACT = jax.eval_shape(lambda: random_state(0))


def save_curve(
    manager: CheckpointManager, values: list[float], higher_is_better: bool, steps: range
) -> None:
    """Saves `steps` as the trainer does: with the metric when it is a new best."""
    best_steps = new_bests(values, higher_is_better)
    for step in steps:
        metric = values[step - 1] if step in best_steps else None
        manager.save(step, random_state(step), {"position": step}, {"at": step}, metric=metric)
        manager.wait()  # rotation runs once each save is finished


@pytest.mark.parametrize(
    ("by", "values", "n_best"),
    [("loss", LOSSES, 3), ("bleu", BLEUS, 3), ("loss", LOSSES, 1), ("loss", LOSSES, 9)],
)
def test_rotation_keeps_the_n_best_and_the_last_k_through_a_resume(tmp_path, by, values, n_best):
    higher = by == "bleu"
    manager = CheckpointManager(tmp_path, keep=KEEP_LAST, keep_best_by=by, keep_best=n_best)
    for step in range(1, len(values) + 1):
        if step == 8:  # a resumed run reopens the folder: the metrics are read back
            manager.close()
            manager = CheckpointManager(tmp_path, keep=KEEP_LAST, keep_best_by=by, keep_best=n_best)
        save_curve(manager, values, higher, range(step, step + 1))
        assert manager.all_steps() == expected_kept(values[:step], higher, n_best), step
    ranked = [step for step, _ in manager.ranked()]  # best first
    assert ranked == new_bests(values, higher)[::-1][:n_best]
    manager.close()


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory):
    """A workdir saved along LOSSES with keep_best_checkpoints=3."""
    workdir = tmp_path_factory.mktemp("curve")
    manager = CheckpointManager(workdir, keep=KEEP_LAST, keep_best_by="loss", keep_best=3)
    save_curve(manager, LOSSES, False, range(1, len(LOSSES) + 1))
    manager.close()
    return workdir


def test_average_best_is_the_float64_mean_of_the_n_best_steps(curve_run, capsys):
    best3 = sorted(new_bests(LOSSES, False)[-3:])  # the newest three: the three best
    assert main(["average", "--workdir", str(curve_run), "--best", "3"]) == 0
    assert f"averaged steps {best3} into {curve_run / 'average-best3'}" in capsys.readouterr().out
    reader = CheckpointManager(curve_run / "average-best3")
    try:
        assert reader.all_steps() == [best3[-1]]
        state, data, config = reader.restore(best3[-1], ABSTRACT)
    finally:
        reader.close()
    for name, got in state["params"].items():
        stacked = np.stack([np.asarray(random_state(s)["params"][name], np.float64) for s in best3])
        assert got.dtype == np.float32
        np.testing.assert_allclose(np.asarray(got), stacked.mean(axis=0), rtol=1e-6, atol=1e-5)
    # The rest is the best step's own.
    assert int(state["step"]) == best3[-1]
    assert data == {"position": best3[-1]} and config == {"at": best3[-1]}


def test_too_few_kept_bests_are_refused_with_the_steps_and_the_fix(curve_run, tmp_path, capsys):
    code = main(["average", "--workdir", str(curve_run), "--best", "4", "--output", str(tmp_path)])
    assert code == 2
    errors = capsys.readouterr().err.splitlines()
    [line] = [line for line in errors if line.startswith("attnmt average: error:")]
    kept = sorted(new_bests(LOSSES, False)[-3:])
    assert f"(steps: {', '.join(map(str, kept))})" in line
    assert "train.keep_best_checkpoints ≥ 4" in line
    assert not (tmp_path / "checkpoints").exists()
    plain = tmp_path / "plain"  # saved without any metric
    manager = CheckpointManager(plain)
    manager.save(1, random_state(1), {}, {})
    manager.close()
    with pytest.raises(CheckpointError, match=r"holds 0 step\(s\).*steps: none.*keep_best_by"):
        average_checkpoints(plain, best=1)
    with pytest.raises(CheckpointError, match="not both"):
        average_checkpoints(curve_run, 2, best=2)
    with pytest.raises(SystemExit) as refused:  # argparse: --last and --best are exclusive
        main(["average", "--workdir", str(curve_run), "--last", "2", "--best", "2"])
    assert refused.value.code == 2


def test_keep_best_checkpoints_is_checked():
    with pytest.raises(ConfigError, match=r"train\.keep_best_checkpoints=3.*train\.keep_best_by"):
        TrainConfig(keep_best_checkpoints=3)
    with pytest.raises(ConfigError, match=r"train\.keep_best_checkpoints must be positive"):
        TrainConfig(keep_best_by="loss", keep_best_checkpoints=0)
    assert TrainConfig(keep_best_by="loss", keep_best_checkpoints=3).keep_best_checkpoints == 3


EVERY = 10  # train.eval_every_steps = train.checkpoint_every_steps


def test_a_trained_run_averages_its_three_best_steps_and_evaluates(tmp_path, capsys):
    """A real run whose validation loss turns: the three last improvements (read from its
    own TensorBoard scalars) and the last two steps are kept; average --best 3 averages
    the three, and evaluate decodes the averaged workdir."""
    corpus, workdir = write_turning_corpus(tmp_path / "corpus"), tmp_path / "run"
    train = tiny_train_args(
        workdir,
        corpus,
        150,
        *("--config.train.memory_preflight=false", "--config.train.test_at_end=false"),
        *(f"--config.train.{key}={EVERY}" for key in ("eval_every_steps", "log_every_steps")),
        f"--config.train.checkpoint_every_steps={EVERY}",
        f"--config.train.keep_checkpoints={KEEP_LAST}",
        "--config.train.keep_best_by=loss",
        "--config.train.keep_best_checkpoints=3",
        "--config.train.early_stop_patience=2",
        "--config.optim.warmup_steps=20",
        "--config.optim.learning_rate_scale=1.0",
    )
    assert main(train) == 0, capsys.readouterr().err
    losses = event_scalars(workdir / "tensorboard" / "eval", "loss")
    steps = sorted(losses)
    bests = new_bests([losses[s] for s in steps], higher_is_better=False)
    best3 = [steps[i - 1] for i in bests[-3:]]
    assert len(best3) == 3 and best3[-1] < steps[-1]  # the curve turned
    assert CheckpointManager(workdir).all_steps() == sorted({*best3, *steps[-KEEP_LAST:]})

    capsys.readouterr()
    assert main(["average", "--workdir", str(workdir), "--best", "3"]) == 0
    printed = re.search(r"averaged steps \[([\d, ]+)\]", capsys.readouterr().out)
    assert printed and [int(s) for s in printed.group(1).split(",")] == best3
    averaged = workdir / "average-best3"
    fast = ["--beam", "1", "--max-len-offset", "2", "--xla-opt-level", "0"]
    assert main(["evaluate", "--workdir", str(averaged), "--split", "dev", *fast]) == 0
    assert any(f"step{best3[-1]}-" in p.name for p in (averaged / "decodes").iterdir())
    # --average-best on translate/evaluate averages the same steps first.
    flags = dict(workdir=str(workdir), step=None, average_last=0, average_best=3, ensemble=[])
    [run] = load_runs(argparse.Namespace(**flags))
    assert run.step == best3[-1]
    manager = CheckpointManager(workdir)
    try:
        abstract = abstract_params_on_one_device(run.experiment.model)
        saved = [manager.restore_params(step, abstract) for step in best3]
    finally:
        manager.close()
    mean = jax.tree.map(lambda *xs: np.mean([np.asarray(x, np.float64) for x in xs], 0), *saved)
    for got, want in zip(jax.tree.leaves(run.params), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
