"""The sort-free truncations (beam_search.top_k_truncated and nucleus, both a bit-by-bit
threshold search) against sorting references on random rows: ties, -inf, signed zeros,
large and small vocabularies, every k, and top_p away from rounding's reach."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.decode.beam_search import nucleus, top_k_truncated
from tests.decode.search_reference import nucleus_reference


def _rows(seed: int, rows: int, vocab: int) -> np.ndarray:
    """float32 logits with repeated values, -inf entries and both signed zeros."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(rows, vocab)).astype(np.float32)
    # A fifth of the entries copy another entry of the row: ties at every rank.
    copies = rng.random((rows, vocab)) < 0.2
    sources = rng.integers(0, vocab, size=(rows, vocab))
    logits = np.where(copies, np.take_along_axis(logits, sources, axis=1), logits)
    logits[rng.random((rows, vocab)) < 0.1] = -np.inf
    logits[:, 0] = 0.0
    logits[:, 1] = -0.0
    return logits


@pytest.mark.parametrize(("vocab", "seed"), [(8, 0), (97, 1), (6000, 2)])
def test_top_k_keeps_every_value_at_or_above_the_kth_largest(vocab, seed):
    logits = _rows(seed, 12, vocab)
    for k in sorted({1, 2, 3, vocab // 3, vocab // 2, vocab - 1}):
        out = np.asarray(top_k_truncated(jnp.asarray(logits), k))
        for row, got in zip(logits, out, strict=True):
            kth = np.sort(row)[-k]  # the k-th largest, NumPy's comparison of floats
            expected = np.where(row >= kth, row, -np.inf)
            np.testing.assert_array_equal(got, expected)
            assert np.isfinite(got).sum() >= min(k, np.isfinite(row).sum())


def test_top_k_on_a_row_of_negative_infinities_and_one_value():
    row = np.full((1, 50), -np.inf, np.float32)
    row[0, 17] = -1e30
    out = np.asarray(top_k_truncated(jnp.asarray(row), 3))
    np.testing.assert_array_equal(out, row)  # the k-th largest is -inf: nothing is below it


def _margin(probs: np.ndarray, top_p: float) -> float:
    """How far top_p lies from every cumulative mass of the sorted row (float64)."""
    cumulative = np.cumsum(np.sort(probs)[::-1])
    return float(np.min(np.abs(cumulative - top_p)))


@pytest.mark.parametrize(("vocab", "seed"), [(8, 3), (97, 4), (6000, 5)])
def test_nucleus_against_the_sorting_reference(vocab, seed):
    logits = _rows(seed, 16, vocab)
    checked = 0
    for top_p in (0.05, 0.3, 0.5, 0.9, 0.99):
        out = np.asarray(nucleus(jnp.asarray(logits), top_p))
        for row, got in zip(logits, out, strict=True):
            probs = np.exp(row.astype(np.float64) - row.max())
            probs /= probs.sum()
            # float32 softmax and sums differ from float64 by far less than 1e-4 of the
            # mass; closer cases may round either way and are left to the exact tests.
            if _margin(probs, top_p) < 1e-4:
                continue
            checked += 1
            expected = nucleus_reference(probs, top_p) > 0
            np.testing.assert_array_equal(np.isfinite(got), expected)
            np.testing.assert_array_equal(got[expected], row[expected])  # not rescaled
    assert checked >= 40  # of 80 rows and values of top_p
