"""The moving average of the parameters (optim.ema_decay): its arithmetic against a float64
NumPy recursion, skipped updates, the workdir `attnmt average --ema` writes, and the commands
that train with it and decode it."""

import argparse
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from attnmt.checkpoint.average import ema_checkpoint
from attnmt.checkpoint.ema_state import find_ema_params
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.arguments import load_runs
from attnmt.cli.main import main
from attnmt.config.train import OptimConfig
from attnmt.errors import CheckpointError, ConfigError
from attnmt.model.transformer import Transformer
from attnmt.train.assemble import build_trainer
from attnmt.train.optim import make_optimizer, optimizer_with_schedule
from attnmt.train.step import TrainState, apply_gradients, create_train_state
from attnmt.workdir import load_run
from tests.helpers import (
    TINY_CONFIG,
    event_scalars,
    reversal_overrides,
    tiny_experiment,
    tiny_model,
)

RATE = 0.05


def _sgd(decay: float):
    config = OptimConfig(algorithm="sgd", ema_decay=decay) if decay else OptimConfig("sgd")
    return optimizer_with_schedule(config, lambda count: RATE)


def test_average_follows_the_float64_recursion_and_leaves_the_updates_alone():
    rng = np.random.default_rng(0)
    start = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=(5,))}
    grads = [{k: rng.normal(size=v.shape) for k, v in start.items()} for _ in range(40)]
    decay = 0.9

    # The reference: SGD's parameters in float64, averaged with the documented ramp.
    params = {k: v.copy() for k, v in start.items()}
    average = {k: v.copy() for k, v in start.items()}
    for count, grad in enumerate(grads):
        params = {k: params[k] - RATE * grad[k] for k in params}
        d = min(decay, (1 + count) / (10 + count))
        average = {k: d * average[k] + (1 - d) * params[k] for k in params}

    as32 = functools.partial(jax.tree_util.tree_map, lambda x: jnp.asarray(x, jnp.float32))
    with_ema, plain = _sgd(decay), _sgd(0.0)
    p_ema, s_ema = as32(start), with_ema.init(as32(start))
    p_plain, s_plain = as32(start), plain.init(as32(start))
    for grad in grads:
        u, s_ema = with_ema.update(as32(grad), s_ema, p_ema)
        p_ema = jax.tree_util.tree_map(lambda p, x: p + x, p_ema, u)
        u, s_plain = plain.update(as32(grad), s_plain, p_plain)
        p_plain = jax.tree_util.tree_map(lambda p, x: p + x, p_plain, u)
    for name in start:  # the average changes nothing about training itself
        np.testing.assert_array_equal(np.asarray(p_ema[name]), np.asarray(p_plain[name]))
    found = find_ema_params(s_ema)
    assert find_ema_params(s_plain) is None
    for name in start:
        # 40 float32 multiply-adds of values of order 1: a few ulp each, far under 1e-5.
        np.testing.assert_allclose(np.asarray(found[name]), average[name], rtol=0, atol=1e-5)
        # ...and it is an average, not the parameters: the last 40 updates moved them apart.
        assert np.abs(average[name] - params[name]).max() > 1e-3


def _tiny_state(decay: float) -> tuple[TrainState, object]:
    config = tiny_model(vocab_size=16, d_model=8, d_ff=16, d_k=4, d_v=4, num_layers=1)
    optimizer = make_optimizer(OptimConfig(warmup_steps=10, ema_decay=decay), d_model=8)
    example = {"src_tokens": np.zeros((2, 4), np.int32), "tgt_tokens": np.zeros((2, 4), np.int32)}
    return create_train_state(Transformer(config), optimizer, jax.random.PRNGKey(0), example), (
        optimizer
    )


