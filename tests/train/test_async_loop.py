"""The asynchronous training loop: batches prefetched on a thread (attnmt/train/prefetch.py),
update outcomes read without waiting for the device, decisions agreed every
train.agree_every_steps updates (attnmt/train/stopping.py).

The references are plain: the iterator drawn by hand, a counter of the host's waits, an
uninterrupted run of the same config compared bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.checkpoint.manager import CheckpointManager
from attnmt.data.pipeline import BatchIterator, TokenizedCorpus
from attnmt.errors import DataError
from attnmt.train import loop, stopping
from attnmt.train import step as steps
from attnmt.train.assemble import build_trainer
from attnmt.train.prefetch import Prefetcher
from attnmt.train.program import build_program
from tests.helpers import corpus_overrides, tiny_experiment

AGREE = 5  # train.agree_every_steps in the loop tests


def _corpus(pairs: int = 90, seed: int = 0) -> TokenizedCorpus:
    """Random token rows of 1-7 tokens (+ EOS) per side, built directly as arrays."""
    rng = np.random.default_rng(seed)
    sides = []
    for _ in range(2):
        lengths = rng.integers(2, 9, pairs)
        tokens = rng.integers(4, 30, int(lengths.sum())).astype(np.int32)
        sides += [tokens, np.concatenate([[0], np.cumsum(lengths)])]
    return TokenizedCorpus(*sides)


def _iterator(corpus: TokenizedCorpus) -> BatchIterator:
    return BatchIterator(corpus, [(8, 8), (4, 16)], seed=3)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetcher_yields_the_iterators_batches_in_order_and_their_positions(depth):
    corpus = _corpus()
    by_hand = _iterator(corpus)  # crosses epoch boundaries: 20+ batches of ~90 pairs
    expected = [(next(by_hand), by_hand.get_state()) for _ in range(30)]
    with Prefetcher(_iterator(corpus), lambda batch: batch, depth) as batches:
        got = [next(batches) for _ in range(27)]
    for item, (batch, position) in zip(got, expected, strict=False):
        assert _same(item.value, batch) and item.position == position
    # Resuming from any consumed item's position gives the batches that followed it.
    for index, item in enumerate(got):
        resumed = _iterator(corpus)
        resumed.set_state(item.position)
        for batch, _ in expected[index + 1 : index + 4]:
            assert _same(next(resumed), batch)


class _Counting:
    """An endless source that counts the batches drawn from it."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.drawn, self.fail_at = 0, fail_at

    def __next__(self) -> dict[str, np.ndarray]:
        if self.drawn == self.fail_at:
            raise DataError(f"corrupt shard after {self.drawn} batches")
        self.drawn += 1
        return {"x": np.full(2, self.drawn)}

    def get_state(self) -> dict[str, int]:
        return {"drawn": self.drawn}


def test_the_budget_bounds_what_is_drawn_and_allow_raises_it():
    source = _Counting()
    with Prefetcher(source, lambda batch: batch, depth=4, budget=3) as batches:
        assert [int(next(batches).value["x"][0]) for _ in range(3)] == [1, 2, 3]
        batches.allow(2)
        assert [next(batches).position for _ in range(2)] == [{"drawn": 4}, {"drawn": 5}]
        assert source.drawn == 5  # never beyond the budget, though depth is 4


@pytest.mark.parametrize("depth", [0, 2])
def test_an_error_in_the_source_or_prepare_reaches_the_caller_as_it_was(depth):
    with Prefetcher(_Counting(fail_at=2), lambda batch: batch, depth) as batches:
        assert [next(batches).position["drawn"] for _ in range(2)] == [1, 2]
        with pytest.raises(DataError, match=r"^corrupt shard after 2 batches$"):
            next(batches)
        with pytest.raises(StopIteration):  # nothing follows a failure
            next(batches)

    def prepare(batch):
        raise ValueError(f"cannot place batch {int(batch['x'][0])}")

    with (
        Prefetcher(_Counting(), prepare, depth) as batches,
        pytest.raises(ValueError, match="cannot place batch 1"),
    ):
        next(batches)


