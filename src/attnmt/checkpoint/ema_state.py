"""Where a train state keeps the moving average of its parameters (optim.ema_decay).

Finding it needs no training code, so inference (`attnmt evaluate --ema`) and checkpoint
averaging read it without importing attnmt.train, which defines the optimizer that keeps it.
"""

from __future__ import annotations

from typing import Any

# The field that holds the average (train/optim.py's ParamsEMAState): checkpoints are
# searched for it by name (their restored trees may be plain dicts), so it must stay unique
# within a train state.
EMA_FIELD = "ema_params"


def find_ema_params(opt_state: Any) -> Any | None:
    """The moving average held in an optimizer state (as built, or as a checkpoint
    restored it without a target: namedtuples as dicts, tuples as lists); None without one."""
    if isinstance(opt_state, tuple) and EMA_FIELD in getattr(opt_state, "_fields", ()):
        return getattr(opt_state, EMA_FIELD)
    if isinstance(opt_state, dict):
        if EMA_FIELD in opt_state:
            return opt_state[EMA_FIELD]
        children = list(opt_state.values())
    elif isinstance(opt_state, (list, tuple)):
        children = list(opt_state)
    else:
        return None
    for child in children:
        found = find_ema_params(child)
        if found is not None:
            return found
    return None
