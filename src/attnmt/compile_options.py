"""XLA compiler options that a config may set for the jitted steps.

`xla_backend_optimization_level` is the optimisation level of XLA's backend code
generation (LLVM for CPU): lower levels compile much faster, while matmuls and
convolutions still run in the same libraries.
"""

from __future__ import annotations

from typing import Any

from attnmt.errors import ConfigError

DEFAULT_LEVEL = -1  # leave XLA's own default


def check_level(section: str, level: int) -> None:
    if isinstance(level, bool) or not isinstance(level, int) or not -1 <= level <= 3:
        raise ConfigError(
            f"{section}.xla_backend_optimization_level must be an integer in 0…3, or -1 "
            f"for XLA's default, got {level!r}"
        )


def compiler_options(level: int) -> dict[str, Any] | None:
    """`compiler_options` for jax.jit; None keeps every XLA default."""
    if level == DEFAULT_LEVEL:
        return None
    return {"xla_backend_optimization_level": level}
