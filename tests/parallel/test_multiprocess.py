"""A real 2-process run (4 CPU devices each, gloo collectives, coordinator on 127.0.0.1)
trains like 1 process × 8 devices, and saves and resumes checkpoints from both processes."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from attnmt.workdir import load_run
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
        "--config.train.eval_every_steps=1000",
        "--config.train.memory_preflight=false",
    ]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(extra)
    return env


@pytest.mark.slow
def test_two_processes_match_one_process(reversal_corpus, tmp_path):  # noqa: F811
    two = tmp_path / "two"
    launch = [
        sys.executable,
        str(REPO / "launch" / "local.py"),
        "--processes",
        "2",
        "--devices-per-process",
        "4",
    ]
    subprocess.run(
        [*launch, *_args(reversal_corpus, two, 8)], check=True, env=_env(), cwd=REPO, timeout=600
    )
    one = tmp_path / "one"
    subprocess.run(
        [sys.executable, "-m", "attnmt", "train", *_args(reversal_corpus, one, 8)],
        check=True,
        env=_env(ATTNMT_LOCAL_DEVICE_COUNT="8"),
        cwd=REPO,
        timeout=600,
    )
    a, b = load_run(two), load_run(one)
    assert a.step == b.step == 8
    for x, y in zip(
        jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params), strict=True
    ):
        x, y = np.asarray(x), np.asarray(y)
        assert np.max(np.abs(x - y)) <= 1e-5 * max(np.max(np.abs(y)), 1e-3)

    # Both processes resume from the checkpoint they wrote together, and continue.
    subprocess.run(
        [*launch, *_args(reversal_corpus, two, 12)], check=True, env=_env(), cwd=REPO, timeout=600
    )
    log = (two / "logs" / "process_1.log").read_text()
    assert "resumed from checkpoint step 8" in log
    assert load_run(two).step == 12
