"""A run survives kill -9 and SIGTERM bit for bit, and stops cleanly on non-finite updates.

Each run is the real `attnmt train` command in a subprocess; the reference is the same
command run without interruption in another workdir. Resuming must reproduce it exactly:
every array of the final train state and the data-iterator position are compared for
equality, not closeness.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.config.parallel import ParallelConfig
from attnmt.data.pipeline import BatchIterator
from attnmt.parallel.mesh import make_mesh
from attnmt.train import step as steps
from attnmt.train.loop import Trainer
from attnmt.train.program import abstract_state
from attnmt.workdir import load_experiment, load_run
from tests.helpers import tiny_train_args, write_reversal_corpus

NUM_STEPS = 30
EVERY = 5  # checkpoint cadence in steps
EXIT_PREEMPTED = 143  # 128 + SIGTERM, see README "Guarantees"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A reversal task with one bucket shape, so each run compiles a single train step."""
    return write_reversal_corpus(tmp_path_factory.mktemp("corpus"), train=1500, dev=0)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    # A persistent compilation cache only saves time: XLA's CPU compile is deterministic,
    # and the uncached behaviour was checked by hand (see README "Guarantees").
    cache = tmp_path_factory.mktemp("jax_cache")
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def train_command(workdir: Path, corpus: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "attnmt.cli.main",
        *tiny_train_args(
            workdir,
            corpus,
            NUM_STEPS,
            "--config.model.dropout_rate=0.1",  # exercise the per-step dropout keys
            "--config.train.eval_every_steps=0",
            "--config.train.log_every_steps=1",  # a log line per step tells the test where it is
            f"--config.train.checkpoint_every_steps={EVERY}",
            *extra,
        ),
    ]


