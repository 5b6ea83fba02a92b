"""The persistent compilation cache of `attnmt train` (attnmt/train/compile_cache.py).

Each run is the real `attnmt train` command in a subprocess, with its own cache folder (the
suite's JAX_COMPILATION_CACHE_DIR is removed from its environment). JAX itself says what
came from the cache: with JAX_LOG_COMPILES and JAX_EXPLAIN_CACHE_MISSES it logs
"Persistent compilation cache hit for 'jit_train_step'" or "PERSISTENT COMPILATION CACHE
MISS for ..." at warning level, the lines these tests read. Compiles of any length are
stored (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0): the tiny steps compile in well under
JAX's 1 s threshold.

Needs `compile_cache.enable(chosen, args.workdir)` in attnmt/cli/train.py's run_train,
right after `initialize()`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.cli.report import read_scalars
from attnmt.storage import as_path
from attnmt.train.compile_cache import DEFAULT_FOLDER, cache_dir
from tests.helpers import tiny_train_args, write_reversal_corpus

STEPS = ("jit_train_step", "jit_eval_step")


def hit(module: str) -> str:
    return f"Persistent compilation cache hit for '{module}'"


def miss(module: str) -> str:
    return f"PERSISTENT COMPILATION CACHE MISS for '{module}'"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reversal_corpus(tmp_path_factory.mktemp("corpus"), train=200, dev=16)


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    return {
        **env,
        "JAX_PLATFORMS": "cpu",
        "JAX_LOG_COMPILES": "1",  # cache hits at warning level
        "JAX_EXPLAIN_CACHE_MISSES": "1",  # misses too
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        **extra,
    }


def train(workdir: Path, corpus: Path, steps: int, *extra: str, env: dict | None = None) -> str:
    """`attnmt train` for `steps` updates with an evaluation at the end; its log."""
    args = tiny_train_args(
        workdir,
        corpus,
        steps,
        "--config.train.eval_every_steps=2",
        "--config.train.log_every_steps=1",
        "--config.train.memory_preflight=false",  # it compiles the step once more
        "--config.train.test_at_end=false",
        "--config.parallel.num_devices=1",
        *extra,
    )
    done = subprocess.run(
        [sys.executable, "-m", "attnmt.cli.main", *args],
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir.parent,  # a relative cache folder would land there, not in the checkout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"stopped at step {steps}" in done.stdout, done.stdout[-2000:]
    return done.stderr


def last_scalars(workdir: Path) -> dict[str, float]:
    """The final train and eval scalars, float32 exactly as TensorBoard holds them."""
    found = {}
    for split in ("train", "eval"):
        for tag, scalar in read_scalars(as_path(workdir / "tensorboard" / split)).items():
            if tag not in ("tokens_per_second", "step_time", "model_tflops_per_second"):
                found[f"{split}/{tag}"] = scalar.value
    return found


def test_a_resumed_run_loads_its_steps_and_a_changed_config_compiles_its_own(
    tmp_path: Path, corpus: Path
) -> None:
    workdir = tmp_path / "run"
    first = train(workdir, corpus, 2)
    folder = workdir / DEFAULT_FOLDER
    assert f"persistent compilation cache: {folder}" in first
    for module in STEPS:
        assert miss(module) in first and hit(module) not in first
    written = {p.name for p in folder.iterdir()}
    assert any("train_step" in name for name in written), written

    resumed = train(workdir, corpus, 4)  # the same command, more updates: it resumes at 2
    assert "step 3" in resumed
    for module in STEPS:
        assert hit(module) in resumed and miss(module) not in resumed

    # The same shapes with other math (label smoothing is a constant of the step): a miss,
    # and the same numbers as a run without any cache, which also ignores the environment's
    # JAX_COMPILATION_CACHE_DIR when told "off".
    changed = ("--config.train.label_smoothing=0.2",)
    shared = f"--config.train.compilation_cache_dir={folder}"
    other = train(tmp_path / "changed", corpus, 2, *changed, shared)
    assert miss("jit_train_step") in other and hit("jit_train_step") not in other
    assert len(list(folder.iterdir())) > len(written)
    unused = tmp_path / "unused_cache"
    off = environment(JAX_COMPILATION_CACHE_DIR=str(unused))
    uncached = train(
        tmp_path / "uncached",
        corpus,
        2,
        *changed,
        "--config.train.compilation_cache_dir=off",
        env=off,
    )
    assert "persistent compilation cache: off" in uncached
    assert "COMPILATION CACHE MISS" not in uncached and "cache hit" not in uncached
    assert not unused.exists() or not any(unused.iterdir())
    reference = last_scalars(tmp_path / "uncached")
    assert "train/loss" in reference and "eval/loss" in reference
    assert last_scalars(tmp_path / "changed") == reference


def test_where_the_cache_goes() -> None:
    assert cache_dir("", "/runs/a") == f"/runs/a/{DEFAULT_FOLDER}"
    assert cache_dir("", "gs://bucket/runs/a") == f"gs://bucket/runs/a/{DEFAULT_FOLDER}"
    assert cache_dir("", "/runs/a", already_set="/env/cache") == "/env/cache"  # the env's
    assert cache_dir("gs://bucket/cache", "/runs/a", already_set="/env") == "gs://bucket/cache"
    for word in ("off", "none", "OFF", " None "):
        assert cache_dir(word, "/runs/a", already_set="/env/cache") is None
