"""Attention and multi-head attention against a NumPy float64 reference (§3.2)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.model.layers import MultiHeadAttention, dot_product_attention_weights
from tests.helpers import tiny_model
from tests.model import reference

CONFIG = tiny_model(vocab_size=16, d_model=12, d_ff=20, num_heads=3, d_k=5, d_v=7, num_layers=1)


def _masks(batch, q_len, k_len, rng):
    lengths = rng.integers(1, k_len + 1, size=batch)
    lengths[0] = k_len
    padding = np.arange(k_len)[None, :] < lengths[:, None]  # [b, k]
    pad_mask = padding[:, None, None, :]
    causal = np.tril(np.ones((q_len, k_len), bool))[None, None]
    return {"padding": pad_mask, "causal": causal & pad_mask, "none": np.ones((1, 1, 1, 1), bool)}


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_scaled_dot_product_weights_match_numpy(mask_kind):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 6, 3, 5))
    k = rng.normal(size=(2, 6, 3, 5))
    v = rng.normal(size=(2, 6, 3, 4))
    mask = _masks(2, 6, 6, rng)[mask_kind]
    _, expected = reference.attention(q, k, v, mask)
    got = dot_product_attention_weights(
        jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), jnp.asarray(mask)
    )
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
@pytest.mark.parametrize("cross", [False, True])
def test_multi_head_attention_matches_numpy(mask_kind, cross):
    rng = np.random.default_rng(1)
    x_q = rng.normal(size=(3, 6, CONFIG.d_model))
    x_kv = rng.normal(size=(3, 6, CONFIG.d_model)) if cross else x_q
    mask = _masks(3, 6, 6, rng)[mask_kind]
    module = MultiHeadAttention(CONFIG, static_kv=cross)
    variables = module.init(
        jax.random.PRNGKey(0),
        jnp.asarray(x_q, jnp.float32),
        jnp.asarray(x_kv, jnp.float32),
        jnp.asarray(mask),
        train=False,
    )
    params = nn.meta.unbox(variables["params"])
    got = module.apply(
        {"params": params},
        jnp.asarray(x_q, jnp.float32),
        jnp.asarray(x_kv, jnp.float32),
        jnp.asarray(mask),
        train=False,
    )
    expected = reference.multi_head(x_q, x_kv, params, mask)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_projection_shapes_follow_h_dk_dv_separately():
    module = MultiHeadAttention(CONFIG)
    x = jnp.zeros((1, 4, CONFIG.d_model))
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), x, x, None, train=False)["params"])
    assert params["query"]["kernel"].shape == (12, 3, 5)
    assert params["key"]["kernel"].shape == (12, 3, 5)
    assert params["value"]["kernel"].shape == (12, 3, 7)
    assert params["out"]["kernel"].shape == (3, 7, 12)


def test_attention_weights_are_sown_only_when_asked():
    module = MultiHeadAttention(CONFIG)
    x = jnp.ones((1, 4, CONFIG.d_model))
    variables = module.init(jax.random.PRNGKey(0), x, x, None, train=False)
    params = {"params": variables["params"]}
    _, state = module.apply(params, x, x, None, train=False, mutable=["intermediates"])
    weights = state["intermediates"]["attention_weights"][0]
    assert weights.shape == (1, 3, 4, 4)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
    plain = module.apply(params, x, x, None, train=False)
    assert not isinstance(plain, tuple)  # nothing collected by default


QK_CONFIG = dataclasses.replace(CONFIG, qk_norm=True, qk_norm_gain=6.0)


@pytest.mark.parametrize("mask_kind", ["padding", "causal"])
@pytest.mark.parametrize("cross", [False, True])
def test_qk_norm_attention_matches_numpy(mask_kind, cross):
    """model.qk_norm: g · q̂·k̂ (unit-length queries and keys per head) instead of q·k/√d_k."""
    rng = np.random.default_rng(2)
    # Inputs of very different lengths per position: QKNorm's logits must not follow them.
    x_q = rng.normal(size=(3, 6, CONFIG.d_model)) * rng.uniform(0.1, 20, size=(3, 6, 1))
    x_kv = rng.normal(size=(3, 6, CONFIG.d_model)) * 7.0 if cross else x_q
    mask = _masks(3, 6, 6, rng)[mask_kind]
    module = MultiHeadAttention(QK_CONFIG, static_kv=cross)
    args = (jnp.asarray(x_q, jnp.float32), jnp.asarray(x_kv, jnp.float32), jnp.asarray(mask))
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), *args, train=False)["params"])
    assert float(params["qk_gain"]) == 6.0  # model.qk_norm_gain starts it
    params = dict(params, qk_gain=jnp.float32(3.7))  # a trained value, not the start
    got = module.apply({"params": params}, *args, train=False)
    np.testing.assert_allclose(
        np.asarray(got), reference.multi_head(x_q, x_kv, params, mask), rtol=1e-4, atol=1e-4
    )
    assert set(params) == {"query", "key", "value", "out", "qk_gain"}  # one scalar added


def test_qk_norm_bounds_every_logit_by_the_gain():
    """No query or key, however long, moves a logit outside [-g, g]: weights within a row
    differ by at most e^(2g), where plain attention saturates."""
    module = MultiHeadAttention(QK_CONFIG)
    x = jax.random.normal(jax.random.PRNGKey(4), (1, 5, CONFIG.d_model)) * 1e3
    variables = module.init(jax.random.PRNGKey(0), x, x, None, train=False)
    _, state = module.apply(variables, x, x, None, train=False, mutable=["intermediates"])
    weights = np.asarray(state["intermediates"]["attention_weights"][0], np.float64)
    assert weights.min() > 0
    assert np.log(weights.max(-1) / weights.min(-1)).max() <= 2 * 6.0 + 1e-4


def test_qk_norm_gain_must_be_positive():
    from attnmt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model\.qk_norm_gain"):
        dataclasses.replace(CONFIG, qk_norm=True, qk_norm_gain=0.0)