def test_a_skipped_update_leaves_the_average_as_it_was():
    state, optimizer = _tiny_state(0.99)
    ones = jax.tree_util.tree_map(jnp.ones_like, state.params)
    sums = {"tokens": jnp.asarray(4.0), "loss": jnp.asarray(1.0), "nll": jnp.asarray(1.0)}
    sums["correct"] = jnp.asarray(0.0)
    moved, _ = apply_gradients(optimizer, state, ones, sums, lambda c: 0.1)
    assert int(moved.step) == 1
    nan = jax.tree_util.tree_map(lambda g: g * jnp.nan, ones)
    kept, metrics = apply_gradients(optimizer, moved, nan, sums, lambda c: 0.1)
    assert int(metrics["skipped"]) == 1
    before, after = find_ema_params(moved.opt_state), find_ema_params(kept.opt_state)
    for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("with_target", [False, True])
def test_ema_workdir_holds_the_average_as_its_params(tmp_path, with_target):
    state, _ = _tiny_state(0.99)
    rng = np.random.default_rng(1)
    randomised = jax.tree_util.tree_map(
        lambda x: (
            jnp.asarray(rng.normal(size=x.shape), x.dtype)
            if jnp.issubdtype(x.dtype, jnp.floating)
            else x
        ),
        state,
    )
    workdir = tmp_path / "run"
    manager = CheckpointManager(workdir)
    manager.save(10, state, {"position": 10}, {"name": "c"})
    manager.save(20, randomised, {"position": 20}, {"name": "c"})
    manager.close()
    (workdir / "config.json").write_text("{}")

    abstract = jax.eval_shape(lambda: state) if with_target else None
    result = ema_checkpoint(workdir, abstract_state=abstract)
    assert result.output_dir == workdir / "ema" and result.step == 20
    assert (workdir / "ema" / "config.json").read_text() == "{}"
    reader = CheckpointManager(workdir / "ema")
    assert reader.all_steps() == [20]
    written, data, _ = reader.restore(20, jax.eval_shape(lambda: state))
    reader.close()
    assert data == {"position": 20}
    expected = find_ema_params(randomised.opt_state)
    for got, want in zip(
        jax.tree_util.tree_leaves(written.params), jax.tree_util.tree_leaves(expected), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Everything but the parameters is the newest step's own (training could resume from it).
    for got, want in zip(
        jax.tree_util.tree_leaves(written.opt_state),
        jax.tree_util.tree_leaves(randomised.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    # An older step's average, by number: step 10 holds the untouched state's own average.
    result = ema_checkpoint(workdir, abstract_state=abstract, overwrite=True, step=10)
    assert result.step == 10
    reader = CheckpointManager(workdir / "ema")
    assert reader.all_steps() == [10]
    written, _, _ = reader.restore(10, jax.eval_shape(lambda: state))
    reader.close()
    for got, want in zip(
        jax.tree_util.tree_leaves(written.params),
        jax.tree_util.tree_leaves(find_ema_params(state.opt_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(CheckpointError, match=r"no step 15 .*present: 10, 20"):
        ema_checkpoint(workdir, overwrite=True, step=15)
    with pytest.raises(CheckpointError, match="no best checkpoint"):
        ema_checkpoint(workdir, overwrite=True, step="best")


def test_ema_of_a_run_without_one_says_which_key_to_set(tmp_path):
    state, _ = _tiny_state(0.0)
    manager = CheckpointManager(tmp_path / "run")
    manager.save(5, state, {"position": 5}, {"name": "c"})
    manager.close()
    with pytest.raises(CheckpointError, match=r"optim\.ema_decay"):
        ema_checkpoint(tmp_path / "run")


def test_bad_decay_names_the_key():
    with pytest.raises(ConfigError, match=r"optim\.ema_decay"):
        OptimConfig(ema_decay=1.0)


def _train(corpus, workdir, decay: float, capsys) -> str:
    (corpus / "test.src").write_text((corpus / "dev.src").read_text())
    (corpus / "test.tgt").write_text((corpus / "dev.tgt").read_text())
    argv = ["train", "--config", str(TINY_CONFIG), "--workdir", str(workdir)]
    extra = [f"--config.optim.ema_decay={decay}", "--config.train.eval_every_steps=15"]
    extra.append("--config.train.checkpoint_every_steps=15")  # step 15 too, for --step
    assert main([*argv, *reversal_overrides(corpus, 30), *extra]) == 0
    return capsys.readouterr().out


def _figures(corpus, workdir) -> dict[str, float]:
    """The validation figures of the run in `workdir` at its newest step (resumed: the
    run is finished, so nothing trains)."""
    overrides = [*reversal_overrides(corpus, 30), "--config.optim.ema_decay=0.9"]
    return build_trainer(tiny_experiment(overrides), workdir).evaluate()


@pytest.mark.slow
def test_training_reports_and_decodes_the_average(reversal_corpus, tmp_path, capsys):
    workdir = tmp_path / "run"
    out = _train(reversal_corpus, workdir, 0.9, capsys)
    # train.test_at_end decodes the average (written to <workdir>/ema) and prints its score.
    (printed,) = (float(x) for x in re.findall(r"sacreBLEU\s+([0-9.]+)", out))
    decoded = workdir / "decodes" / "test-step30-ema-beam4.tgt"
    references = (reversal_corpus / "test.tgt").read_text().splitlines()
    assert printed == pytest.approx(
        sacrebleu.corpus_bleu(decoded.read_text().splitlines(), [references]).score, abs=0.006
    )
    # Validation's ema_* figures (as the run logged them at its last step, in float32) are
    # those of the average's own workdir (whose parameters are the average:
    # test_ema_workdir_holds_the_average_as_its_params), not the run's.
    logged = {
        name: event_scalars(workdir / "tensorboard" / "eval", name)[30]
        for name in ("nll", "ema_nll")
    }
    average = _figures(reversal_corpus, workdir / "ema")
    assert logged["ema_nll"] == pytest.approx(average["nll"], rel=1e-6)
    assert abs(logged["ema_nll"] - logged["nll"]) > 1e-3

    decoded.unlink()
    (workdir / "ema" / "config.json").unlink()  # evaluate --ema writes the workdir afresh
    assert main(["evaluate", "--workdir", str(workdir), "--split", "test", "--ema"]) == 0
    assert decoded.is_file() and (workdir / "ema" / "config.json").is_file()
    # --step picks another step's average: the file names that step.
    argv = ["evaluate", "--workdir", str(workdir), "--split", "test", "--ema", "--step", "15"]
    assert main(argv) == 0
    assert (workdir / "decodes" / "test-step15-ema-beam4.tgt").is_file()
    assert "moving average of step 15 in" in capsys.readouterr().err
    assert main(["average", "--workdir", str(workdir), "--step", "15"]) == 2
    assert "--step goes with --ema" in capsys.readouterr().err

    # With --ensemble, --ema decodes every member's average (of its newest step). A run
    # ensembled with itself is the run: the log-linear mean of one distribution is that
    # distribution, so its decodes equal the average's alone; were the member's raw
    # parameters used instead, the second model would differ from the first.
    args = argparse.Namespace(
        workdir=workdir, step=None, ema=True, average_last=0, average_best=0, ensemble=[workdir]
    )
    first, member = load_runs(args)
    raw = load_run(workdir)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(np.array_equal, member.params, first.params)
    )
    assert not jax.tree_util.tree_all(
        jax.tree_util.tree_map(np.array_equal, member.params, raw.params)
    )
    argv = ["evaluate", "--workdir", str(workdir), "--split", "test", "--ema"]
    assert main([*argv, "--ensemble", str(workdir)]) == 0
    alone = (workdir / "decodes" / "test-step30-ema-beam4.tgt").read_text()
    assert (workdir / "decodes" / "test-step30-ema-ensemble-beam4.tgt").read_text() == alone
