"""Launch plans from the environment, and the automatic token budget."""

import pytest

from attnmt.errors import ConfigError
from attnmt.parallel.budget import plan_batches
from attnmt.parallel.distributed import plan_from_environment


def test_explicit_coordinator_from_environment():
    plan = plan_from_environment(
        {
            "ATTNMT_COORDINATOR_ADDRESS": "127.0.0.1:1234",
            "ATTNMT_NUM_PROCESSES": "2",
            "ATTNMT_PROCESS_ID": "1",
            "ATTNMT_LOCAL_DEVICE_COUNT": "4",
        }
    )
    assert (
        plan.mode,
        plan.coordinator_address,
        plan.num_processes,
        plan.process_id,
        plan.local_device_count,
    ) == ("explicit", "127.0.0.1:1234", 2, 1, 4)


def test_cluster_and_single_process_detection():
    assert plan_from_environment({"SLURM_NTASKS": "16"}).mode == "auto"
    assert plan_from_environment({"TPU_WORKER_HOSTNAMES": "a,b"}).mode == "auto"
    assert plan_from_environment({}).mode == "single"


@pytest.mark.parametrize(
    "env",
    [
        {
            "ATTNMT_COORDINATOR_ADDRESS": "h:1",
            "ATTNMT_NUM_PROCESSES": "two",
            "ATTNMT_PROCESS_ID": "0",
        },
        {
            "ATTNMT_COORDINATOR_ADDRESS": "h:1",
            "ATTNMT_NUM_PROCESSES": "2",
            "ATTNMT_PROCESS_ID": "2",
        },
    ],
)
def test_bad_environment_is_named(env):
    with pytest.raises(ConfigError, match="ATTNMT_"):
        plan_from_environment(env)


@pytest.mark.parametrize("devices", [1, 2, 8, 64])
def test_effective_batch_is_the_same_at_any_device_count(devices):
    plan = plan_batches(25_000, devices, max_tokens_per_device=4_096)
    effective = plan.accumulation_steps * plan.batch_shards * plan.tokens_per_device
    assert plan.tokens_per_device <= 4_096
    # Whole tokens only: at most one token per device and micro-batch is lost to rounding.
    assert 25_000 - plan.accumulation_steps * devices <= effective <= 25_000
    assert "25,000" in plan.describe()


def test_no_limit_keeps_the_configured_accumulation():
    plan = plan_batches(8_192, 4, accumulation_steps=2)
    assert (plan.accumulation_steps, plan.micro_batch_tokens, plan.tokens_per_device) == (
        2,
        4096,
        1024,
    )
