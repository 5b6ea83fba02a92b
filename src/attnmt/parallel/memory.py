"""How much memory a device offers and how much a compiled program needs.

XLA's compiled memory analysis gives a program's bytes (its arguments, outputs and
temporaries) before it runs; the device offers `bytes_limit` on GPU/TPU, and on CPU the
smaller of physical memory and the cgroup limit, which all CPU devices share. Training's
pre-flight (attnmt.train.preflight) and decoding's batch sizing (attnmt.decode.batch_memory)
both read them here.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def format_bytes(count: int) -> str:
    """1.50 GiB, 12.3 MiB: readable at every scale from the tiny test model to Big."""
    if count >= 1024**3:
        return f"{count / 1024**3:.2f} GiB"
    return f"{count / 1024**2:.1f} MiB"


def tree_bytes(tree: Any) -> int:
    """Bytes of every array (or ShapeDtypeStruct) leaf in `tree`."""
    return sum(
        math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
        for leaf in jax.tree_util.tree_leaves(tree)
    )


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of `tree`'s leaves: a leaf with a sharding (an array, or a
    ShapeDtypeStruct carrying one) counts its shard, a leaf without one counts whole."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = leaf.shape if sharding is None else sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


class NoMemoryAnalysisError(Exception):
    """The backend compiled the program but reports no memory figures."""


def compiled_stats(compiled: Any) -> Any:
    """The compiled program's memory analysis (bytes per device)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise NoMemoryAnalysisError("this backend reports no compiled memory analysis")
    return stats


def compiled_peak_bytes(compiled: Any) -> int:
    """Bytes per device the compiled program holds at once: arguments, outputs and
    temporaries (donated arguments aliased to outputs counted once) and its code."""
    stats = compiled_stats(compiled)
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
    )


def host_memory_bytes() -> int | None:
    """The smaller of physical memory and the cgroup's limit; None when neither is known."""
    limits = []
    # Not POSIX, or not reported: no physical-memory figure.
    with contextlib.suppress(ValueError, OSError, AttributeError):
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" means no limit; v1 reports a huge number instead
            limits.append(int(text))
    return min(limits) if limits else None


def device_memory_limit(device: jax.Device | None = None) -> tuple[int | None, str]:
    """(bytes one device may use, a description of where that figure comes from)."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except (NotImplementedError, RuntimeError):  # some backends do not implement it
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} {device.id}"
    if device.platform == "cpu":
        return host_memory_bytes(), "host memory (CPU)"
    return None, device.platform


def shared_limit(
    limit: int | None, where: str, devices: list[jax.Device]
) -> tuple[int | None, str]:
    """(each device's share of `limit`, where it comes from): on a CPU every device of this
    process draws on the same host memory, so each may count on 1/n of it."""
    sharing = sum(d.platform == "cpu" and d.process_index == jax.process_index() for d in devices)
    if limit is None or sharing <= 1:
        return limit, where
    return limit // sharing, f"{where}, shared by {sharing} CPU devices"
