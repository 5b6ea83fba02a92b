"""Launch plans from the environment, and the automatic token budget."""

import math

import pytest

from attnmt.config import load_experiment
from attnmt.data.batching import bucket_shapes
from attnmt.errors import ConfigError
from attnmt.parallel.batch_plan import plan_batches
from attnmt.parallel.distributed import plan_from_environment
from attnmt.train.inputs import batch_plan
from tests.helpers import CONFIGS


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
def test_no_device_holds_more_than_its_budget_and_every_row_has_a_place(devices):
    shapes = bucket_shapes(256, 25_000, batch_multiple=math.lcm(8, devices))
    plan = plan_batches(shapes, devices, max_tokens_per_device=4_096)
    steps = plan.accumulation_steps
    assert plan.update_shapes == shapes and len(plan.micro_shapes) == len(shapes)
    for (rows, length), (micro_rows, micro_length) in zip(shapes, plan.micro_shapes, strict=True):
        assert micro_length == length and micro_rows % devices == 0
        assert micro_rows * steps >= rows  # every sentence of the update has a place
        # Rows per device: the update's rows dealt over steps × devices, rounded up.
        assert micro_rows // devices == -(-rows // (steps * devices))
        assert micro_rows // devices * length <= 4_096
    # The fewest micro-batches: one fewer puts more than the budget on some device.
    if steps > 1:
        fewer = plan_batches(shapes, devices, accumulation_steps=steps - 1)
        assert fewer.max_tokens_per_device > 4_096
    assert f"{steps} micro-batch(es) × {devices} device(s)" in plan.describe()


def test_no_limit_keeps_the_configured_accumulation():
    shapes = [(64, 64), (32, 128)]
    plan = plan_batches(shapes, 4, accumulation_steps=2)
    assert plan.accumulation_steps == 2
    assert plan.micro_shapes == [(32, 64), (16, 128)]
    assert plan.max_tokens_per_device == 8 * 64 == 4 * 128


def test_processes_share_the_batch_evenly_or_the_config_is_refused():
    plan = plan_batches([(48, 16)], 8, processes=2, accumulation_steps=5)
    # 24 rows per process over 5 micro-batches: 5 rows each, rounded up to its 4 devices.
    assert plan.process_micro_rows(24) == 8 and plan.micro_shapes == [(16, 16)]
    with pytest.raises(ConfigError, match=r"data\.batch_multiple"):
        plan_batches([(12, 16)], 8, processes=8)
    with pytest.raises(ConfigError, match="max_tokens_per_device=8 is below one sentence"):
        plan_batches([(12, 16)], 1, max_tokens_per_device=8)


@pytest.mark.parametrize("config", ["wmt14_ende.py:variant=base", "wmt14_enfr.py:variant=big"])
def test_the_paper_batch_is_planned_by_default_in_the_same_order_on_1_to_16_devices(config):
    """The WMT configs need no flag for the paper's ≈25k-token update: on few devices it is
    accumulated. The iterator draws updates from the update shapes alone, which are the
    same for every device count that divides data.batch_multiple (16): the same sentences
    make each update on 1, 4, 8 and 16 devices, however it is split."""
    experiment = load_experiment(str(CONFIGS / config))
    assert experiment.data.batch_multiple == 16
    plans = {devices: batch_plan(experiment, devices, 1) for devices in (1, 4, 8, 16)}
    for devices, plan in plans.items():
        assert plan.update_shapes == plans[1].update_shapes, devices
        tokens = max(rows * length for rows, length in plan.update_shapes)
        assert 0.9 * 25_000 <= tokens <= 25_000
        assert plan.max_tokens_per_device <= experiment.train.max_tokens_per_device
    assert plans[1].accumulation_steps > plans[8].accumulation_steps == 1
