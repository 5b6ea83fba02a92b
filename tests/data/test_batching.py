"""Length buckets and epoch plans, checked against brute-force references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmt.data.batching import PlannedBatch, bucket_lengths, bucket_shapes, plan_epoch


@pytest.mark.parametrize(
    ("max_length", "min_length", "growth"),
    [(256, 8, 1.25), (100, 8, 1.25), (5, 8, 1.25), (1024, 16, 1.5), (64, 100, 1.1), (8, 8, 2)],
)
def test_bucket_lengths(max_length: int, min_length: int, growth: float) -> None:
    lengths = bucket_lengths(max_length, min_length, growth)
    last = math.ceil(max_length / 8) * 8
    assert lengths[-1] == last
    assert lengths[0] == min(math.ceil(min_length / 8) * 8, last)
    assert all(n % 8 == 0 for n in lengths)
    assert all(a < b for a, b in itertools.pairwise(lengths))
    # Roughly geometric: each step is one length multiple or at most ~growth^1.5 (one
    # bucket near the top may be skipped) plus rounding.
    for a, b in itertools.pairwise(lengths):
        assert b == a + 8 or b <= a * growth**1.5 + 8
    # Few shapes: about log(max/min)/log(growth), plus the short steps of 8.
    assert len(lengths) <= math.log(last / lengths[0]) / math.log(growth) + 8


def test_paper_sized_shapes_are_few() -> None:
    assert len(bucket_shapes(256, 25_000)) <= 16


@pytest.mark.parametrize(
    ("max_length", "budget", "multiple"), [(256, 25_000, 8), (100, 4096, 8), (64, 1000, 3)]
)
def test_bucket_shapes_budget(max_length: int, budget: int, multiple: int) -> None:
    shapes = bucket_shapes(max_length, budget, batch_multiple=multiple)
    assert [length for _, length in shapes] == bucket_lengths(max_length)
    for batch_size, length in shapes:
        assert batch_size % multiple == 0 and batch_size >= multiple
        assert batch_size * length <= budget
        assert (batch_size + multiple) * length > budget  # the largest that fits


def test_bucket_shapes_budget_too_small() -> None:
    with pytest.raises(ValueError, match="tokens_per_batch"):
        bucket_shapes(256, 8 * 256 - 1)
    assert bucket_shapes(256, 8 * 256)[-1] == (8, 256)


def smallest_fitting(need: int, shapes: list[tuple[int, int]]) -> int | None:
    for i, (_, length) in enumerate(shapes):
        if need <= length:
            return i
    return None


def check_plan(src, tgt, shapes, plan: list[PlannedBatch], budget: int | None = None) -> None:
    """Brute-force checks of one epoch's plan."""
    seen: list[int] = []
    per_bucket: dict[int, list[int]] = {}
    for batch in plan:
        batch_size, length = shapes[batch.shape_index]
        ids = [int(i) for i in batch.example_ids]
        assert 1 <= len(ids) <= batch_size
        if budget is not None:  # padded tokens on each side stay within the budget
            assert batch_size * length <= budget
        for i in ids:
            assert max(src[i], tgt[i]) <= length
            assert smallest_fitting(max(src[i], tgt[i]), shapes) == batch.shape_index
        per_bucket.setdefault(batch.shape_index, []).append(len(ids))
        seen.extend(ids)
    expected = [
        i for i in range(len(src)) if smallest_fitting(max(src[i], tgt[i]), shapes) is not None
    ]
    assert sorted(seen) == expected  # every fitting example exactly once, too-long ones never
    for index, sizes in per_bucket.items():  # at most one partial batch per bucket
        assert sum(1 for n in sizes if n < shapes[index][0]) <= 1
    assert len({b.shape_index for b in plan}) <= len(shapes)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 90), st.integers(1, 90)), max_size=300),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
    shuffle=st.booleans(),
)
def test_plan_epoch_properties(lengths, seed: int, epoch: int, shuffle: bool) -> None:
    src = np.array([s for s, _ in lengths], dtype=np.int32)
    tgt = np.array([t for _, t in lengths], dtype=np.int32)
    budget = 512
    shapes = bucket_shapes(64, budget)  # lengths up to 90: some examples are too long
    plan = plan_epoch(src, tgt, shapes, seed, epoch, shuffle)
    check_plan(src, tgt, shapes, plan, budget)


def test_plan_epoch_determinism_and_shuffling() -> None:
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 70, 2000), rng.integers(1, 70, 2000)
    shapes = bucket_shapes(64, 512)
    a = plan_epoch(src, tgt, shapes, seed=3, epoch=0)
    assert a == plan_epoch(src, tgt, shapes, seed=3, epoch=0)
    b = plan_epoch(src, tgt, shapes, seed=3, epoch=1)
    c = plan_epoch(src, tgt, shapes, seed=4, epoch=0)
    assert a != b and a != c
    for plan in (a, b, c):
        check_plan(src, tgt, shapes, plan)
    # Batch order is shuffled too, not only the rows: buckets are interleaved.
    order = [p.shape_index for p in a]
    assert order != sorted(order)


def test_plan_epoch_without_shuffle_is_sorted() -> None:
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(1, 70, 500), rng.integers(1, 70, 500)
    shapes = bucket_shapes(64, 512)
    plan = plan_epoch(src, tgt, shapes, seed=0, epoch=0, shuffle=False)
    assert plan == plan_epoch(src, tgt, shapes, seed=9, epoch=5, shuffle=False)
    need = np.maximum(src, tgt)
    flat = np.concatenate([p.example_ids for p in plan])
    assert np.all(np.diff(need[flat]) >= 0)  # non-decreasing length across the epoch
    check_plan(src, tgt, shapes, plan)


def test_plan_epoch_empty_and_mismatch() -> None:
    shapes = bucket_shapes(16, 128)
    assert plan_epoch(np.zeros(0, int), np.zeros(0, int), shapes, 0, 0) == []
    assert plan_epoch(np.array([40]), np.array([2]), shapes, 0, 0) == []  # too long
    with pytest.raises(ValueError):
        plan_epoch(np.array([1, 2]), np.array([1]), shapes, 0, 0)
