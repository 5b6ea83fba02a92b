"""Two real processes (2 CPU devices each, gloo, coordinator on 127.0.0.1) take every
clock- and signal-driven decision together, and an interrupted job resumes bit for bit.

With clocks made to disagree they save the same steps and stop at the same step; a SIGTERM
sent from outside to one of them, at a moment the job does not choose, stops both at the
same step with exit 143; the rerun ends where an uninterrupted 2-process run did (the
session's reference, tests/parallel/conftest.py), bit for bit, with Adam and dropout 0.1:
every device's copy of the parameters, Adam's count, mu and nu, the step and the dropout
key, each process's data position, and the rows each process fed at every step.
"""

from __future__ import annotations

import random
import re
import time

import jax
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.config.parallel import ParallelConfig
from attnmt.parallel.agreement import any_and_mean, any_process, sum_over_processes
from attnmt.parallel.mesh import make_mesh
from attnmt.train.program import abstract_state
from attnmt.workdir import load_run
from tests.parallel.jobs import (
    PROBE,
    REFERENCE_OVERRIDES,
    REFERENCE_STEPS,
    job_env,
    read_probes,
    run_job,
    state_by_leaf,
    train_args,
    wait_for_line,
)

EXIT_PREEMPTED = 143


def _saves(output: str) -> list[int]:
    return [int(step) for step in re.findall(r"^saving step (\d+)$", output, re.MULTILINE)]


def _stop(output: str) -> tuple[int, str]:
    found = re.findall(r"stopped at step (\d+): ([^;\n]+)", output)
    assert found, output[-3000:]
    step, reason = found[-1]
    return int(step), reason


def _checkpointed(workdir) -> tuple[int, dict, list[np.ndarray]]:
    """The newest checkpoint's step, data position and every state array, on one device."""
    manager = CheckpointManager(workdir)
    step = manager.latest_step()
    one_device = make_mesh(ParallelConfig(data=1), jax.devices()[:1])
    abstract = abstract_state(load_run(workdir).experiment, one_device)
    state, data, _ = manager.restore(step, abstract)
    manager.close()
    return step, data, jax.tree_util.tree_leaves(jax.device_get(state))


