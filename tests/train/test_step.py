"""Gradient accumulation equals one big batch; non-finite updates are skipped."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnmt.common import EOS_ID, PAD_ID
from attnmt.config.train import OptimConfig
from attnmt.model.transformer import Transformer
from attnmt.train import step as steps
from attnmt.train.loss import loss_sums
from attnmt.train.optim import make_optimizer, paper_schedule
from tests.equivalence import LOSS_RTOL, UPDATE_RTOL, assert_same_updates
from tests.helpers import tiny_model

CONFIG = tiny_model(vocab_size=20, num_layers=1)


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
    """Summed gradients and counts of two micro-batches are those of one batch of both, and
    one SGD update from them is the single batch's update (bounds: tests/equivalence.py)."""
    model, _, _, a, b = _setup()
    optimizer = make_optimizer(OptimConfig(algorithm="sgd", warmup_steps=10), CONFIG.d_model)
    state = steps.create_train_state(model, optimizer, jax.random.PRNGKey(0), a)
    schedule = paper_schedule(CONFIG.d_model, 10)
    both = {k: np.concatenate([a[k], b[k]]) for k in a}
    rng = jax.random.PRNGKey(1)
    # Jitted: op by op, the model's many small ops dominate the test's time.
    gradients = jax.jit(lambda p, batch: steps.compute_gradients(model, p, batch, rng, 0.1))
    whole_grads, whole_sums = gradients(state.params, both)
    grads_a, sums_a = gradients(state.params, a)
    grads_b, sums_b = gradients(state.params, b)
    grads = jax.tree_util.tree_map(jnp.add, grads_a, grads_b)
    sums = {k: sums_a[k] + sums_b[k] for k in sums_a}
    # Both are float32 sums of the same per-token terms in another order: within
    # UPDATE_RTOL of the largest entry, per array (and a dropped or doubled micro-batch,
    # or the other's gradient, is off by a sizeable fraction).
    for whole, summed in zip(
        jax.tree_util.tree_leaves(whole_grads), jax.tree_util.tree_leaves(grads), strict=True
    ):
        whole, summed = np.asarray(whole), np.asarray(summed)
        assert np.max(np.abs(summed - whole)) <= UPDATE_RTOL * np.max(np.abs(whole))
    for key in ("loss", "nll", "correct", "tokens"):
        np.testing.assert_allclose(float(sums[key]), float(whole_sums[key]), rtol=LOSS_RTOL)
    expected_tokens = np.count_nonzero(a["tgt_tokens"]) + np.count_nonzero(b["tgt_tokens"])
    assert float(sums["tokens"]) == expected_tokens

    train = jax.jit(functools.partial(steps.train_step, model, optimizer, schedule, 0.1))
    whole, whole_metrics = train(state, both)
    apply = jax.jit(functools.partial(steps.apply_gradients, optimizer, learning_rate_fn=schedule))
    accumulated, metrics = apply(state, grads, sums)
    assert_same_updates(state.params, whole.params, accumulated.params, steps=1)
    np.testing.assert_allclose(float(metrics["loss"]), float(whole_metrics["loss"]), rtol=LOSS_RTOL)


def test_non_finite_gradients_skip_the_update_and_are_counted():
    model, optimizer, state, a, _ = _setup()
    schedule = paper_schedule(CONFIG.d_model, 10)
    gradients = jax.jit(lambda p: steps.compute_gradients(model, p, a, jax.random.PRNGKey(0), 0.1))
    grads, sums = gradients(state.params)
    poisoned = jax.tree_util.tree_map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan), grads)
    apply = jax.jit(functools.partial(steps.apply_gradients, optimizer), static_argnums=3)
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


