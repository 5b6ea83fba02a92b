"""Checkpoint integrity: unfinished saves are invisible, damaged steps fall back whole.

The state is a small dict of arrays whose values encode their step, so every restore can
be checked against the step it claims to be (and its data position against the same).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager, UnreadableCheckpointError
from attnmt.errors import CheckpointError
from tests.helpers import ABSTRACT, assert_is_step, data_at, state_at


def save_steps(workdir: Path, steps: list[int]) -> None:
    manager = CheckpointManager(workdir)
    for step in steps:
        manager.save(step, state_at(step), data_at(step), {"written_at": step})
    manager.close()


def folder(workdir: Path, step: int) -> Path:
    return workdir / "checkpoints" / str(step)


def test_a_temporary_folder_is_never_listed_or_restored(tmp_path):
    save_steps(tmp_path, [1, 2])
    # What a save killed before Orbax's final rename leaves: a complete-looking copy even.
    unfinished = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1234567"
    shutil.copytree(folder(tmp_path, 2), unfinished)
    reader = CheckpointManager(tmp_path)
    assert reader.all_steps() == [1, 2]
    assert_is_step(reader.restore_latest(ABSTRACT), 2)
    reader.close()
    assert unfinished.exists()  # a reader never deletes it: it may be a save in progress
    writer = CheckpointManager(tmp_path, clean_up_unfinished=True)
    deadline = time.monotonic() + 30  # Orbax deletes in a background thread
    while unfinished.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.close()
    assert not unfinished.exists() and CheckpointManager(tmp_path).all_steps() == [1, 2]


def test_only_the_newest_keep_checkpoints_remain(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 6):
        manager.save(step, state_at(step), data_at(step), {"written_at": step})
    manager.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["4", "5"]
    reader = CheckpointManager(tmp_path)
    assert reader.all_steps() == [4, 5]
    assert_is_step(reader.restore_latest(ABSTRACT), 5)
    reader.close()


_KILLED_WRITER = """
import sys
import jax.numpy as jnp, numpy as np
from attnmt.checkpoint.manager import CheckpointManager
manager = CheckpointManager(sys.argv[1])
manager.save(1, {"w": jnp.ones(4)}, {"index": 1}, {})
manager.wait()
big = np.random.default_rng(0).standard_normal(40_000_000).astype(np.float32)
manager.save(2, {"w": jnp.asarray(big)}, {"index": 2}, {})
print("saving", flush=True)
import time; time.sleep(60)
"""


def test_a_save_killed_mid_write_is_never_restored(tmp_path):
    """kill -9 while Orbax writes 160 MB in the background: the old step stays the newest."""
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "saving\n"
    writer.kill()
    writer.wait(timeout=60)
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left[0] == "1" and left[1].startswith("2.orbax-checkpoint-tmp"), left
    manager = CheckpointManager(tmp_path)
    assert manager.all_steps() == [1]
    step, state, data, _ = manager.restore_latest({"w": jax.ShapeDtypeStruct((4,), jnp.float32)})
    assert step == 1 and data == {"index": 1} and np.array_equal(state["w"], np.ones(4))
    manager.close()


def _delete_array_files(step_dir: Path) -> None:
    for path in (step_dir / "state").rglob("*"):
        if path.is_file():
            path.unlink()


def _truncate_everything(step_dir: Path) -> None:
    for path in step_dir.rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage_data_position(step_dir: Path) -> None:
    (step_dir / "data" / "metadata").write_text("{not json")


def _no_data_position(step_dir: Path) -> None:
    shutil.rmtree(step_dir / "data")


def _no_state(step_dir: Path) -> None:
    shutil.rmtree(step_dir / "state")


@pytest.mark.parametrize(
    "damage",
    [
        _delete_array_files,
        _truncate_everything,
        _garbage_data_position,
        _no_data_position,
        _no_state,
    ],
)
def test_damaged_newest_falls_back_to_the_previous_step_whole(tmp_path, caplog, damage):
    save_steps(tmp_path, [1, 2, 3])
    damage(folder(tmp_path, 3))
    manager = CheckpointManager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="attnmt.checkpoint.manager"):
        restored = manager.restore_latest(ABSTRACT)
    assert_is_step(restored, 2)  # state AND data position of step 2, not a mix
    warning = caplog.records[-1].getMessage()
    assert "step 3" in warning and "restored step 2" in warning
    # Moved aside, not deleted, and out of the way of the resumed run's own step 3.
    assert manager.all_steps() == [1, 2]
    assert (tmp_path / "checkpoints-unreadable" / "3").is_dir()
    manager.save(3, state_at(3), data_at(3), {"written_at": 3})
    manager.close()
    assert_is_step(CheckpointManager(tmp_path).restore_latest(ABSTRACT), 3)


def test_two_damaged_steps_fall_back_two(tmp_path, caplog):
    save_steps(tmp_path, [1, 2, 3])
    _delete_array_files(folder(tmp_path, 3))
    _garbage_data_position(folder(tmp_path, 2))
    manager = CheckpointManager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="attnmt.checkpoint.manager"):
        assert_is_step(manager.restore_latest(ABSTRACT), 1)
    assert "step 3, 2 in" in caplog.records[-1].getMessage()
    manager.close()


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    save_steps(tmp_path, [1, 2])
    for step in (1, 2):
        _delete_array_files(folder(tmp_path, step))
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints .* is readable"):
        manager.restore_latest(ABSTRACT)
    manager.close()


def test_another_model_is_refused_and_nothing_is_moved(tmp_path):
    save_steps(tmp_path, [1, 2])
    other = jax.eval_shape(lambda: {**state_at(0), "params": {"w": jnp.zeros((16, 9))}})
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match="does not match this model") as info:
        manager.restore_latest(other)
    assert not isinstance(info.value, UnreadableCheckpointError)
    assert "params/w: saved float32[16, 8], model has float32[16, 9]" in str(info.value)
    assert "params/b: saved int32[8], model has nothing" in str(info.value)
    assert manager.all_steps() == [1, 2] and not (tmp_path / "checkpoints-unreadable").exists()
    manager.close()


def test_restore_config_of_a_damaged_step_is_a_checkpoint_error(tmp_path):
    save_steps(tmp_path, [1])
    (folder(tmp_path, 1) / "config" / "metadata").write_text("")
    with pytest.raises(UnreadableCheckpointError, match="no readable config"):
        CheckpointManager(tmp_path).restore_config()
