"""Running `attnmt train` as real multi-process jobs on this machine (gloo collectives,
coordinator on 127.0.0.1), and reading back what tests/parallel/probe.py recorded.

Every launch is bounded by a timeout that kills the whole process group: a disagreement
between processes would otherwise hang in a collective, and the test must fail, not wait.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.helpers import REPO, tiny_train_args, write_reversal_corpus

PROBE = [sys.executable, "-m", "tests.parallel.probe"]
TIMEOUT_S = 300
# The jitted steps compile at XLA's backend level 0 (much faster to compile). Runs that a
# test compares bit for bit are all compiled at this one level.
FAST_COMPILE = "--config.train.xla_backend_optimization_level=0"
# The shared two-process reference run (tests/parallel/conftest.py).
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


def train_args(corpus: Path, workdir: Path, steps: int, *extra: str) -> list[str]:
    """`train` arguments for the one-layer tiny model on the reversal corpus (one compiled
    train step), without evaluation or pre-flight, compiled at FAST_COMPILE."""
    return tiny_train_args(
        workdir,
        corpus,
        steps,
        "--config.train.eval_every_steps=0",
        "--config.train.memory_preflight=false",
        FAST_COMPILE,
        *extra,
    )


def write_corpus(directory: Path) -> Path:
    """Train pairs of 2-5 letters and their reversal (one bucket shape at max_length 8)."""
    return write_reversal_corpus(directory, train=CORPUS_PAIRS, dev=0)


def job_env(cache: Path, **extra: str) -> dict[str, str]:
    """This environment without the suite's XLA_FLAGS (the device count comes from
    ATTNMT_LOCAL_DEVICE_COUNT), with a persistent compilation cache: it only saves time,
    since XLA's CPU compile is deterministic (a cached executable computes what a fresh
    compile does: the bit-exact tests compare runs that compiled fresh with runs that
    loaded it)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_job(
    argv: list[str],
    log_stem: Path,
    env: dict[str, str],
    processes: int = 2,
    devices: int = 2,
    while_running: Callable[[list[subprocess.Popen], list[Path]], None] | None = None,
) -> list[tuple[int, str]]:
    """`argv` as processes 0..processes-1 of one job joined through the ATTNMT_* variables
    (launch/local.py's); each process's (exit code, output). See run_processes."""
    port = free_port()
    envs = [
        {
            **env,
            "ATTNMT_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "ATTNMT_NUM_PROCESSES": str(processes),
            "ATTNMT_PROCESS_ID": str(index),
            "ATTNMT_LOCAL_DEVICE_COUNT": str(devices),
        }
        for index in range(processes)
    ]
    return run_processes(argv, envs, log_stem, while_running)


def run_processes(
    argv: list[str],
    envs: list[dict[str, str]],
    log_stem: Path,
    while_running: Callable[[list[subprocess.Popen], list[Path]], None] | None = None,
) -> list[tuple[int, str]]:
    """`argv` once per environment in `envs`, all at once; each one's (exit code, output).

    `while_running(popens, logs)` is called once all are started (to signal them from
    outside). The processes are killed, and the test failed, past TIMEOUT_S.
    """
    popens, logs = [], []
    for index, process_env in enumerate(envs):
        logs.append(Path(f"{log_stem}.{index}.{time.monotonic_ns()}.log"))
        with logs[-1].open("wb") as log:  # the child keeps its own descriptor
            popens.append(
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
    codes = None
    try:
        if while_running is not None:
            while_running(popens, logs)
        codes = [p.wait(timeout=max(deadline - time.monotonic(), 1)) for p in popens]
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in popens:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = [log.read_text(errors="replace") for log in logs]
    assert codes is not None, f"the job hung (over {TIMEOUT_S} s):\n" + outputs[0][-3000:]
    return list(zip(codes, outputs, strict=True))


@dataclasses.dataclass(frozen=True)
class Probed:
    """What one process of one launch recorded (tests/parallel/probe.py)."""

    fed: dict[int, tuple[str, int]]  # step → (digest of its rows, real target tokens)
    position: dict[str, int] | None  # the data iterator's state at the end
    step: int | None
    written: list[str]  # files opened for writing, relative to the workdir
    arrays: dict[str, np.ndarray]  # "<state path>@<device id>" → that shard
    combined: dict | None


def read_probes(folder: Path, processes: int = 2) -> list[Probed]:
    probes = []
    for index in range(processes):
        record = json.loads((folder / f"process_{index}.json").read_text())
        npz = folder / f"process_{index}.npz"
        arrays = dict(np.load(npz)) if npz.exists() else {}
        fed = {int(step): (digest, tokens) for step, (digest, tokens) in record["fed"].items()}
        probes.append(
            Probed(
                fed,
                record["position"],
                record["step"],
                record["written"],
                arrays,
                record.get("combined"),
            )
        )
    return probes


def state_by_leaf(probes: list[Probed]) -> dict[str, list[np.ndarray]]:
    """Each state leaf → its shards on every device of every process."""
    leaves: dict[str, list[np.ndarray]] = {}
    for probe in probes:
        for key, array in sorted(probe.arrays.items()):
            leaves.setdefault(key.rsplit("@", 1)[0], []).append(array)
    return leaves


def wait_for_line(log: Path, text: str, popens: list[subprocess.Popen]) -> None:
    """Polls a process log until it holds `text` (fails if the job ends first)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if any(p.poll() is not None for p in popens):
            raise AssertionError(f"the job ended before {text!r}: " + log.read_text()[-3000:])
        time.sleep(0.005)
    raise AssertionError(f"no {text!r} within {TIMEOUT_S} s")
