"""A real 2-process run (launch/local.py: 2 CPU devices each, gloo collectives, coordinator
on 127.0.0.1) trains like 1 process × 4 devices, and only process 0 writes the run's logs,
TensorBoard events and config.json, with the whole job's figures.

Cross-process all-reduces sum in another order than one process's: the 1-vs-2 comparison
uses SGD and the bounds of tests/equivalence.py (dropout 0.1: threefry masks do not
depend on the mesh). Resuming a 2-process run is tested bit for bit in test_agreement.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.workdir import load_run
from tests.equivalence import assert_same_updates, initial_params
from tests.parallel.jobs import REFERENCE_STEPS, REPO, TIMEOUT_S, job_env, train_args, write_corpus

STEPS = 6


def _logged_tokens(log: str) -> list[tuple[int, float]]:
    """(step, target_tokens) of every training log line."""
    found = re.findall(r"\[train\] step (\d+) .*target_tokens=(\S+)", log)
    return [(int(step), float(tokens)) for step, tokens in found]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`argv` to the end; its whole process group is killed (and the test failed) past
    TIMEOUT_S, so processes waiting for a dead peer cannot outlive the test."""
    process = subprocess.Popen(
        argv,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError(f"{argv[:3]} hung (over {TIMEOUT_S} s)") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(argv, 0, stdout, stderr)


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus")
    extra = ("--config.optim.algorithm=sgd", "--config.model.dropout_rate=0.1")
    two, one = tmp_path / "two", tmp_path / "one"
    launcher = [sys.executable, str(REPO / "launch" / "local.py"), "--processes", "2"]
    launcher += ["--devices-per-process", "2"]
    _run([*launcher, *train_args(corpus, two, STEPS, *extra)[1:]], job_env(tmp_path / "cache"))
    # One process × 4 devices: this one, on 4 of its 8.
    single = [*train_args(corpus, one, STEPS, *extra), "--config.parallel.num_devices=4"]
    with caplog.at_level(logging.INFO, logger="attnmt.train"):
        assert main(single) == 0
    a, b = load_run(two), load_run(one)
    assert a.step == b.step == STEPS
    assert_same_updates(initial_params(b.experiment), b.params, a.params, steps=STEPS)

    # Only process 0 logs, and its figures are the job's: both processes' rows of the
    # batches (the same global batches as the one-process run's), not its own half.
    logs = [(two / "logs" / f"process_{i}.log").read_text() for i in range(2)]
    assert _logged_tokens(logs[1]) == []
    assert _logged_tokens(logs[0]) == _logged_tokens(caplog.text) != []


def _event_records(path: Path) -> list[bytes]:
    """The payloads of a TFRecord file: [length u64][crc u32][payload][crc u32] each; a
    record cut short fails here."""
    data, records, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + 12 + length + 4
        assert end <= len(data), f"{path}: a record is cut short at byte {offset}"
        records.append(data[offset + 12 : offset + 12 + length])
        offset = end
    return records


def _train_scalars(folder: Path) -> dict[int, dict[str, float]]:
    from tensorboardX.proto import event_pb2

    files = sorted(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one writer
    scalars: dict[int, dict[str, float]] = {}
    for payload in _event_records(files[0]):
        event = event_pb2.Event.FromString(payload)
        for value in event.summary.value:
            scalars.setdefault(event.step, {})[value.tag] = value.simple_value
    return scalars


@pytest.mark.slow  # the session's 2-process reference run
def test_only_process_0_writes_config_json_and_tensorboard_with_the_jobs_figures(
    two_process_reference,
):
    ref = two_process_reference
    written = [probe.written for probe in ref.probes]  # files each process opened to write
    # Process 0 wrote config.json and the one event file; process 1 neither.
    events = [path for path in written[0] if path.startswith("tensorboard/")]
    assert "config.json" in written[0] and len(events) == 1, written[0]
    assert events[0].startswith("tensorboard/train/events.out.tfevents.")
    assert not [p for p in written[1] if p == "config.json" or p.startswith("tensorboard")]
    assert sorted(os.listdir(ref.workdir / "tensorboard")) == ["train"]

    # config.json is whole: the run's config, as saved with its checkpoints.
    config = json.loads((ref.workdir / "config.json").read_text())
    manager = CheckpointManager(ref.workdir)
    assert config == manager.restore_config(REFERENCE_STEPS)
    manager.close()
    assert config["optim"]["algorithm"] == "adam" and config["model"]["dropout_rate"] == 0.1
    assert config["train"]["num_steps"] == REFERENCE_STEPS

    # The event file is whole (every update logged, every scalar there) and its figures
    # are the job's: target_tokens is both processes' real target tokens of that update.
    scalars = _train_scalars(ref.workdir / "tensorboard" / "train")
    assert sorted(scalars) == list(range(1, REFERENCE_STEPS + 1))
    for step, values in scalars.items():
        assert {"loss", "tokens_per_second", "padding_fraction"} <= values.keys(), step
        job_tokens = sum(probe.fed[step][1] for probe in ref.probes)
        assert values["target_tokens"] == job_tokens, step
    assert all(probe.fed[1][1] < sum(p.fed[1][1] for p in ref.probes) for probe in ref.probes)
