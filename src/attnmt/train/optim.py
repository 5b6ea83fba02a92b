"""§5.3 optimizer: Adam(β1 0.9, β2 0.98, ε 1e-9) with warmup then inverse-sqrt decay.

`optim.algorithm="sgd"` swaps Adam for plain gradient descent under the same schedule. It is
not for training translation models: it exists because an update that is a smooth function
of the gradient lets two programs that should be equal (another mesh, gradient
accumulation, another process count) be compared parameter by parameter. Adam's first
updates are ≈ ±lr per parameter whatever the gradient's size, so float rounding that flips
the sign of a near-zero gradient moves that parameter by up to 2·lr.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from attnmt.checkpoint.ema_state import EMA_FIELD
from attnmt.config.train import OptimConfig


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), step counted from 1.

    optax passes the number of updates already applied (0 for the first update), so the
    paper's step is that count plus one.
    """

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def with_cooldown(schedule: optax.Schedule, num_steps: int, cooldown_steps: int) -> optax.Schedule:
    """`schedule` times a linear ramp to 0 over the last `cooldown_steps` of `num_steps` updates.

    With optax's count (updates already applied), update num_steps - cooldown_steps is the
    last at full rate and update num_steps (count num_steps - 1) runs at 1/cooldown_steps of it.
    """
    if cooldown_steps <= 0:
        return schedule
    if num_steps < cooldown_steps:
        raise ValueError(f"cooldown_steps={cooldown_steps} exceeds num_steps={num_steps}")

    def cooled(count: jnp.ndarray) -> jnp.ndarray:
        remaining = num_steps - jnp.asarray(count, jnp.float32)
        return schedule(count) * jnp.clip(remaining / cooldown_steps, 0.0, 1.0)

    return cooled


def learning_rate_schedule(config: OptimConfig, d_model: int, num_steps: int) -> optax.Schedule:
    """The rate of every update: the paper's schedule, with `optim.cooldown_steps` at the end."""
    schedule = paper_schedule(d_model, config.warmup_steps, config.learning_rate_scale)
    return with_cooldown(schedule, num_steps, config.cooldown_steps)


def make_optimizer(
    config: OptimConfig, d_model: int, num_steps: int = 0
) -> optax.GradientTransformation:
    """`num_steps` (train.num_steps) is needed only with `optim.cooldown_steps`."""
    return optimizer_with_schedule(config, learning_rate_schedule(config, d_model, num_steps))


def optimizer_with_schedule(
    config: OptimConfig, schedule: optax.Schedule
) -> optax.GradientTransformation:
    """Adam (or SGD) at `schedule`'s rate, after `optim.max_grad_norm` clipping, with
    `optim.weight_decay` decoupled from the gradient's moments (AdamW)."""
    if config.algorithm == "sgd":
        update = optax.sgd(schedule)
        if config.weight_decay > 0:
            # For SGD, decay added to the gradient is already decoupled: -rate·(g + λ·w).
            decay = optax.add_decayed_weights(config.weight_decay, mask=decayed_weights)
            update = optax.chain(decay, update)
    elif config.weight_decay > 0:
        update = optax.adamw(
            schedule,
            b1=config.beta1,
            b2=config.beta2,
            eps=config.epsilon,
            weight_decay=config.weight_decay,
            mask=decayed_weights,
        )
    else:
        update = optax.adam(schedule, b1=config.beta1, b2=config.beta2, eps=config.epsilon)
    if config.max_grad_norm > 0:
        update = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), update)
    if config.ema_decay > 0:
        update = optax.chain(update, params_ema(config.ema_decay))
    return update


def decayed_weights(params: Any) -> Any:
    """True for the parameters weight decay shrinks: matrices and embeddings (two or more
    axes), not biases or layer-norm scales, whose size says nothing of overfitting."""
    return jax.tree_util.tree_map(lambda p: jnp.ndim(p) >= 2, params)


class ParamsEMAState(NamedTuple):
    """An exponential moving average of the parameters after every update."""

    ema_count: jax.Array  # updates averaged so far
    ema_params: Any  # the average, float32, shaped (and sharded) like the parameters


# Inference finds the average by this field's name (attnmt/checkpoint/ema_state.py).
assert EMA_FIELD in ParamsEMAState._fields


def ema_decay_at(decay: float, count: jax.Array) -> jax.Array:
    """The decay used for update `count` + 1: min(decay, (1 + count) / (10 + count)).

    Ramping the decay up keeps the random initialisation from lingering in the average of
    a short run: with a constant 0.999 it would still weigh 0.999^3000 ≈ 5 % after 3,000
    updates; with the ramp its weight after t updates is the product of (1 + c)/(10 + c)
    over c < t, 9!·t!/(t + 9)!: 0.1 after one update, 5e-10 after 40.
    """
    count = jnp.asarray(count, jnp.float32)
    return jnp.minimum(decay, (1.0 + count) / (10.0 + count))


def params_ema(decay: float) -> optax.GradientTransformation:
    """Leaves the updates as they are and keeps, in its state, the moving average of the
    parameters they produce. Last in a chain, it sees the final updates; a skipped update
    (train/step.py keeps the old optimizer state) leaves the average as it was. Living in
    the optimizer state, the average is checkpointed, sharded and resumed with it."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"ema decay must be in (0, 1), got {decay}")

    def init(params: Any) -> ParamsEMAState:
        copy = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float32), params)
        return ParamsEMAState(ema_count=jnp.zeros((), jnp.int32), ema_params=copy)

    def update(updates: Any, state: ParamsEMAState, params: Any = None) -> tuple:
        if params is None:
            raise ValueError("params_ema needs the parameters (optimizer.update(g, s, params))")
        new_params = optax.apply_updates(params, updates)
        d = ema_decay_at(decay, state.ema_count)
        average = jax.tree_util.tree_map(
            lambda a, p: d * a + (1.0 - d) * p.astype(jnp.float32), state.ema_params, new_params
        )
        return updates, ParamsEMAState(ema_count=state.ema_count + 1, ema_params=average)

    return optax.GradientTransformation(init, update)
