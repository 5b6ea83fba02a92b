"""§5.3 optimizer: Adam(β1 0.9, β2 0.98, ε 1e-9) with warmup then inverse-sqrt decay.

`optim.algorithm="sgd"` swaps Adam for plain gradient descent under the same schedule. It is
not for training translation models: it exists because an update that is a smooth function
of the gradient lets two programs that should be equal (another mesh, gradient
accumulation, another process count) be compared parameter by parameter. Adam's first
updates are ≈ ±lr per parameter whatever the gradient's size, so float rounding that flips
the sign of a near-zero gradient moves that parameter by up to 2·lr.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

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
    """Adam (or SGD) at `schedule`'s rate, after `optim.max_grad_norm` clipping."""
    if config.algorithm == "sgd":
        update = optax.sgd(schedule)
    else:
        update = optax.adam(schedule, b1=config.beta1, b2=config.beta2, eps=config.epsilon)
    if config.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), update)
    return update
