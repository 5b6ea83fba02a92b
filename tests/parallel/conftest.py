"""One uninterrupted 2-process run (Adam, dropout 0.1), shared by the multi-process tests.

It is computed once per test session, even under xdist: the first worker that needs it
trains it in a folder all workers see, under a file lock, and the others reuse it. The
compilation cache beside it is shared the same way.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
from pathlib import Path

import pytest

from tests.parallel.jobs import (
    PROBE,
    REFERENCE_OVERRIDES,
    REFERENCE_STEPS,
    Probed,
    job_env,
    read_probes,
    run_job,
    train_args,
    write_corpus,
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
