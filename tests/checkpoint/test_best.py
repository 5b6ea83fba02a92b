"""The best step beside the last K: kept by its metric through rotation, read by any reader."""

from __future__ import annotations

import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.errors import CheckpointError
from attnmt.workdir import load_run
from tests.helpers import ABSTRACT, assert_is_step, data_at, state_at


def save(manager: CheckpointManager, step: int, metric: float | None = None) -> None:
    manager.save(step, state_at(step), data_at(step), {"written_at": step}, metric=metric)
    manager.wait()  # rotation runs once each save is finished


@pytest.mark.parametrize(
    ("by", "bests", "kept"),
    [
        # Only new bests carry a metric; the best of them is the newest of them.
        ("loss", {2: 3.0, 4: 2.0}, 4),
        ("bleu", {2: 10.0, 3: 12.5}, 3),
    ],
)
def test_the_best_step_outlives_keep_last_k(tmp_path, by, bests, kept):
    manager = CheckpointManager(tmp_path, keep=2, keep_best_by=by)
    for step in range(1, 9):
        save(manager, step, bests.get(step))
    assert manager.all_steps() == [kept, 7, 8]
    assert manager.best() == (kept, bests[kept])
    manager.close()
    reader = CheckpointManager(tmp_path)  # as `--step best` opens it: no keep_best_by
    assert reader.best() == (kept, bests[kept])
    assert_is_step((kept, *reader.restore(kept, ABSTRACT)), kept)
    reader.close()


def test_a_newer_best_releases_the_old_one_and_a_resumed_manager_knows_both(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2, keep_best_by="loss")
    for step in range(1, 6):
        save(manager, step, 2.0 if step == 2 else None)
    manager.close()
    resumed = CheckpointManager(tmp_path, keep=2, keep_best_by="loss")  # reads the metrics
    assert resumed.all_steps() == [2, 4, 5]
    for step in range(6, 9):
        save(resumed, step, 1.5 if step == 6 else None)
    assert resumed.all_steps() == [6, 7, 8] and resumed.best() == (6, 1.5)
    resumed.close()


def test_without_keep_best_by_only_the_last_k_remain_and_there_is_no_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 5):
        save(manager, step)
    assert manager.all_steps() == [3, 4] and manager.best() is None
    with pytest.raises(ValueError, match="keep_best_by"):
        manager.save(5, state_at(5), data_at(5), {}, metric=1.0)
    manager.close()
    with pytest.raises(CheckpointError, match=r"no best checkpoint.*keep_best_by"):
        load_run(tmp_path, "best")
