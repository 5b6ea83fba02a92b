"""The device mesh: (data, fsdp, tensor) axes sized from config, -1 = the rest."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from attnmt.config.parallel import ParallelConfig
from attnmt.errors import ConfigError

DATA, FSDP, TENSOR = "data", "fsdp", "tensor"
MESH_AXES = (DATA, FSDP, TENSOR)
BATCH_AXES = (DATA, FSDP)  # the global batch is split over both


def mesh_shape(config: ParallelConfig, device_count: int) -> tuple[int, int, int]:
    """Resolves -1 and checks the product equals the number of devices."""
    sizes = [config.data, config.fsdp, config.tensor]
    known = math.prod(size for size in sizes if size != -1)
    if -1 in sizes:
        if device_count % known:
            raise ConfigError(
                f"parallel sizes {dict(zip(MESH_AXES, sizes, strict=True))} do not divide the "
                f"{device_count} devices present"
            )
        sizes[sizes.index(-1)] = device_count // known
    if math.prod(sizes) != device_count:
        raise ConfigError(
            f"parallel.data × parallel.fsdp × parallel.tensor = {math.prod(sizes)} but "
            f"{device_count} devices are present; set one of them to -1"
        )
    return sizes[0], sizes[1], sizes[2]


def make_mesh(config: ParallelConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    if config.num_devices:
        if config.num_devices > len(devices):
            raise ConfigError(
                f"parallel.num_devices={config.num_devices} but only {len(devices)} are present"
            )
        devices = devices[: config.num_devices]
    shape = mesh_shape(config, len(devices))
    if devices and devices[0].platform in ("tpu", "gpu", "cuda", "rocm"):
        # Topology-aware order (rings along the fast interconnect).
        return jax.make_mesh(shape, MESH_AXES, devices=devices)
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)
