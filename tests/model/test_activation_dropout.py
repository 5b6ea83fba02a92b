"""Activation dropout (model.activation_dropout_rate): the FFN's hidden units dropped in
training, checked against W1, b1, W2 and b2 in NumPy float64."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.errors import ConfigError
from attnmt.model.layers import FeedForward
from attnmt.model.transformer import Transformer
from tests.helpers import random_params, tiny_model

RATE = 0.5
CONFIG = tiny_model(activation_dropout_rate=RATE)
U = np.finfo(np.float32).eps / 2  # float32's unit roundoff


def _ffn(config, shape=(8, 32)):
    x = np.random.default_rng(0).normal(size=(*shape, config.d_model)).astype(np.float32)
    ffn = FeedForward(config)
    params = nn.meta.unbox(ffn.init(jax.random.PRNGKey(0), jnp.asarray(x))["params"])
    weights = {
        name: tuple(np.asarray(params[name][p], np.float64) for p in ("kernel", "bias"))
        for name in ("wi", "wo")
    }
    return ffn, params, x, weights


def _dot_bound(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A float32 a @ b + bias lies within this of the float64 result: n + 1 roundings of
    at most u each, relative to Σ|a||b| + |bias| (Higham's γ_n bound, n the inner size)."""
    n = a.shape[-1] + 1
    return n * U / (1 - n * U) * (np.abs(a) @ np.abs(b) + np.abs(bias))


def test_each_hidden_unit_is_kept_scaled_or_zeroed():
    ffn, params, x, weights = _ffn(CONFIG)
    (w1, b1), (w2, b2) = weights["wi"], weights["wo"]
    out, state = ffn.apply(
        {"params": params},
        jnp.asarray(x),
        train=True,
        rngs={"dropout": jax.random.PRNGKey(3)},
        capture_intermediates=True,
    )
    (dropped,) = state["intermediates"]["activation_dropout"]["__call__"]
    dropped = np.asarray(dropped, np.float64)

    x64 = x.astype(np.float64)
    hidden = np.maximum(x64 @ w1 + b1, 0.0)  # §3.3's max(0, x W1 + b1)
    # The float32 pre-activation is within the γ bound; ReLU and the exact 1/(1-p) = 2 keep it.
    bound = _dot_bound(x64, w1, b1) / (1 - RATE) + 1e-30
    zeroed = dropped == 0.0
    kept = np.abs(dropped - hidden / (1 - RATE)) <= bound
    assert np.all(zeroed | kept), "every hidden unit is either dropped or kept and scaled"
    active = hidden > 2 * bound  # units the ReLU surely passed: zero only if dropped
    n = int(active.sum())
    assert n > 1000
    assert abs(zeroed[active].sum() - n * RATE) < 5 * math.sqrt(n * RATE * (1 - RATE))
    flat = zeroed.reshape(-1, CONFIG.d_ff)
    assert not np.all(flat == flat[:1]), "a mask per position, not one for all"

    # The output is W2 applied to exactly those dropped activations.
    expected = dropped @ w2 + b2
    assert np.all(np.abs(np.asarray(out, np.float64) - expected) <= _dot_bound(dropped, w2, b2))


@pytest.mark.parametrize("config, train", [(CONFIG, False), (tiny_model(), True)])
def test_evaluation_and_rate_zero_compute_the_papers_ffn(config, train):
    ffn, params, x, weights = _ffn(config)
    (w1, b1), (w2, b2) = weights["wi"], weights["wo"]
    out = np.asarray(ffn.apply({"params": params}, jnp.asarray(x), train=train), np.float64)
    x64 = x.astype(np.float64)
    hidden = np.maximum(x64 @ w1 + b1, 0.0)
    # The float32 hidden units are within the first γ bound (ReLU moves nothing further),
    # which W2's absolute values carry to the output; then the second product's own bound.
    first = _dot_bound(x64, w1, b1)
    bound = first @ np.abs(w2) + _dot_bound(hidden + first, w2, b2)
    assert np.all(np.abs(out - (hidden @ w2 + b2)) <= bound)


def test_the_model_drops_in_training_only():
    """Wired through every encoder and decoder layer: a training forward pass changes with
    the rate, an evaluation pass of the same parameters does not."""
    params = random_params(CONFIG, seed=0)  # no parameters of its own: any rate fits
    tokens = jnp.asarray(np.random.default_rng(1).integers(4, 24, size=(2, 7)), jnp.int32)

    def logits(config, train):
        rngs = {"dropout": jax.random.PRNGKey(5)} if train else None
        model = Transformer(config)
        return np.asarray(model.apply({"params": params}, tokens, tokens, train=train, rngs=rngs))

    off = dataclasses.replace(CONFIG, activation_dropout_rate=0.0)
    np.testing.assert_array_equal(logits(CONFIG, False), logits(off, False))
    np.testing.assert_array_equal(logits(off, True), logits(off, False))  # no other dropout
    assert not np.allclose(logits(CONFIG, True), logits(off, True), atol=1e-3)


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_rate_outside_0_1_is_refused_by_name(rate):
    with pytest.raises(ConfigError, match=r"model\.activation_dropout_rate"):
        tiny_model(activation_dropout_rate=rate)