def test_rbg_dropout_keys_are_deterministic_and_drop_at_the_configured_rate():
    rng = jax.random.PRNGKey(7)
    key = steps.dropout_key(rng, "rbg")
    assert jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0, impl="rbg"))
    ones = jnp.ones((200, 500))

    def dropped_fraction(k):
        kept = jax.random.bernoulli(k, 0.7, ones.shape)
        return float(1.0 - kept.mean()), np.asarray(kept)

    fraction, mask = dropped_fraction(key)
    _, mask_again = dropped_fraction(steps.dropout_key(rng, "rbg"))
    _, other = dropped_fraction(steps.dropout_key(jax.random.PRNGKey(8), "rbg"))
    np.testing.assert_array_equal(mask, mask_again)  # same key → same mask (resume is exact)
    assert (mask != other).mean() > 0.3  # another key → another mask
    # 100k Bernoulli(0.3) draws: the standard deviation of the fraction is 0.0014.
    assert abs(fraction - 0.3) < 0.01
    assert steps.dropout_key(rng, "threefry") is rng


def test_rbg_dropout_train_step_learns_and_repeats_exactly():
    config = dataclasses.replace(CONFIG, dropout_rate=0.3)
    model = Transformer(config)
    optimizer = make_optimizer(OptimConfig(warmup_steps=10), config.d_model)
    schedule = paper_schedule(config.d_model, 10)
    batch = {"src_tokens": _batch(np.random.default_rng(1), 8, 6)}
    batch["tgt_tokens"] = batch["src_tokens"]

    def run(n, impl="rbg"):
        step = jax.jit(
            functools.partial(steps.train_step, model, optimizer, schedule, 0.1, rng_impl=impl)
        )
        state = steps.create_train_state(model, optimizer, jax.random.PRNGKey(0), batch)
        losses = []
        for _ in range(n):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
        return state, losses

    a, losses = run(30)
    b, _ = run(30)
    for x, y in zip(
        jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # It trains as well as threefry dropout: same trend, final losses within 15 %.
    _, threefry_losses = run(30, "threefry")
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    assert abs(np.mean(losses[-5:]) / np.mean(threefry_losses[-5:]) - 1) < 0.15


def test_dropout_phases_run_the_early_rate_before_the_switch_and_the_model_rate_after():
    """train.early_dropout_*: the update's step (a traced value) picks the rate. Dropout 0
    must give the gradients of the deterministic forward pass (an independent path: no
    dropout module draws anything), the later phase those of the model's own rate."""
    late = dataclasses.replace(CONFIG, dropout_rate=0.3)
    model, early = Transformer(late), Transformer(CONFIG)  # CONFIG: dropout 0
    phases = steps.DropoutPhases(model, early, early_steps=2)
    optimizer = make_optimizer(OptimConfig(warmup_steps=10), late.d_model)
    rng = np.random.default_rng(3)
    batch = {"src_tokens": _batch(rng, 4, 6), "tgt_tokens": _batch(rng, 4, 6)}
    state = steps.create_train_state(model, optimizer, jax.random.PRNGKey(0), batch)
    key = jax.random.PRNGKey(5)

    @jax.jit
    def phased(params, step):
        return steps.compute_gradients(phases, params, batch, key, 0.1, step=step)[0]

    @jax.jit
    def plain(params):
        return steps.compute_gradients(model, params, batch, key, 0.1)[0]

    @jax.jit
    def deterministic(params):
        def loss(p):
            logits = model.apply({"params": p}, batch["src_tokens"], batch["tgt_tokens"])
            return loss_sums(logits, batch["tgt_tokens"], 0.1)["loss"]

        return jax.grad(loss)(params)

    def relative_gap(a, b):
        """The largest ‖a − b‖ / ‖b‖ over the gradient arrays."""
        pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
        return max(
            float(np.linalg.norm(np.asarray(x) - np.asarray(y)) / np.linalg.norm(np.asarray(y)))
            for x, y in pairs
        )

    # The same float32 gradient computed in another fusion order: within 2^-12 of its norm
    # per run (tests/equivalence.py derives it), 2^-11 for the difference of two.
    rounding = UPDATE_RTOL / 2
    without, dropped = deterministic(state.params), plain(state.params)
    for step in (0, 1):
        assert relative_gap(phased(state.params, step), without) <= rounding
    for step in (2, 7):
        assert relative_gap(phased(state.params, step), dropped) <= rounding
    # Dropout 0.3 moves the gradients far beyond rounding: the phases are told apart.
    assert relative_gap(dropped, without) > 0.1
