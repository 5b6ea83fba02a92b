"""XLA compiler options that a config may set for the jitted steps.

`xla_backend_optimization_level` is the optimisation level of XLA's backend code
generation (LLVM for CPU): lower levels compile much faster, while matmuls and
convolutions still run in the same libraries.
"""

from __future__ import annotations

from typing import Any, Literal

OptimizationLevel = Literal[-1, 0, 1, 2, 3]  # -1 leaves XLA's own default
DEFAULT_LEVEL = -1


def compiler_options(level: int) -> dict[str, Any] | None:
    """`compiler_options` for jax.jit; None keeps every XLA default."""
    if level == DEFAULT_LEVEL:
        return None
    return {"xla_backend_optimization_level": level}
