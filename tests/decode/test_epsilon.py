"""Epsilon sampling: the kept set against a float64 reference and empirical frequencies
against the truncated distribution (its settings' checks and flags: test_top_p.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.decode.beam_search import epsilon_truncated, sample
from tests.decode.search_reference import (
    SAMPLER_LOGITS,
    check_sampler_frequencies,
    constant_model,
    tempered_first_token,
)


def epsilon_reference(probs: np.ndarray, epsilon: float) -> np.ndarray:
    """float64: the tokens of probability ≥ epsilon (the most likely always), renormalised."""
    kept = np.where(probs >= min(epsilon, probs.max()), probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize(
    ("probs", "epsilon", "kept"),
    [
        ([0.5, 0.3, 0.15, 0.05], 0.1, [0, 1, 2]),
        ([0.5, 0.3, 0.15, 0.05], 0.2, [0, 1]),
        ([0.5, 0.3, 0.15, 0.05], 0.01, [0, 1, 2, 3]),
        ([0.05, 0.15, 0.5, 0.3], 0.2, [2, 3]),  # order of the vocabulary does not matter
        ([0.4, 0.3, 0.3], 0.9, [0]),  # above every probability: the most likely stays
        ([0.25, 0.25, 0.25, 0.25], 0.5, [0, 1, 2, 3]),  # all tied for most likely
    ],
)
def test_epsilon_keeps_the_tokens_at_least_that_likely(probs, epsilon, kept):
    logits = jnp.log(jnp.asarray([probs], jnp.float32))
    out = np.asarray(epsilon_truncated(logits, epsilon))[0]
    assert sorted(np.flatnonzero(np.isfinite(out))) == kept
    np.testing.assert_array_equal(out[kept], np.asarray(logits)[0, kept])  # not rescaled
    assert sorted(np.flatnonzero(epsilon_reference(np.asarray(probs, np.float64), epsilon))) == kept


@pytest.mark.parametrize(
    ("temperature", "top_k", "epsilon"),
    [(1.0, 0, 0.1), (1.0, 0, 0.2), (0.7, 0, 0.08), (1.0, 4, 0.25), (2.0, 0, 0.17)],
)
def test_frequencies_match_the_truncated_distribution(temperature, top_k, epsilon):
    expected = epsilon_reference(tempered_first_token(temperature, top_k), epsilon)
    check_sampler_frequencies(11, expected, temperature=temperature, top_k=top_k, epsilon=epsilon)


def test_epsilon_zero_is_off():
    cache, key = jnp.zeros((256,), jnp.int32), jax.random.key(3)
    args = dict(batch_size=256, max_decode_len=4)
    plain = sample(constant_model(SAMPLER_LOGITS), cache, key, **args)[0]
    off = sample(constant_model(SAMPLER_LOGITS), cache, key, epsilon=0.0, **args)[0]
    np.testing.assert_array_equal(off, plain)