@pytest.mark.slow
def test_processes_agree_on_time_and_signals_and_resume_bit_exactly(
    two_process_reference, tmp_path
):
    ref = two_process_reference
    run = tmp_path / "run"
    probes = tmp_path / "probes"

    def launch(name: str, *overrides: str, signals=None, **env) -> list[tuple[int, str]]:
        argv = [*PROBE, *train_args(ref.corpus, run, REFERENCE_STEPS, *REFERENCE_OVERRIDES)]
        environment = job_env(ref.cache, ATTNMT_PROBE_DIR=str(probes / name), **env)
        return run_job([*argv, *overrides], tmp_path / name, environment, while_running=signals)

    # 1. Clocks that disagree: checkpoints every 6 s and a 24 s limit, read on process 1's
    #    fast clock first. Without agreement one process would enter a save (or leave the
    #    loop) alone and the job would hang.
    (code0, out0), (code1, out1) = launch(
        "timed",
        "--config.train.checkpoint_every_steps=0",
        "--config.train.checkpoint_every_minutes=0.1",
        "--config.train.time_limit_minutes=0.4",
        ATTNMT_PROBE_CLOCK="1",
    )
    assert code0 == code1 == 0, out0[-2000:] + out1[-2000:]
    stop0, stop1 = _stop(out0), _stop(out1)
    assert stop0 == stop1 and stop0[1].startswith("time limit"), (stop0, stop1)
    assert _saves(out0) == _saves(out1), (_saves(out0), _saves(out1))
    assert len(_saves(out0)) >= 3 and stop0[0] < REFERENCE_STEPS // 2, _saves(out0)
    timed_stop = stop0[0]

    # 2. SIGTERM from outside to process 1 only, at a moment the job does not choose: once
    #    process 0 has logged a step, after a random delay (mid-update, mid-collective,
    #    mid-save or between them). Both processes save the same step and exit 143.
    rng = random.Random(2026)
    seen = timed_stop + rng.randrange(2, 6)
    delay = rng.uniform(0.0, 0.25)

    def sigterm_process_1(popens, logs):
        wait_for_line(logs[0], f"[train] step {seen} ", popens)
        time.sleep(delay)
        popens[1].terminate()

    preempted = launch("preempted", signals=sigterm_process_1)
    sigterm_stop = _stop(preempted[0][1])[0]
    print(f"SIGTERM to process 1 {delay:.3f} s after step {seen}: both stopped at {sigterm_stop}")
    assert seen <= sigterm_stop < REFERENCE_STEPS
    for code, out in preempted:
        assert code == EXIT_PREEMPTED, out[-3000:]
        assert f"resumed from checkpoint step {timed_stop} in" in out
        assert _stop(out) == (sigterm_stop, "SIGTERM received")
        assert _saves(out)[-1] == sigterm_stop

    # 3. The rerun finishes, bit-identical to the uninterrupted run.
    for code, out in launch("rerun"):
        assert code == 0 and f"resumed from checkpoint step {sigterm_stop} in" in out, out[-3000:]

    launches = [read_probes(probes / name) for name in ("timed", "preempted", "rerun")]
    final, reference = launches[-1], ref.probes
    # Each process fed the reference's rows at every step (across the three launches each
    # step was fed exactly once), and ends at the reference's data position, two epochs on.
    for index in range(2):
        fed = [step for probes_of in launches for step in sorted(probes_of[index].fed)]
        assert fed == list(range(1, REFERENCE_STEPS + 1)), fed
        for probes_of in launches:
            for step, rows in probes_of[index].fed.items():
                assert rows == reference[index].fed[step], f"process {index}, step {step}"
        assert final[index].position == reference[index].position == reference[0].position
        assert reference[index].position["epoch"] >= 2
    # (The two processes feed different rows: halves of one global batch.)
    assert all(reference[0].fed[s] != reference[1].fed[s] for s in reference[0].fed)

    # Every device of both processes holds the same state as every device of the reference:
    # parameters, Adam's count, mu and nu, the step, the dropout key, the skip count.
    got, want = state_by_leaf(final), state_by_leaf(reference)
    assert got.keys() == want.keys()
    for part in ("params/", "opt_state/0/count", "opt_state/0/mu/", "opt_state/0/nu/"):
        assert any(name.startswith(part) for name in want), part  # Adam's state is compared
    assert {"step", "dropout_rng"} <= want.keys()
    for name, shards in want.items():
        assert len(shards) == len(got[name]) == 4, name
        for shard in [*shards[1:], *got[name]]:
            same = shard.dtype == shards[0].dtype and np.array_equal(shard, shards[0])
            assert same, f"{name} differs"
    assert [p.step for p in final] == [p.step for p in reference] == [REFERENCE_STEPS] * 2

    # The checkpoint both processes wrote last is the reference's, data position included.
    step, data, leaves = _checkpointed(run)
    ref_step, ref_data, ref_leaves = _checkpointed(ref.workdir)
    assert step == ref_step == REFERENCE_STEPS and data == ref_data == reference[0].position
    for a, b in zip(leaves, ref_leaves, strict=True):
        same = a.dtype == b.dtype and np.array_equal(a, b)
        assert same


@pytest.mark.slow  # the session's 2-process reference run
def test_processes_combine_flags_and_sums(two_process_reference):
    # Each process of the reference computed these before its first update
    # (tests/parallel/probe.py, ATTNMT_PROBE_COMBINE): process p proposed [p == 1, False,
    # True] and [p + 1, p / 4]; and, in one gather, flags [p == 0, False] with values
    # [p + 1, 2p], whose means are [1.5, 1.0].
    for probe in two_process_reference.probes:
        assert probe.combined == {
            "any": [True, False, True],
            "sum": [3.0, 0.25],
            "any_and_mean": [[True, False], [1.5, 1.0]],
        }


def test_one_process_combines_nothing():
    flags = np.array([True, False, True])
    np.testing.assert_array_equal(any_process(flags), flags)
    both = any_and_mean(flags, [0.5, 2.0])
    np.testing.assert_array_equal(both[0], flags)
    np.testing.assert_array_equal(both[1], [0.5, 2.0])
    np.testing.assert_array_equal(sum_over_processes([1.5, 2.0]), [1.5, 2.0])
