"""Shared test settings: deterministic CPU JAX and the location of ../shared/data."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight fake CPU devices for the mesh tests; single-device code still runs on device 0.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    return Path(os.environ.get("ATTNMT_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture
def multi30k_dir() -> Path:
    path = shared_data_dir() / "multi30k"
    if not (path / "train.en").exists():
        pytest.skip(f"Multi30K not found at {path} (set ATTNMT_DATA_DIR)")
    return path
