"""Word dropout (model.word_dropout_rate): whole token embeddings zeroed in training, checked
against the embedding table and §3.5's sinusoids in NumPy float64."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.errors import ConfigError
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model
from tests.model.reference import sinusoids

RATE = 0.5
CONFIG = tiny_model(max_length=64, word_dropout_rate=RATE)


def _init(config):
    model = Transformer(config)
    tokens = jnp.ones((2, 5), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, tokens)["params"])
    return model, params


def _embedded(model, params, tokens, train, key=0):
    def embed(module, tokens):
        return module._embed(tokens, module.encoder_positions, 0, train)

    rngs = {"dropout": jax.random.PRNGKey(key)} if train else None
    return np.asarray(model.apply({"params": params}, tokens, method=embed, rngs=rngs))


def test_each_token_is_kept_scaled_or_zeroed_whole():
    model, params = _init(CONFIG)
    batch, length, d = 64, 64, CONFIG.d_model
    tokens = np.random.default_rng(0).integers(4, CONFIG.vocab_size, size=(batch, length))
    out = _embedded(model, params, jnp.asarray(tokens, jnp.int32), train=True)

    table = np.asarray(params["embed"]["embedding"], np.float64)
    words = table[tokens] * math.sqrt(d)  # §3.4's scaled embedding, float64
    without_positions = out - sinusoids(length, d)[None]
    # Each float32 output is one product and one sum of values below 20 in magnitude: a few
    # units in the last place (2.4e-6 at 20) from the float64 reference.
    tol = dict(rtol=1e-6, atol=1e-5)
    dropped = np.all(np.isclose(without_positions, 0.0, **tol), axis=-1)
    kept = np.all(np.isclose(without_positions, words / (1 - RATE), **tol), axis=-1)
    assert np.all(dropped ^ kept), "every token is either dropped whole or kept whole"
    # 4,096 Bernoulli(0.5) draws: 5 standard deviations (32 tokens each) either side.
    n = batch * length
    assert abs(dropped.sum() - n * RATE) < 5 * math.sqrt(n * RATE * (1 - RATE))
    # Not the same positions in every row: the mask is per token, not per position.
    assert not np.all(dropped == dropped[:1])


def test_evaluation_and_rate_zero_leave_the_embedding_alone():
    model, params = _init(CONFIG)
    tokens = jnp.asarray(np.random.default_rng(1).integers(4, 24, size=(3, 9)), jnp.int32)
    table = np.asarray(params["embed"]["embedding"], np.float64)
    expected = table[np.asarray(tokens)] * math.sqrt(CONFIG.d_model) + sinusoids(9, 16)[None]
    np.testing.assert_allclose(_embedded(model, params, tokens, train=False), expected, atol=1e-5)
    off, _ = _init(dataclasses.replace(CONFIG, word_dropout_rate=0.0))
    np.testing.assert_allclose(_embedded(off, params, tokens, train=True), expected, atol=1e-5)


def test_training_logits_depend_on_the_word_dropout_key():
    # tiny_model has no other dropout: without word dropout, training equals evaluation.
    src = jnp.array([[5, 6, 7, 8, 9, 10, 2]])
    tgt = jnp.array([[11, 12, 13, 14, 2]])
    off = dataclasses.replace(CONFIG, word_dropout_rate=0.0)
    model, params = _init(off)
    evaluation = model.apply({"params": params}, src, tgt)
    training = model.apply(
        {"params": params}, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    np.testing.assert_array_equal(np.asarray(training), np.asarray(evaluation))
    model = Transformer(CONFIG)
    outputs = [
        np.asarray(
            model.apply(
                {"params": params}, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(k)}
            )
        )
        for k in range(4)
    ]
    assert any(not np.allclose(outputs[0], other) for other in outputs[1:])


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_rate_outside_zero_one_names_the_key(rate):
    with pytest.raises(ConfigError, match=r"model\.word_dropout_rate"):
        tiny_model(word_dropout_rate=rate)
