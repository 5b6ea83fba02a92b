"""The epoch plans (bucketed and packed) are exactly those of the straightforward
algorithms restated here: runs resume bit-exactly across the vectorised rewrite."""

from __future__ import annotations

import numpy as np
import pytest

from attnmt.data import packing
from attnmt.data.batching import assign_buckets, bucket_shapes, plan_epoch
from attnmt.data.packing import pack_epoch, pack_examples
from tests.helpers import reference_pack


def reference_plan(src, tgt, shapes, seed, epoch, shuffle):
    """[(shape index, ids)]: a stable sort by bucket, each bucket permuted (or sorted by
    length), cut into batches, then the batches permuted."""
    lengths = np.asarray([length for _, length in shapes])
    need = np.maximum(src, tgt)
    buckets = np.searchsorted(lengths, need, side="left")
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    order = np.argsort(buckets, kind="stable")
    plans = []
    for index, (batch_size, _) in enumerate(shapes):
        members = order[buckets[order] == index]
        if rng is not None:
            members = rng.permutation(members)
        else:
            members = members[np.argsort(need[members], kind="stable")]
        for start in range(0, len(members), batch_size):
            plans.append((index, members[start : start + batch_size]))
    if rng is not None:
        plans = [plans[i] for i in rng.permutation(len(plans))]
    return plans


def random_lengths(rng: np.random.Generator, count: int, high: int) -> tuple:
    """Lengths with some examples too long for anything (up to `high`)."""
    src = rng.integers(1, high + 1, size=count)
    tgt = np.clip(src + rng.integers(-3, 4, size=count), 1, None)
    return src, tgt


def assert_same_plan(plan, expected) -> None:
    assert len(plan) == len(expected)
    for batch, (index, ids) in zip(plan, expected, strict=True):
        assert batch.shape_index == index
        np.testing.assert_array_equal(batch.example_ids, ids)


@pytest.mark.parametrize("case", range(12))
def test_plan_epoch_is_the_reference_plan(case: int) -> None:
    rng = np.random.default_rng(case)
    shapes = bucket_shapes(int(rng.integers(8, 60)), int(rng.integers(256, 800)), batch_multiple=4)
    count = int(rng.integers(0, 400)) if case else 0
    src, tgt = random_lengths(rng, count, high=70)
    for shuffle in (True, False):
        plan = plan_epoch(src, tgt, shapes, seed=case, epoch=case % 3, shuffle=shuffle)
        assert_same_plan(plan, reference_plan(src, tgt, shapes, case, case % 3, shuffle))


def test_plan_epoch_with_empty_buckets_and_examples_that_fit_none() -> None:
    shapes = [(16, 8), (8, 16), (4, 32), (2, 64)]
    rng = np.random.default_rng(5)
    # Buckets 1 and 3 empty, a third of the examples longer than any bucket.
    src = rng.choice([3, 20, 100], size=90)
    tgt = src.copy()
    for shuffle in (True, False):
        plan = plan_epoch(src, tgt, shapes, seed=1, epoch=4, shuffle=shuffle)
        assert {batch.shape_index for batch in plan} == {0, 2}
        assert_same_plan(plan, reference_plan(src, tgt, shapes, 1, 4, shuffle))


def test_assign_buckets_is_the_smallest_bucket_that_fits() -> None:
    shapes = [(16, 8), (8, 16), (4, 40)]
    src, tgt = random_lengths(np.random.default_rng(3), 300, high=50)
    expected = [
        next((i for i, (_, length) in enumerate(shapes) if max(s, t) <= length), len(shapes))
        for s, t in zip(src, tgt, strict=True)
    ]
    assert assign_buckets(src, tgt, shapes).tolist() == expected


@pytest.mark.parametrize("case", range(10))
def test_pack_examples_is_the_reference_first_fit(case: int) -> None:
    rng = np.random.default_rng(100 + case)
    rows, length = int(rng.integers(1, 24)), int(rng.integers(4, 40))
    count = int(rng.integers(0, 600)) if case else 0
    src, tgt = random_lengths(rng, count, high=length + 4)
    order = rng.permutation(count)
    batches = pack_examples(src, tgt, order, rows, length)
    expected = reference_pack(src, tgt, order, rows, length)
    assert len(batches) == len(expected)
    for batch, (ids, placed) in zip(batches, expected, strict=True):
        assert batch.example_ids.tolist() == ids
        assert batch.rows.tolist() == placed


def test_pack_epoch_is_the_reference_across_loop_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The open batch carries over from one chunk of the Python loop to the next."""
    monkeypatch.setattr(packing, "_CHUNK", 7)
    rng = np.random.default_rng(9)
    src, tgt = random_lengths(rng, 500, high=14)
    for shuffle in (True, False):
        batches = pack_epoch(src, tgt, rows=20, length=12, seed=2, epoch=3, shuffle=shuffle)
        order = np.random.default_rng([2, 3]).permutation(500) if shuffle else np.arange(500)
        expected = reference_pack(src, tgt, order, 20, 12)
        assert [b.example_ids.tolist() for b in batches] == [ids for ids, _ in expected]
        assert [b.rows.tolist() for b in batches] == [placed for _, placed in expected]
