"""The encoder stack, post-norm (§3.1) and pre-norm, with LayerNorm or ScaleNorm, against a
NumPy float64 composition."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import PAD_ID
from attnmt.model.param_count import abstract_params
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model
from tests.model import reference

CONFIG = tiny_model(vocab_size=20, d_model=12, d_ff=24, num_heads=3, d_k=4, d_v=5)


def _layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * np.float64(p["scale"]) + np.float64(p["bias"])


def _scale_norm(x, p):
    # Nguyen & Salazar (2019), eq. for ScaleNorm: g · x / ‖x‖ with one scalar g.
    return np.float64(p["scale"]) * x / np.linalg.norm(x, axis=-1, keepdims=True)


_NORMS = {"layer": _layer_norm, "scale": _scale_norm}


def _ffn(x, p):
    hidden = np.maximum(0.0, x @ np.float64(p["wi"]["kernel"]) + np.float64(p["wi"]["bias"]))
    return hidden @ np.float64(p["wo"]["kernel"]) + np.float64(p["wo"]["bias"])


def _encode_numpy(params, tokens, norm_position, norm_type):
    _norm = _NORMS[norm_type]
    embedding = np.float64(params["embed"]["embedding"])
    x = embedding[tokens] * np.sqrt(CONFIG.d_model) + reference.sinusoids(
        tokens.shape[1], CONFIG.d_model
    )
    mask = (tokens != PAD_ID)[:, None, None, :]
    for i in range(CONFIG.num_layers):
        layer = params[f"encoder_{i}"]
        sublayers = (
            (
                "self_attention_residual",
                lambda h, layer=layer: reference.multi_head(h, h, layer["self_attention"], mask),
            ),
            ("ffn_residual", lambda h, layer=layer: _ffn(h, layer["ffn"])),
        )
        for norm_name, sublayer in sublayers:
            norm = layer[norm_name]["norm"]
            if norm_position == "post":
                x = _norm(x + sublayer(x), norm)  # Norm(x + Sublayer(x))
            else:
                x = x + sublayer(_norm(x, norm))  # x + Sublayer(Norm(x))
    if norm_position == "pre":
        x = _norm(x, params["encoder_norm"])
    return x


@pytest.mark.parametrize("norm_type", ["layer", "scale"])
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_matches_the_numpy_composition(norm_position, norm_type):
    config = dataclasses.replace(CONFIG, norm_position=norm_position, norm_type=norm_type)
    model = Transformer(config)
    tokens = np.array([[5, 6, 7, 8, 9], [10, 11, 12, PAD_ID, PAD_ID]])
    variables = model.init(jax.random.PRNGKey(3), jnp.asarray(tokens), jnp.asarray(tokens))
    params = nn.meta.unbox(variables["params"])
    # Non-trivial gains and biases, so a norm applied in the wrong place shows.
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: (
            leaf + 0.3 * rng.normal(size=leaf.shape).astype(np.float32)
            if any(getattr(k, "key", "") in ("scale", "bias") for k in path)
            else leaf
        ),
        params,
    )
    got = model.apply({"params": params}, jnp.asarray(tokens), method=Transformer.encode)
    numpy_params = jax.tree_util.tree_map(np.asarray, params)
    expected = _encode_numpy(numpy_params, tokens, norm_position, norm_type)
    real = tokens != PAD_ID
    np.testing.assert_allclose(np.asarray(got)[real], expected[real], rtol=1e-4, atol=1e-4)


def test_pre_norm_adds_one_final_norm_per_stack_and_nothing_else():
    post = abstract_params(CONFIG)
    pre = abstract_params(dataclasses.replace(CONFIG, norm_position="pre"))
    assert set(pre) - set(post) == {"encoder_norm", "decoder_norm"}
    assert set(post) <= set(pre)


def test_scale_norm_has_one_gain_per_norm_started_at_root_d_model():
    config = dataclasses.replace(CONFIG, norm_position="pre", norm_type="scale")
    params = abstract_params(config)
    gains = [
        leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if "norm" in jax.tree_util.keystr(path)
    ]
    # Two per encoder layer, three per decoder layer, one closing each stack.
    assert len(gains) == 5 * CONFIG.num_layers + 2
    assert all(leaf.shape == () for leaf in gains)
    tokens = jnp.asarray([[5, 6, 7]])
    variables = Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens)
    gain = nn.meta.unbox(variables["params"])["encoder_norm"]["scale"]
    np.testing.assert_allclose(np.asarray(gain), np.sqrt(CONFIG.d_model), rtol=1e-7)
