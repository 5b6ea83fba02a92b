"""§5.3 optimizer: Adam(β1 0.9, β2 0.98, ε 1e-9) with warmup then inverse-sqrt decay.

`optim.algorithm="sgd"` swaps Adam for plain gradient descent under the same schedule. It is
not for training translation models: it exists because an update that is a smooth function
of the gradient lets two programs that should be equal (another mesh, gradient
accumulation, another process count) be compared parameter by parameter. Adam's first
updates are ≈ ±lr per parameter whatever the gradient's size, so float rounding that flips
the sign of a near-zero gradient moves that parameter by up to 2·lr.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import jax.numpy as jnp
import optax

from attnmt.errors import ConfigError

Algorithm = Literal["adam", "sgd"]
ALGORITHMS = typing.get_args(Algorithm)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    algorithm: Algorithm = "adam"  # the paper's; "sgd" for equivalence checks (see the docstring)
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0  # multiplies the paper's formula (1.0 = the paper)
    beta1: float = 0.9
    beta2: float = 0.98
    epsilon: float = 1e-9
    max_grad_norm: float = 0.0  # 0 = no clipping, as in the paper

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"optim.algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if self.warmup_steps <= 0:
            raise ConfigError(f"optim.warmup_steps must be positive, got {self.warmup_steps}")
        if self.learning_rate_scale <= 0:
            raise ConfigError(
                f"optim.learning_rate_scale must be positive, got {self.learning_rate_scale}"
            )
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.epsilon <= 0 or self.max_grad_norm < 0:
            raise ConfigError("optim.epsilon must be > 0 and optim.max_grad_norm ≥ 0")


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