def test_close_stops_the_thread_whether_it_waits_for_room_or_budget():
    before = set(threading.enumerate())
    full = Prefetcher(_Counting(), lambda batch: batch, depth=2)  # endless: blocks on a full queue
    starved = Prefetcher(_Counting(), lambda batch: batch, depth=2, budget=0)
    next(full)
    assert full.alive and starved.alive
    for prefetcher in (full, starved):
        prefetcher.close()
        assert not prefetcher.alive
        with pytest.raises(StopIteration):
            next(prefetcher)
    assert set(threading.enumerate()) == before
    assert all(t.daemon for t in threading.enumerate() if t.name == "attnmt-prefetch")


# ---- the loop ---------------------------------------------------------------------------


class _FrozenClock:
    """stopping's clock, standing still: agreements every train.agree_every_steps exactly."""

    @staticmethod
    def monotonic() -> float:
        return 0.0


def _overrides(corpus, steps_: int, *extra: str) -> list[str]:
    return [
        *corpus_overrides(corpus),
        "--config.data.max_length=8",
        "--config.data.tokens_per_batch=128",
        "--config.model.num_layers=1",
        "--config.model.dropout_rate=0.1",
        f"--config.train.num_steps={steps_}",
        "--config.train.eval_every_steps=0",
        "--config.train.log_every_steps=1000",
        "--config.train.checkpoint_every_steps=0",
        "--config.train.checkpoint_every_minutes=60",
        "--config.train.xla_backend_optimization_level=0",
        "--config.parallel.num_devices=1",
        f"--config.train.agree_every_steps={AGREE}",
        *extra,
    ]


def _drains(monkeypatch) -> list[int]:
    """Counts the host reads of the newest update dispatched (one entry per read): those
    leave the device nothing to run once they return. (Reading an older update while the
    newest is queued keeps the device busy: not counted.)"""
    drains: list[int] = []
    newest: list[jax.Array] = []
    real_update, real_get = loop.Trainer._one_update, jax.device_get

    def one_update(self, batches):
        metrics = real_update(self, batches)
        newest[:] = jax.tree_util.tree_leaves(metrics)
        return metrics

    def device_get(tree):
        read = jax.tree_util.tree_leaves(tree)
        if any(x is y for x in read for y in newest):
            drains.append(1)
        return real_get(tree)

    monkeypatch.setattr(loop.Trainer, "_one_update", one_update)
    monkeypatch.setattr(jax, "device_get", device_get)
    return drains


def test_the_host_drains_the_device_only_where_something_happens(
    reversal_corpus, tmp_path, monkeypatch
):
    monkeypatch.setattr(stopping, "time", _FrozenClock)
    updates = 40
    trainer = build_trainer(tiny_experiment(_overrides(reversal_corpus, updates)), tmp_path)
    dues = []
    real_at = stopping.StepDecisions.at
    monkeypatch.setattr(
        stopping.StepDecisions,
        "at",
        lambda self, step, *a: dues.append(step) or real_at(self, step, *a),
    )
    drains = _drains(monkeypatch)
    result = trainer.run()
    assert result.step == updates
    # Agreed at the start, after the first update (untimed), then every AGREE updates.
    assert dues == [0, 1, 6, 11, 16, 21, 26, 31, 36, 40]
    # The device ran dry for the host once per agreement and at the end (the last step, the
    # log line), not after every update.
    assert len(drains) <= updates // AGREE + 3, len(drains)


def _state_and_position(workdir, trainer, step: int) -> tuple[list[np.ndarray], dict]:
    manager = CheckpointManager(workdir)
    state, position, _ = manager.restore(step, trainer.program.abstract_state)
    manager.close()
    return jax.tree_util.tree_leaves(jax.device_get(state)), position


