"""Shared test settings: deterministic CPU JAX, the location of ../shared/data, and
ATTNMT_TESTS_STRICT=1 (set by .ci/run), under which any skip or xfail, at collection
time or run time, fails the run (tests/strict_mode.py).

Skips exist for a developer's machine that lacks the shared corpora, perl, or 8 fake
devices (a preset XLA_FLAGS device count, another JAX_PLATFORMS). CI must run everything:
a green run that skipped the mesh or corpus tests would prove less than it claims.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# CTranslate2 reads this at import. Its default int8 GEMM on AMD CPUs (oneDNN) is wrong on
# those without VNNI: on an AVX2-only AMD EPYC, tests/interop/test_ctranslate2.py's int8
# model agreed with float32 on 0 of 12 greedy translations and by 2.57 nats per token; with
# MKL's (CTranslate2's default on Intel) 10 of 12 and 0.07, as on AVX-512 CPUs.
os.environ.setdefault("CT2_USE_MKL", "1")


def _add_xla_flag(name: str, value: str) -> None:
    if name not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --{name}={value}").strip()


# Eight fake CPU devices for the mesh tests; single-device code still runs on device 0.
_add_xla_flag("xla_force_host_platform_device_count", "8")
# LLVM's optimisation level 0 for every compile in the suite (and the subprocesses that keep
# this environment): about a third less CPU time, since the tiny test models spend more time
# compiling than running. No test depends on it: each compares with its reference within
# bounds that hold at any level, bit-exact claims compare runs compiled alike, and
# test_backend_optimization_level_keeps_the_math holds XLA's default level to level 1.
_add_xla_flag("xla_backend_optimization_level", "0")
# One persistent compilation cache for the whole run, shared by the xdist workers and every
# subprocess they start (they inherit the variable): the same tiny train step, compiled by
# the reference run, the killed run and its resumption, is compiled once. Executables are
# keyed by the computation, flags and devices, so a hit is the same program.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="attnmt-tests-jax-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# Only now, with the environment above set: tests.helpers imports jax.
from tests.helpers import shared_data_dir  # noqa: E402

pytest_plugins = ["tests.strict_mode"]  # ATTNMT_TESTS_STRICT=1: skips and xfails fail


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


# The files that take longest (measured with --durations on 2 cores), longest first. Under
# `--dist loadfile` (pyproject.toml) xdist hands each worker whole files, in collection
# order as they free up; starting the longest first keeps one worker from running a long
# file alone at the end. A file missing here only runs later; a stale name does nothing.
LONGEST_FIRST: list[str] = [
    "tests/train/test_end_to_end.py",
    "tests/train/test_resilience.py",
    "tests/parallel/test_multiprocess.py",
    "tests/parallel/test_agreement.py",
    "tests/inspection/test_ablation.py",
    "tests/test_storage.py",
    "tests/interop/test_ctranslate2.py",
    "tests/parallel/test_resume_mesh.py",
    "tests/launch/test_wmt_recipe.py",
    "tests/launch/test_dependency_sets.py",
    "tests/train/test_compilation_cache.py",
    "tests/test_bench_gpu.py",
    "tests/parallel/test_cluster_detection.py",
    "tests/decode/test_parsing.py",
    "tests/launch/test_sweep.py",
    "tests/interop/test_finetune.py",
    "tests/model/test_transformer.py",
    "tests/inspection/test_figures.py",
    "tests/test_notebooks.py",
    "tests/interop/test_export_native.py",
]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
