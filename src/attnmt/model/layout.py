"""Two layouts of the same layer parameters, and the exact conversion between them.

per-layer (`model.scan_layers=False`, the default): params["encoder_0"], ["encoder_1"], ...
stacked (`model.scan_layers=True`): params["encoder"]["layers"] holds every encoder layer's
arrays with a leading axis of size model.encoder_layers, likewise "decoder". Stacking only moves
arrays, so a checkpoint converts both ways bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnmt.config.model import ModelConfig

_STACKS = ("encoder", "decoder")


def _plain(tree: Any) -> dict[str, Any]:
    """Nested plain dicts of bare arrays (axis-name boxes removed)."""
    tree = nn.meta.unbox(tree)
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def unstack_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    """Stacked layout → per-layer layout (a no-op for per-layer params)."""
    out = _plain(params)
    for stack in _STACKS:
        if stack not in out:
            continue
        layers = out.pop(stack)["layers"]
        for i in range(config.stack_depth(stack)):
            out[f"{stack}_{i}"] = jax.tree_util.tree_map(lambda a, i=i: a[i], layers)
    return out


def stack_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    """Per-layer layout → stacked layout (a no-op for stacked params)."""
    out = _plain(params)
    for stack in _STACKS:
        names = [f"{stack}_{i}" for i in range(config.stack_depth(stack))]
        if names[0] not in out:
            continue
        per_layer = [out.pop(name) for name in names]
        stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)
        out[stack] = {"layers": stacked}
    return out


def for_decoding(config: ModelConfig, params: Any) -> tuple[ModelConfig, Any]:
    """The config and parameters to decode with: incremental decoding (cache, beam
    reordering along the batch axis) runs on the per-layer layout. `params` may be None
    (parameters given later)."""
    if not config.scan_layers:
        return config, params
    per_layer = None if params is None else unstack_layers(params, config)
    return dataclasses.replace(config, scan_layers=False), per_layer