@pytest.mark.parametrize("alone, stop_at", [(True, 7), (False, 11)])
def test_sigterm_stops_within_the_agreement_interval_and_resumes_bit_exactly(
    alone, stop_at, reversal_corpus, tmp_path, monkeypatch
):
    """A process alone stops at the update the signal came in; in a job (the decisions made
    as if other processes took part) at the next agreement: 0, 1, 6, 11, 16."""
    monkeypatch.setattr(stopping, "time", _FrozenClock)
    updates, signal_at = 16, 7
    if not alone:
        real_init = stopping.StepDecisions.__init__

        def in_a_job(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            self._alone = False

        monkeypatch.setattr(stopping.StepDecisions, "__init__", in_a_job)
    experiment = tiny_experiment(_overrides(reversal_corpus, updates))
    reference = build_trainer(experiment, tmp_path / "reference")
    assert reference.run().step == updates

    dispatched = []
    real_one_update = loop.Trainer._one_update

    def one_update(self, batches):
        dispatched.append(1)  # once per update, on the loop's thread
        if len(dispatched) == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_one_update(self, batches)

    monkeypatch.setattr(loop.Trainer, "_one_update", one_update)
    preempted = build_trainer(experiment, tmp_path / "run")
    result = preempted.run()
    assert result.exit_code == 143 and result.stopped_because.startswith("SIGTERM")
    assert signal_at <= result.step < signal_at + AGREE and result.step == stop_at
    # Its checkpoint holds the data position after exactly `step` batches.
    replay = BatchIterator(preempted.train_batches.corpus, preempted.train_batches.shapes, seed=0)
    for _ in range(result.step):
        next(replay)
    _, position = _state_and_position(tmp_path / "run", preempted, result.step)
    assert position == replay.get_state() == preempted.train_batches.get_state()

    monkeypatch.setattr(loop.Trainer, "_one_update", real_one_update)
    resumed = build_trainer(experiment, tmp_path / "run")
    assert resumed.run().step == updates
    got, got_position = _state_and_position(tmp_path / "run", resumed, updates)
    want, want_position = _state_and_position(tmp_path / "reference", reference, updates)
    assert got_position == want_position
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_non_finite_updates_read_late_still_stop_the_run_with_the_same_error(
    reversal_corpus, tmp_path, monkeypatch
):
    monkeypatch.setattr(stopping, "time", _FrozenClock)
    overrides = _overrides(reversal_corpus, 40, "--config.train.checkpoint_every_steps=10")
    trainer = build_trainer(
        tiny_experiment([*overrides, "--config.train.max_consecutive_skips=3"]), tmp_path
    )
    # Updates 13 on run a step whose gradients are NaN (compiled separately, the
    # poison decided when it is traced).
    poison = {"on": False}
    real_gradients = steps.compute_gradients

    def gradients(*args, **kwargs):
        grads, sums = real_gradients(*args, **kwargs)
        if poison["on"]:
            grads = jax.tree_util.tree_map(lambda g: g * jnp.nan, grads)
        return grads, sums

    monkeypatch.setattr(steps, "compute_gradients", gradients)
    clean, calls = trainer.program.train_step, []
    bad = build_program(trainer.experiment, trainer.mesh).train_step

    def train_step(state, batch):
        calls.append(1)
        poison["on"] = len(calls) >= 13
        return (bad if poison["on"] else clean)(state, batch)

    trainer.program = dataclasses.replace(trainer.program, train_step=train_step)
    with pytest.raises(FloatingPointError) as error:
        trainer.run()
    assert str(error.value) == (
        "3 consecutive updates had a non-finite loss or gradient; stopping at step 12; "
        f"the last good checkpoint (step 10) is intact in {trainer.checkpoints.directory}"
    )
    # Noticed one update late: the third skipped update (the 15th) is read once the 16th
    # is dispatched; no checkpoint was written mid-way through the skips.
    assert len(calls) == 16
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [10]
