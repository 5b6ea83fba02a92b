"""One uninterrupted 2-process run (Adam, dropout 0.1), shared by the multi-process tests.

It is computed once per test session, even under xdist: the first worker that needs it
trains it in a folder all workers see, under a file lock, and the others reuse it. The
compilation cache beside it is shared the same way.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import shutil
from pathlib import Path

import pytest

from tests.parallel.jobs import PROBE, Probed, job_env, read_probes, run_job, train_args

LETTERS = list("abcdefgh")
REFERENCE_STEPS = 30
# 160 pairs make 10 updates of 16 rows an epoch: the runs cross two epoch boundaries.
CORPUS_PAIRS = 160
# What every run compared with the reference uses besides train_args: Adam (the configs'
# optimizer) and dropout, a log line per update (tests watch them), periodic saves.
REFERENCE_OVERRIDES = (
    "--config.model.dropout_rate=0.1",
    "--config.train.log_every_steps=1",
    "--config.train.checkpoint_every_steps=15",
)


@dataclasses.dataclass(frozen=True)
class Reference:
    corpus: Path
    cache: Path  # the persistent compilation cache the parallel tests share
    workdir: Path
    probes: list[Probed]  # what each process recorded (tests/parallel/probe.py)


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the workers' common parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def write_corpus(directory: Path, pairs: int = CORPUS_PAIRS) -> Path:
    """Train pairs of 2-5 letters and their reversal (one bucket shape at max_length 8)."""
    rng = random.Random(0)
    lines = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(pairs)]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.src").write_text("\n".join(" ".join(s) for s in lines) + "\n")
    (directory / "train.tgt").write_text("\n".join(" ".join(s[::-1]) for s in lines) + "\n")
    return directory


@pytest.fixture(scope="session")
def two_process_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    root = _shared_root(tmp_path_factory) / "two_process_reference"
    root.mkdir(exist_ok=True)
    corpus, cache, workdir = root / "corpus", root / "jax_cache", root / "workdir"
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "done").exists():
            for partial in (workdir, root / "probes"):  # a failed attempt's
                shutil.rmtree(partial, ignore_errors=True)
            write_corpus(corpus)
            argv = [*PROBE, *train_args(corpus, workdir, REFERENCE_STEPS, *REFERENCE_OVERRIDES)]
            env = job_env(cache, ATTNMT_PROBE_DIR=str(root / "probes"), ATTNMT_PROBE_COMBINE="1")
            for code, out in run_job(argv, root / "reference", env):
                assert code == 0, out[-3000:]
            (root / "done").write_text("")
    return Reference(corpus, cache, workdir, read_probes(root / "probes"))
