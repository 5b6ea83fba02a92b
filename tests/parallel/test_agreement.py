"""Two real processes (2 CPU devices each, gloo, coordinator on 127.0.0.1) take every
clock- and signal-driven decision together: with clocks made to disagree they save the same
steps and stop at the same step; SIGTERM to one of them stops both at the same step with
exit 143; the rerun resumes bit-exactly (against an uninterrupted 2-process run).

Every launch is bounded by a timeout that kills the whole process group: a disagreement
would otherwise hang in a collective, and the test must fail, not wait."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from attnmt.parallel.agreement import any_process, sum_over_processes
from attnmt.workdir import load_run
from tests.parallel.test_multiprocess import REPO, _args, _env
from tests.train.test_end_to_end import reversal_corpus  # noqa: F401

PROCESSES, DEVICES = 2, 2
NUM_STEPS = 12
TIMEOUT_S = 300

# Process i's clock advances 1 + 2i seconds per reading (process 1 runs three times as
# fast); process 1 sends itself SIGTERM after update $SIGTERM_AT_STEP. Saves are printed.
_PROGRAM = """
import logging, os, signal, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.train import loop, stopping

process = int(os.environ["ATTNMT_PROCESS_ID"])
sigterm_at = int(os.environ.get("SIGTERM_AT_STEP", "-1"))

class Clock:
    now = 0.0

    def monotonic(self):
        self.now += 1.0 + 2.0 * process
        return self.now

stopping.time = Clock()
real_save = CheckpointManager.save

def save(self, step, *args):
    print(f"saving step {step}", flush=True)
    real_save(self, step, *args)

CheckpointManager.save = save
real_train_once = loop.Trainer._train_once

def train_once(self):
    step, skipped = real_train_once(self)
    if process == 1 and step == sigterm_at:
        os.kill(os.getpid(), signal.SIGTERM)
    return step, skipped

loop.Trainer._train_once = train_once
sys.exit(main(sys.argv[1:]))
"""


def _launch(corpus, workdir: Path, cache: Path, *overrides: str, **env) -> list[tuple[int, str]]:
    """Trains in `workdir`; returns each process's (exit code, output)."""
    argv = [sys.executable, "-c", _PROGRAM, "train", *_args(corpus, workdir, NUM_STEPS)]
    return _run_processes([*argv, *overrides], workdir.parent / workdir.name, cache, **env)


def _run_processes(argv: list[str], log_stem: Path, cache: Path, **env) -> list[tuple[int, str]]:
    """`argv` as process 0..PROCESSES-1 of one job, killed (and failed) past TIMEOUT_S."""
    port, processes, logs = _free_port(), [], []
    for index in range(PROCESSES):
        process_env = _env(
            cache,
            JAX_PLATFORMS="cpu",
            ATTNMT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            ATTNMT_NUM_PROCESSES=str(PROCESSES),
            ATTNMT_PROCESS_ID=str(index),
            ATTNMT_LOCAL_DEVICE_COUNT=str(DEVICES),
            **env,
        )
        logs.append(Path(f"{log_stem}.{index}.{time.monotonic_ns()}.log"))
        with logs[-1].open("wb") as log:  # the child keeps its own descriptor
            processes.append(
                subprocess.Popen(
                    argv,
                    env=process_env,
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        codes = [p.wait(timeout=max(deadline - time.monotonic(), 1)) for p in processes]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = [log.read_text(errors="replace") for log in logs]
    assert codes is not None, f"the job hung (over {TIMEOUT_S} s):\n" + outputs[0][-3000:]
    return list(zip(codes, outputs, strict=True))


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _saves(output: str) -> list[int]:
    return [int(step) for step in re.findall(r"^saving step (\d+)$", output, re.MULTILINE)]


def _stop(output: str) -> tuple[int, str]:
    found = re.findall(r"stopped at step (\d+): ([^;\n]+)", output)
    assert found, output[-3000:]
    step, reason = found[-1]
    return int(step), reason


@pytest.mark.slow
def test_processes_agree_on_time_and_signals_and_resume_bit_exactly(
    reversal_corpus,  # noqa: F811
    tmp_path,
):
    cache = tmp_path / "jax_cache"
    reference = tmp_path / "reference"
    reference.mkdir()
    for code, out in _launch(reversal_corpus, reference, cache):
        assert code == 0, out[-3000:]

    run = tmp_path / "run"
    run.mkdir()
    # 1. Clocks that disagree: checkpoints every 6 s and a 24 s limit, read on process 1's
    #    fast clock first. Without agreement one process would enter a save (or leave the
    #    loop) alone and the job would hang.
    timed = _launch(
        reversal_corpus,
        run,
        cache,
        "--config.train.checkpoint_every_steps=0",
        "--config.train.checkpoint_every_minutes=0.1",
        "--config.train.time_limit_minutes=0.4",
    )
    (code0, out0), (code1, out1) = timed
    assert code0 == code1 == 0, out0[-2000:] + out1[-2000:]
    stop0, stop1 = _stop(out0), _stop(out1)
    assert stop0 == stop1 and stop0[1].startswith("time limit"), (stop0, stop1)
    assert _saves(out0) == _saves(out1), (_saves(out0), _saves(out1))
    assert len(_saves(out0)) >= 3 and stop0[0] < NUM_STEPS, _saves(out0)

    # 2. SIGTERM to process 1 only, two updates after the resumed start: both save that
    #    step and exit 143.
    sigterm_at = stop0[0] + 2
    preempted = _launch(reversal_corpus, run, cache, SIGTERM_AT_STEP=str(sigterm_at))
    for code, out in preempted:
        assert code == 143, out[-3000:]
        assert f"resumed from checkpoint step {stop0[0]}" in out
        assert _stop(out) == (sigterm_at, "SIGTERM received")
        assert _saves(out)[-1] == sigterm_at

    # 3. The rerun finishes, bit-identical to the uninterrupted run.
    for code, out in _launch(reversal_corpus, run, cache):
        assert code == 0 and f"resumed from checkpoint step {sigterm_at}" in out, out[-3000:]
    a, b = load_run(run), load_run(reference)
    assert a.step == b.step == NUM_STEPS
    for x, y in zip(
        jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


_COMBINE = """
import os
from attnmt.parallel.distributed import initialize
initialize()
from attnmt.parallel.agreement import any_process, sum_over_processes
process = int(os.environ["ATTNMT_PROCESS_ID"])
print("any", any_process([process == 1, False, True]).tolist())
print("sum", sum_over_processes([process + 1.0, 0.25 * process]).tolist())
"""


def test_processes_combine_flags_and_sums(tmp_path):
    results = _run_processes([sys.executable, "-c", _COMBINE], tmp_path / "combine", tmp_path)
    for code, out in results:
        assert code == 0, out[-3000:]
        assert "any [True, False, True]" in out and "sum [3.0, 0.25]" in out, out[-3000:]


def test_one_process_combines_nothing():
    flags = np.array([True, False, True])
    np.testing.assert_array_equal(any_process(flags), flags)
    np.testing.assert_array_equal(sum_over_processes([1.5, 2.0]), [1.5, 2.0])
