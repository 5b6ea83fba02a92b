"""Gradient accumulation equals one big batch; non-finite updates are skipped."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.model.config import EOS_ID, PAD_ID, ModelConfig
from attnmt.model.transformer import Transformer
from attnmt.train import step as steps
from attnmt.train.optim import OptimConfig, make_optimizer, paper_schedule

CONFIG = ModelConfig(
    vocab_size=20, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, num_layers=1, dropout_rate=0.0
)


def _batch(rng, rows, length):
    tokens = rng.integers(4, 20, size=(rows, length)).astype(np.int32)
    lengths = rng.integers(2, length + 1, size=rows)
    for row, n in enumerate(lengths):
        tokens[row, n - 1] = EOS_ID
        tokens[row, n:] = PAD_ID
    return tokens


def _setup():
    model = Transformer(CONFIG)
    optimizer = make_optimizer(OptimConfig(warmup_steps=10), CONFIG.d_model)
    rng = np.random.default_rng(0)
    a = {"src_tokens": _batch(rng, 4, 6), "tgt_tokens": _batch(rng, 4, 6)}
    b = {"src_tokens": _batch(rng, 4, 6), "tgt_tokens": _batch(rng, 4, 6)}
    state = steps.create_train_state(model, optimizer, jax.random.PRNGKey(0), a)
    return model, optimizer, state, a, b


def test_two_micro_batches_equal_one_batch_of_both():
    model, optimizer, state, a, b = _setup()
    schedule = paper_schedule(CONFIG.d_model, 10)
    both = {k: np.concatenate([a[k], b[k]]) for k in a}
    whole, whole_metrics = steps.train_step(model, optimizer, schedule, 0.1, state, both)
    rng = jax.random.PRNGKey(1)
    grads_a, sums_a = steps.compute_gradients(model, state.params, a, rng, 0.1)
    grads_b, sums_b = steps.compute_gradients(model, state.params, b, rng, 0.1)
    grads = jax.tree_util.tree_map(jnp.add, grads_a, grads_b)
    sums = {k: sums_a[k] + sums_b[k] for k in sums_a}
    accumulated, metrics = steps.apply_gradients(optimizer, state, grads, sums, schedule)
    for x, y in zip(
        jax.tree_util.tree_leaves(whole.params),
        jax.tree_util.tree_leaves(accumulated.params),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"]), float(whole_metrics["loss"]), rtol=1e-6)
    expected_tokens = np.count_nonzero(a["tgt_tokens"]) + np.count_nonzero(b["tgt_tokens"])
    assert float(metrics["tokens"]) == expected_tokens


def test_non_finite_gradients_skip_the_update_and_are_counted():
    model, optimizer, state, a, _ = _setup()
    schedule = paper_schedule(CONFIG.d_model, 10)
    grads, sums = steps.compute_gradients(model, state.params, a, jax.random.PRNGKey(0), 0.1)
    poisoned = jax.tree_util.tree_map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), grads)
    apply = functools.partial(steps.apply_gradients, optimizer)
    skipped, metrics = apply(state, poisoned, sums, schedule)
    assert int(skipped.step) == 0 and int(skipped.skipped_steps) == 1 and int(metrics["skipped"])
    for x, y in zip(
        jax.tree_util.tree_leaves(skipped.params),
        jax.tree_util.tree_leaves(state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    again, _ = apply(skipped, poisoned, sums, schedule)
    assert int(again.skipped_steps) == 2
    recovered, _ = apply(again, grads, sums, schedule)
    assert int(recovered.step) == 1 and int(recovered.skipped_steps) == 0
