"""Shared test settings: deterministic CPU JAX and the location of ../shared/data."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    return Path(os.environ.get("ATTNMT_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture
def multi30k_dir() -> Path:
    path = shared_data_dir() / "multi30k"
    if not (path / "train.en").exists():
        pytest.skip(f"Multi30K not found at {path} (set ATTNMT_DATA_DIR)")
    return path
