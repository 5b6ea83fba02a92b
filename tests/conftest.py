"""Shared test settings: deterministic CPU JAX, the location of ../shared/data, and
ATTNMT_TESTS_STRICT=1 (set by .ci/run), under which any skip or xfail, at collection
time or run time, fails the run (tests/strict_mode.py).

Skips exist for a developer's machine that lacks the shared corpora, perl, or 8 fake
devices (a preset XLA_FLAGS device count, another JAX_PLATFORMS). CI must run everything:
a green run that skipped the mesh or corpus tests would prove less than it claims.
"""

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
pytest_plugins = ["tests.strict_mode"]  # ATTNMT_TESTS_STRICT=1: skips and xfails fail


def shared_data_dir() -> Path:
    return Path(os.environ.get("ATTNMT_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def ptb_sample_dir() -> Path:
    """NLTK's WSJ sample (wsj_0001-0179.mrg), for the parsing tests."""
    path = shared_data_dir() / "ptb_sample"
    if not (path / "wsj_0001.mrg").exists():
        pytest.skip(f"the Penn Treebank sample is not at {path} (set ATTNMT_DATA_DIR)")
    return path


@pytest.fixture
def multi30k_dir() -> Path:
    path = shared_data_dir() / "multi30k"
    if not (path / "train.en").exists():
        pytest.skip(f"Multi30K not found at {path} (set ATTNMT_DATA_DIR)")
    return path
