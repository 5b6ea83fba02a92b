"""Typed configuration of the device mesh (the `parallel` section of a config file)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnmt.config.typed import check_types
from attnmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Mesh axis sizes; exactly one may be -1, meaning "all remaining devices".

    data: batch split, parameters replicated. fsdp: batch split AND parameters/optimizer
    state sharded (ZeRO-3 style). tensor: heads, FFN hidden units and vocabulary split.
    accelerator: the backend the run must get; "any" takes the image's ATTNMT_ACCELERATOR
    (cpu | cuda | tpu), or whatever JAX finds when that is unset (attnmt.parallel.backend).
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    num_devices: int = 0  # use only the first N devices of the job; 0 = all of them
    accelerator: Literal["any", "cpu", "gpu", "tpu"] = "any"

    def __post_init__(self) -> None:
        check_types(self, "parallel")
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            if size == 0 or size < -1:
                raise ConfigError(f"parallel.{name} must be a positive size or -1, got {size}")
        if self.num_devices < 0:
            raise ConfigError(f"parallel.num_devices must be ≥ 0, got {self.num_devices}")
        if sum(size == -1 for size in sizes.values()) > 1:
            raise ConfigError("at most one of parallel.data/fsdp/tensor may be -1")
