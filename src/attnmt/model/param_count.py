"""Parameter counts from abstract shapes (nothing is allocated), with a per-module breakdown."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnmt.config.model import ModelConfig
from attnmt.model.transformer import Transformer


def abstract_params(config: ModelConfig) -> Any:
    """Parameter shapes of the model, via eval_shape (works for the big model on a laptop)."""
    model = Transformer(config)
    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens, tokens)
    return nn.meta.unbox(variables["params"])


def count_parameters(config: ModelConfig) -> dict[str, int]:
    """Counts keyed by '/'-joined module path; the key "total" holds the sum."""
    flat = jax.tree_util.tree_flatten_with_path(abstract_params(config))[0]
    counts: dict[str, int] = {}
    for path, leaf in flat:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        counts[name] = math.prod(leaf.shape)
    counts["total"] = sum(counts.values())
    return counts


def format_breakdown(counts: dict[str, int], depth: int = 2) -> str:
    """A table of parameter counts grouped by the first `depth` levels of module path."""
    groups: dict[str, int] = {}
    for name, count in counts.items():
        if name == "total":
            continue
        key = "/".join(name.split("/")[:depth])
        groups[key] = groups.get(key, 0) + count
    total = counts["total"]
    width = max(len(k) for k in groups) if groups else 10
    lines = [f"{'module':<{width}}  {'parameters':>13}  {'share':>6}"]
    for key, count in groups.items():
        lines.append(f"{key:<{width}}  {count:>13,}  {100 * count / total:>5.1f}%")
    lines.append(f"{'total':<{width}}  {total:>13,}  ({total / 1e6:.1f}M)")
    return "\n".join(lines)
