"""Multi-process start-up: jax.distributed initialised from the environment.

Cloud TPU VMs and SLURM are detected by JAX itself. Elsewhere (GKE GPU pods, local tests)
the launcher sets ATTNMT_COORDINATOR_ADDRESS, ATTNMT_NUM_PROCESSES and ATTNMT_PROCESS_ID;
ATTNMT_LOCAL_DEVICE_COUNT gives each CPU process that many fake devices (testing only).
Must run before anything asks JAX for its devices.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

import jax

from attnmt.errors import ConfigError

log = logging.getLogger(__name__)

COORDINATOR = "ATTNMT_COORDINATOR_ADDRESS"
NUM_PROCESSES = "ATTNMT_NUM_PROCESSES"
PROCESS_ID = "ATTNMT_PROCESS_ID"
LOCAL_DEVICES = "ATTNMT_LOCAL_DEVICE_COUNT"


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How this process joins the job, read from the environment."""

    mode: str  # "single", "explicit", "auto"
    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    local_device_count: int | None = None


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise ConfigError(
            f"environment variable {name} must be an integer, got {env.get(name)!r}"
        ) from None


def plan_from_environment(env: Mapping[str, str] | None = None) -> LaunchPlan:
    env = os.environ if env is None else env
    local = _int(env, LOCAL_DEVICES) if env.get(LOCAL_DEVICES) else None
    if env.get(COORDINATOR):
        plan = LaunchPlan(
            "explicit", env[COORDINATOR], _int(env, NUM_PROCESSES), _int(env, PROCESS_ID), local
        )
        if not 0 <= plan.process_id < plan.num_processes:
            raise ConfigError(
                f"{PROCESS_ID}={plan.process_id} is outside 0..{plan.num_processes - 1}"
            )
        return plan
    slurm_tasks = int(env.get("SLURM_NTASKS", "1") or 1)
    on_tpu_pod = bool(env.get("TPU_WORKER_HOSTNAMES") or env.get("MEGASCALE_COORDINATOR_ADDRESS"))
    if slurm_tasks > 1 or on_tpu_pod:
        return LaunchPlan("auto", local_device_count=local)
    return LaunchPlan("single", local_device_count=local)


def initialize(plan: LaunchPlan | None = None) -> LaunchPlan:
    """Joins the job described by the environment; a single process needs nothing."""
    plan = plan_from_environment() if plan is None else plan
    if plan.local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", plan.local_device_count)
    if plan.mode == "single":
        return plan
    if plan.local_device_count is not None:
        # CPU processes talk through gloo; accelerators bring their own collectives.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if plan.mode == "explicit":
        jax.distributed.initialize(
            coordinator_address=plan.coordinator_address,
            num_processes=plan.num_processes,
            process_id=plan.process_id,
        )
    else:
        jax.distributed.initialize()
    log.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return plan
