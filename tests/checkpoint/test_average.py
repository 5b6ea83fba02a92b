"""Checkpoint averaging against NumPy references, on a tiny Transformer's TrainState."""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.checkpoint.average import average_checkpoints
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.train import OptimConfig
from attnmt.errors import CheckpointError
from attnmt.model.transformer import Transformer
from attnmt.train.optim import make_optimizer
from attnmt.train.step import TrainState, create_train_state
from tests.helpers import tiny_model

EXAMPLE = {"src_tokens": np.zeros((2, 4), np.int32), "tgt_tokens": np.zeros((2, 4), np.int32)}
FILES = ("config.json", "vocab.model", "vocab.vocab")


def _abstract(d_ff: int = 16) -> TrainState:
    """The real TrainState's shapes; eval_shape skips the (slow, op-by-op) initialisation."""
    config = tiny_model(
        vocab_size=16, d_model=8, d_ff=d_ff, d_k=4, d_v=4, num_layers=1, dropout_rate=0.1
    )
    optimizer = make_optimizer(OptimConfig(warmup_steps=10), d_model=8)
    create = functools.partial(create_train_state, Transformer(config), optimizer)
    return jax.eval_shape(create, jax.random.PRNGKey(0), EXAMPLE)


def _state_at(abstract: TrainState, step: int, params=None) -> TrainState:
    """A state whose params are `params` (default: every entry step/10) and whose optimizer
    moments, step counter, RNG and skip count are all recognisably step's own."""
    if params is None:
        params = jax.tree_util.tree_map(
            lambda p: jnp.full(p.shape, step / 10, p.dtype), abstract.params
        )
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=jax.tree_util.tree_map(
            lambda x: jnp.full(x.shape, step, x.dtype), abstract.opt_state
        ),
        dropout_rng=jax.random.PRNGKey(step),
        skipped_steps=jnp.asarray(step % 7, jnp.int32),
    )


def _save(workdir, states: dict) -> None:
    manager = CheckpointManager(workdir)
    for step, state in states.items():
        manager.save(step, state, {"position": step}, {"name": f"config-{step}"})
    manager.close()


def _restore(workdir, step, abstract):
    manager = CheckpointManager(workdir)
    try:
        return manager.restore(step, abstract)
    finally:
        manager.close()


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def abstract() -> TrainState:
    return _abstract()


@pytest.fixture(scope="module")
def random_run(tmp_path_factory, abstract):
    """Checkpoints 10…40 with random parameters (scaled so float32 rounding shows), plus the
    workdir files an average must carry along. Returns (workdir, params by step, states)."""
    rng = np.random.default_rng(0)
    params = {
        step: jax.tree_util.tree_map(
            lambda p: (rng.normal(size=p.shape) * 100).astype(p.dtype), abstract.params
        )
        for step in (10, 20, 30, 40)
    }
    states = {step: _state_at(abstract, step, p) for step, p in params.items()}
    workdir = tmp_path_factory.mktemp("run")
    _save(workdir, states)
    for name in FILES:
        (workdir / name).write_bytes(f"contents of {name}".encode())
    return workdir, params, states


@pytest.mark.parametrize("with_target", [False, True])
def test_average_of_last_three_matches_numpy_and_keeps_the_newest_rest(
    tmp_path, abstract, random_run, with_target
):
    workdir, params, states = random_run
    result = average_checkpoints(
        workdir, 3, tmp_path / "avg", abstract_state=abstract if with_target else None
    )

    assert result.output_dir == tmp_path / "avg"
    assert result.steps == (20, 30, 40) and result.step == 40
    assert CheckpointManager(tmp_path / "avg").all_steps() == [40]
    # Restored the way every command reads a workdir: into a TrainState-shaped target.
    state, data, config = _restore(tmp_path / "avg", 40, abstract)
    assert isinstance(state, TrainState)
    expected = jax.tree_util.tree_map(
        lambda *xs: np.mean(np.stack(xs).astype(np.float64), axis=0),
        *(params[step] for step in (20, 30, 40)),
    )
    got_leaves = jax.tree_util.tree_leaves_with_path(state.params)
    want_leaves = jax.tree_util.tree_leaves_with_path(expected)
    for (got_path, got), (want_path, want) in zip(got_leaves, want_leaves, strict=True):
        assert got_path == want_path and np.asarray(got).dtype == np.float32
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5)
    newest = states[40]
    for name in ("step", "opt_state", "dropout_rng", "skipped_steps"):
        got, want = getattr(state, name), getattr(newest, name)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for got_leaf, want_leaf in zip(_leaves(got), _leaves(want), strict=True):
            assert got_leaf.dtype == want_leaf.dtype
            np.testing.assert_array_equal(got_leaf, want_leaf)
    assert data == {"position": 40} and config == {"name": "config-40"}
    for name in FILES:
        assert (tmp_path / "avg" / name).read_bytes() == f"contents of {name}".encode()


def test_last_larger_than_available_averages_all_with_a_warning(tmp_path, abstract, caplog):
    _save(tmp_path, {step: _state_at(abstract, step) for step in (10, 20)})
    with caplog.at_level(logging.WARNING, logger="attnmt.checkpoint.average"):
        result = average_checkpoints(tmp_path, 5)
    assert result.output_dir == tmp_path / "average-last5"
    assert result.steps == (10, 20) and result.step == 20
    assert any("only 2 checkpoint" in r.getMessage() for r in caplog.records)
    state, _, _ = _restore(result.output_dir, 20, abstract)
    for leaf in _leaves(state.params):
        np.testing.assert_array_equal(leaf, np.full_like(leaf, (1.0 + 2.0) / 2))
    assert not (result.output_dir / "config.json").exists()  # none to copy


def test_different_shapes_are_refused_naming_both_steps_and_the_parameter(tmp_path, abstract):
    _save(tmp_path, {10: _state_at(abstract, 10), 20: _state_at(abstract, 20)})
    _save(tmp_path, {30: _state_at(_abstract(d_ff=32), 30)})  # same workdir, another model

    with pytest.raises(CheckpointError) as error:
        average_checkpoints(tmp_path, 3, tmp_path / "avg")

    message = str(error.value)
    checkpoints = tmp_path.absolute() / "checkpoints"
    assert f"{checkpoints}/10 " in message and f"{checkpoints}/30:" in message
    assert "decoder_0/ffn/wi/bias" in message and "(16,)" in message and "(32,)" in message
    assert not (tmp_path / "avg" / "checkpoints").exists()


def test_existing_output_is_refused_unless_overwrite(tmp_path, abstract):
    _save(tmp_path / "run", {step: _state_at(abstract, step) for step in (10, 20)})
    _save(tmp_path / "avg", {50: _state_at(abstract, 50)})  # a stale, newer step
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        average_checkpoints(tmp_path / "run", 2, tmp_path / "avg")
    average_checkpoints(tmp_path / "run", 2, tmp_path / "avg", overwrite=True)
    assert CheckpointManager(tmp_path / "avg").all_steps() == [20]


def test_bad_requests_are_checkpoint_errors(tmp_path, abstract):
    with pytest.raises(CheckpointError, match="no checkpoints folder"):
        average_checkpoints(tmp_path / "missing", 5)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        average_checkpoints(tmp_path / "empty", 5)
    _save(tmp_path, {10: _state_at(abstract, 10)})
    with pytest.raises(CheckpointError, match="≥ 1"):
        average_checkpoints(tmp_path, 0)
    with pytest.raises(CheckpointError, match="must differ"):
        average_checkpoints(tmp_path, 1, tmp_path, overwrite=True)
    assert CheckpointManager(tmp_path).all_steps() == [10]
