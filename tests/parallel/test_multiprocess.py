"""A real 2-process run (4 CPU devices each, gloo collectives, coordinator on 127.0.0.1)
trains like 1 process × 8 devices, and saves and resumes checkpoints from both processes.

Cross-process all-reduces sum in another order than one process's: the runs use SGD and
the bounds of tests/equivalence.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.workdir import load_run
from tests.equivalence import assert_same_updates, initial_params
from tests.train.test_end_to_end import reversal_corpus  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def _args(corpus, workdir, steps):
    return [
        "--config",
        str(REPO / "configs" / "tiny.py"),
        "--workdir",
        str(workdir),
        f"--config.data.src_path={corpus}/{{split}}.src",
        f"--config.data.tgt_path={corpus}/{{split}}.tgt",
        "--config.data.max_length=16",
        "--config.model.vocab_size=32",
        f"--config.train.num_steps={steps}",
        "--config.train.checkpoint_every_steps=4",
        "--config.train.eval_every_steps=0",
        "--config.train.memory_preflight=false",
        "--config.optim.algorithm=sgd",
    ]


def _env(cache, **extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # A persistent compilation cache only saves time: the resumed 2-process run reuses the
    # first one's compiles (XLA's CPU compile is deterministic).
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.update(extra)
    return env


def _logged_tokens(log: str) -> list[tuple[int, float]]:
    """(step, target_tokens) of every training log line."""
    found = re.findall(r"\[train\] step (\d+) .*target_tokens=(\S+)", log)
    return [(int(step), float(tokens)) for step, tokens in found]


@pytest.mark.slow
def test_two_processes_match_one_process(reversal_corpus, tmp_path):  # noqa: F811
    two, cache = tmp_path / "two", tmp_path / "jax_cache"
    launch = [
        sys.executable,
        str(REPO / "launch" / "local.py"),
        "--processes",
        "2",
        "--devices-per-process",
        "4",
    ]
    subprocess.run(
        [*launch, *_args(reversal_corpus, two, 8)],
        check=True,
        env=_env(cache),
        cwd=REPO,
        timeout=600,
    )
    one = tmp_path / "one"
    single = subprocess.run(
        [sys.executable, "-m", "attnmt", "train", *_args(reversal_corpus, one, 8)],
        check=True,
        env=_env(cache, ATTNMT_LOCAL_DEVICE_COUNT="8"),
        cwd=REPO,
        timeout=600,
        capture_output=True,
        text=True,
    )
    a, b = load_run(two), load_run(one)
    assert a.step == b.step == 8
    assert_same_updates(initial_params(b.experiment), b.params, a.params, steps=8)

    # Only process 0 logs, and its figures are the job's: both processes' rows of the
    # batches (the same global batches as the one-process run's), not its own half.
    logs = [(two / "logs" / f"process_{i}.log").read_text() for i in range(2)]
    assert _logged_tokens(logs[1]) == []
    assert _logged_tokens(logs[0]) == _logged_tokens(single.stderr) != []

    # Both processes resume from the checkpoint they wrote together, and continue.
    subprocess.run(
        [*launch, *_args(reversal_corpus, two, 12)],
        check=True,
        env=_env(cache),
        cwd=REPO,
        timeout=600,
    )
    log = (two / "logs" / "process_1.log").read_text()
    assert "resumed from checkpoint step 8" in log
    assert load_run(two).step == 12
