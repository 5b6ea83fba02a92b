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


def make_optimizer(config: OptimConfig, d_model: int) -> optax.GradientTransformation:
    schedule = paper_schedule(d_model, config.warmup_steps, config.learning_rate_scale)
    if config.algorithm == "sgd":
        update = optax.sgd(schedule)
    else:
        update = optax.adam(schedule, b1=config.beta1, b2=config.beta2, eps=config.epsilon)
    if config.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), update)
    return update