def finished_steps(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def run_to_end(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done


def final_state(workdir: Path) -> tuple[int, dict, list[np.ndarray]]:
    manager = CheckpointManager(workdir)
    step = manager.latest_step()
    loaded = load_run(workdir)
    one_device = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    state, data, _ = manager.restore(step, abstract_state(loaded.experiment, one_device))
    manager.close()
    return step, data, jax.tree_util.tree_leaves(jax.device_get(state))


def assert_bit_identical(workdir: Path, reference: Path) -> None:
    step, data, leaves = final_state(workdir)
    ref_step, ref_data, ref_leaves = final_state(reference)
    assert step == ref_step == NUM_STEPS
    assert data == ref_data
    assert len(leaves) == len(ref_leaves)
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    got_params = jax.tree_util.tree_leaves(load_run(workdir).params)
    want_params = jax.tree_util.tree_leaves(load_run(reference).params)
    assert all(np.array_equal(g, w) for g, w in zip(got_params, want_params, strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, env) -> Path:
    workdir = tmp_path_factory.mktemp("reference")
    run_to_end(train_command(workdir, corpus), env)
    assert finished_steps(workdir)[-1] == NUM_STEPS
    return workdir


@pytest.mark.slow
def test_the_config_is_read_without_the_arrays(tmp_path, reference):
    # What train.test_at_end reads first, to choose between the checkpoint and its moving
    # average: with every array file gone the config still loads, and equals load_run's.
    copy = tmp_path / "workdir"
    shutil.copytree(reference, copy)
    arrays = [path for path in (copy / "checkpoints").glob("*/state/**/*") if path.is_file()]
    assert arrays, "the layout changed: no array files found to delete"
    for path in arrays:
        path.unlink()
    assert load_experiment(copy) == load_run(reference).experiment
    first = finished_steps(reference)[0]
    assert load_experiment(copy, step=first) == load_run(reference, step=first).experiment


@contextlib.contextmanager
def started(command: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """The run as a child process, killed on the way out if a check failed mid-way."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_for_step(process: subprocess.Popen, step: int) -> None:
    """Reads the run's log until update `step` is logged."""
    assert process.stderr is not None
    for line in process.stderr:
        if f"[train] step {step} " in line:
            return
    raise AssertionError(f"the run ended before step {step}")


def wait_for_unfinished_save(
    process: subprocess.Popen, workdir: Path, after_step: int, ignore: set[str]
) -> Path | None:
    """Watches the checkpoints folder until a save of a step > `after_step` is in flight
    (its `<step>.orbax-checkpoint-tmp*` folder exists, and is not one of `ignore`); None if
    the run ended first."""
    folder = workdir / "checkpoints"
    deadline = time.monotonic() + 300  # a bound on a hung run, not a measurement
    while process.poll() is None and time.monotonic() < deadline:
        for path in folder.glob("*.orbax-checkpoint-tmp*"):
            if path.name not in ignore and int(path.name.split(".")[0]) > after_step:
                return path
        time.sleep(0.001)
    assert process.poll() is not None, "no save started within 300 s"
    return None


def stopped_at(stdout: str, reason: str) -> int:
    """The step of the run's last line, `stopped at step N: <reason>`."""
    match = re.search(rf"^stopped at step (\d+): {re.escape(reason)}", stdout, re.MULTILINE)
    assert match, stdout[-3000:]
    return int(match.group(1))


def damage_newest(workdir: Path) -> tuple[int, int]:
    """Deletes the array files of the newest checkpoint; returns (damaged, previous) steps."""
    steps = finished_steps(workdir)
    assert len(steps) >= 2, steps
    for path in (workdir / "checkpoints" / str(steps[-1]) / "state").rglob("*"):
        if path.is_file():
            path.unlink()
    return steps[-1], steps[-2]


@pytest.mark.slow
def test_kill_9_three_times_then_resume_is_bit_identical(tmp_path, corpus, env, reference):
    rng = random.Random(1234)
    # One kill early and one in the middle, each landing up to ~5 steps after the logged
    # step: mid-step, mid-save or between saves, wherever it falls.
    workdir = tmp_path / "killed"
    command = train_command(workdir, corpus)
    trials = []
    for target in [rng.randrange(2, 9), rng.randrange(10, 16)]:
        with started(command, env) as process:
            wait_for_step(process, target)
            time.sleep(rng.uniform(0.0, 0.1))
            process.send_signal(signal.SIGKILL)
            _, stderr = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL, stderr[-3000:]
        unfinished = [p.name for p in (workdir / "checkpoints").iterdir() if "tmp" in p.name]
        trials.append((target, finished_steps(workdir)[-1:], unfinished))

    # The last kill is sent the moment a save of step 15 or later is in flight. Its
    # unfinished folder still being there after the process died proves the kill landed
    # mid-save. (One sent just as Orbax renamed the folder missed: the run is resumed and
    # killed at its next save, at most three times.)
    killed_mid_save = None
    for _ in range(3):
        earlier = {p.name for p in (workdir / "checkpoints").iterdir()}
        newest = max([10, *finished_steps(workdir)])
        with started(command, env) as process:
            unfinished = wait_for_unfinished_save(process, workdir, newest, ignore=earlier)
            assert unfinished is not None, "the run ended without a save to interrupt"
            process.send_signal(signal.SIGKILL)
            _, stderr = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL, stderr[-3000:]
        trials.append(("mid-save", finished_steps(workdir)[-1:], [unfinished.name]))
        if unfinished.exists():
            killed_mid_save = unfinished.name
            break
    print("kill -9 trials (logged step, newest checkpoint, unfinished saves):", trials)
    assert killed_mid_save is not None, trials
    assert int(killed_mid_save.split(".")[0]) not in finished_steps(workdir)

    # Damaged files in the newest checkpoint: resuming falls back to the one before,
    # with that step's data position, and still ends bit for bit where the reference did.
    damaged, previous = damage_newest(workdir)
    done = run_to_end(command, env)
    assert f"checkpoint step {damaged} in" in done.stderr
    assert f"restored step {previous} instead" in done.stderr
    assert f"resumed from checkpoint step {previous}" in done.stderr
    assert not list((workdir / "checkpoints").glob("*tmp*"))  # cleaned up on start
    assert_bit_identical(workdir, reference)


@pytest.mark.slow
def test_sigterm_at_any_moment_saves_the_next_step_a_second_cannot_cut_it_short_and_resumes(
    tmp_path, corpus, env, reference
):
    workdir = tmp_path / "preempted"
    # No periodic checkpoint before the end: the one found (or in flight) is SIGTERM's.
    command = train_command(workdir, corpus, f"--config.train.checkpoint_every_steps={NUM_STEPS}")
    rng = random.Random(4321)
    attempts = []
    for _ in range(3):
        shutil.rmtree(workdir, ignore_errors=True)
        # The first SIGTERM comes from outside at a moment the run does not choose: some
        # time after a logged step (mid-update, mid-log or between updates).
        seen, delay = rng.randrange(3, 8), rng.uniform(0.0, 0.1)
        with started(command, env) as process:
            wait_for_step(process, seen)
            time.sleep(delay)
            process.send_signal(signal.SIGTERM)
            # The second one, the moment SIGTERM's save is in flight.
            unfinished = wait_for_unfinished_save(process, workdir, -1, ignore=set())
            during_save = False
            if unfinished is not None:
                process.send_signal(signal.SIGTERM)
                # Still unfinished after the signal was sent: it arrived during the save.
                during_save = unfinished.exists()
            stdout, stderr = process.communicate(timeout=120)
        attempts.append((seen, round(delay, 3), unfinished and unfinished.name, process.returncode))
        # A save that ended before the second signal went out proves nothing: try again.
        if during_save:
            break
    else:
        pytest.fail(f"the second SIGTERM never arrived during the save: {attempts}")
    print("SIGTERM after (step, delay), then during the save (folder, exit code):", attempts)
    assert process.returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert "Traceback" not in stderr
    steps = finished_steps(workdir)
    # The update in flight finished and the step it reached was saved, whole.
    assert len(steps) == 1 and seen <= steps[0] < NUM_STEPS, steps
    assert f"stopped at step {steps[0]}: SIGTERM received" in stdout
    assert unfinished.name.startswith(f"{steps[0]}.") and not unfinished.exists()
    assert not list((workdir / "checkpoints").glob("*tmp*"))
    assert final_state(workdir)[0] == steps[0]  # complete and restorable
    run_to_end(command, env)
    assert_bit_identical(workdir, reference)


@pytest.mark.slow
def test_time_limit_stops_with_exit_0_and_a_checkpoint_and_resumes(tmp_path, corpus, env):
    workdir = tmp_path / "limited"
    # 1.2 seconds of training: far fewer than num_steps updates on any machine. No periodic
    # checkpoints, so the one found is the time limit's.
    num_steps = 1_000_000
    command = train_command(
        workdir,
        corpus,
        f"--config.train.num_steps={num_steps}",
        "--config.train.time_limit_minutes=0.02",
        "--config.train.checkpoint_every_steps=0",
        "--config.train.checkpoint_every_minutes=60",
    )
    reason = "time limit of 0.02 minutes reached"
    first = run_to_end(command, env)
    stop = stopped_at(first.stdout, reason)
    assert 0 < stop < num_steps
    assert finished_steps(workdir) == [stop]
    assert not list((workdir / "checkpoints").glob("*tmp*"))
    step, _, _ = final_state(workdir)  # complete and restorable
    assert step == stop

    second = run_to_end(command, env)
    assert f"resumed from checkpoint step {stop} in" in second.stderr
    again = stopped_at(second.stdout, reason)
    assert stop < again < num_steps
    assert finished_steps(workdir) == [stop, again]


def _in_process_args(workdir: Path, corpus: Path, *extra: str) -> list[str]:
    command = train_command(workdir, corpus, *extra)
    return command[command.index("train") :]


# `attnmt train` with a fake monotonic clock that moves one second per reading, so which
# updates a time-based checkpoint follows does not depend on the machine's speed; each save
# the trainer starts is printed with the clock's reading.
_FAKE_CLOCK_TRAIN = """
import sys
from attnmt.checkpoint.manager import CheckpointManager
from attnmt.cli.main import main
from attnmt.train import stopping

class Clock:
    now = 0.0

    def monotonic(self):
        self.now += 1.0
        return self.now

stopping.time = clock = Clock()
real_save = CheckpointManager.save

def save(self, step, *args):
    print(f"saving step {step} at {clock.now}", flush=True)
    real_save(self, step, *args)

CheckpointManager.save = save
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_time_based_checkpoints_never_change_the_state_and_only_the_last_k_stay(
    tmp_path, corpus, env, reference
):
    workdir = tmp_path / "timed"
    args = _in_process_args(
        workdir,
        corpus,
        "--config.train.checkpoint_every_steps=0",  # only time-based checkpoints
        "--config.train.checkpoint_every_minutes=0.15",  # 9 s: every few updates here
        "--config.train.keep_checkpoints=3",
    )
    done = run_to_end([sys.executable, "-c", _FAKE_CLOCK_TRAIN, *args], env)
    saves = [
        (int(step), float(now))
        for step, now in re.findall(r"^saving step (\d+) at (\S+)$", done.stdout, re.MULTILINE)
    ]
    steps_saved = [step for step, _ in saves]
    assert steps_saved[-1] == NUM_STEPS, done.stdout
    intermediate = steps_saved[:-1]
    assert len(intermediate) >= 2 and intermediate == sorted(set(intermediate)), saves
    # Not more often than every 9 s (the last save is the end of the run's, due or not).
    times = [now for _, now in saves[:-1]]
    assert all(b - a >= 9.0 for a, b in itertools.pairwise(times)), saves
    # train.keep_checkpoints: only the newest three are left.
    assert finished_steps(workdir) == steps_saved[-3:]
    assert_bit_identical(workdir, reference)  # the reference saved every 5 steps instead


def test_non_finite_updates_stop_within_the_limit_and_keep_the_last_checkpoint(
    tmp_path, corpus, monkeypatch, capsys, caplog
):
    created: list[Trainer] = []
    original_init = Trainer.__init__

    def recording_init(self, *args, **kwargs):
        created.append(self)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", recording_init)
    workdir = tmp_path / "run"
    assert main(_in_process_args(workdir, corpus, "--config.train.num_steps=10")) == 0
    good = jax.device_get(created[0].state)

    real = steps.compute_gradients

    def poisoned(*args, **kwargs):
        grads, sums = real(*args, **kwargs)
        return jax.tree_util.tree_map(lambda g: g * jnp.nan, grads), sums

    monkeypatch.setattr(steps, "compute_gradients", poisoned)
    capsys.readouterr()
    code = main(
        _in_process_args(
            workdir,
            corpus,
            "--config.train.max_consecutive_skips=3",
            "--config.train.checkpoint_every_steps=1",  # a save due at every step boundary
            "--config.train.log_every_steps=100",  # the guard must not wait for a log line
        )
    )
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    assert "stopped: 3 consecutive updates had a non-finite loss or gradient" in err
    assert "the last good checkpoint (step 10) is intact" in err
    trainer = created[1]
    saved_step, saved_position, saved = final_state(workdir)
    # Exactly three batches were drawn after step 10, and none of them changed the state.
    position = BatchIterator(trainer.train_batches.corpus, trainer.shapes, seed=0)
    position.set_state(saved_position)
    for _ in range(3):
        next(position)
    assert trainer.train_batches.get_state() == position.get_state()
    poisoned_state = jax.device_get(trainer.state)
    assert int(poisoned_state.skipped_steps) == 3 and int(poisoned_state.step) == 10
    for name in ("params", "opt_state", "dropout_rng", "step"):
        got = jax.tree_util.tree_leaves(getattr(poisoned_state, name))
        want = jax.tree_util.tree_leaves(getattr(good, name))
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), name
    # The checkpoint on disk is still the one written before the non-finite updates.
    assert finished_steps(workdir) == [5, 10] and saved_step == 10
    assert all(
        np.array_equal(s, g) for s, g in zip(saved, jax.tree_util.tree_leaves(good), strict=True)
    )

    # Any other stop while updates are being skipped (here a time limit, at once) writes no
    # checkpoint either.
    trainer.checkpoints = CheckpointManager(workdir)
    trainer.experiment = dataclasses.replace(
        trainer.experiment,
        train=dataclasses.replace(
            trainer.experiment.train, time_limit_minutes=1e-9, max_consecutive_skips=100
        ),
    )
    with caplog.at_level(logging.INFO, logger="attnmt.train"):
        assert trainer.run().stopped_because.startswith("time limit")
    assert "no checkpoint at step 10: the last 3 updates were skipped" in caplog.text
    assert finished_steps(workdir) == [5, 10]
