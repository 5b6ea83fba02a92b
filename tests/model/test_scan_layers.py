"""model.scan_layers: the stacked layout computes the same function as the per-layer one.

The per-layer model is checked against NumPy float64 in test_norm_position.py and
test_transformer.py; here the scanned model must agree with it on the same numbers.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.decode.translate import decode_batch
from attnmt.inspection.capture import attention_maps
from attnmt.model import layout
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model

CONFIG = tiny_model(num_layers=3)
SRC = jnp.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]])
TGT = jnp.array([[11, 12, 13, 1, 0], [14, 1, 0, 0, 0]])


def _configs(norm_position, norm_type="layer", qk_norm=False):
    per_layer = dataclasses.replace(
        CONFIG, norm_position=norm_position, norm_type=norm_type, qk_norm=qk_norm
    )
    return per_layer, dataclasses.replace(per_layer, scan_layers=True)


def _per_layer_params(config, seed=0):
    variables = Transformer(config).init(jax.random.PRNGKey(seed), SRC, TGT)
    # Non-trivial LayerNorm gains and biases, so a misplaced norm cannot hide.
    params = nn.meta.unbox(variables["params"])
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    noisy = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def test_stacked_parameters_have_the_scanned_models_shapes_and_axis_names():
    _, scanned = _configs("post")
    boxed = jax.eval_shape(Transformer(scanned).init, jax.random.PRNGKey(0), SRC, TGT)["params"]
    kernel = boxed["encoder"]["layers"]["ffn"]["wi"]["kernel"]
    assert kernel.names == ("layers", "embed", "mlp")
    assert kernel.value.shape == (CONFIG.num_layers, CONFIG.d_model, CONFIG.d_ff)
    stacked = layout.stack_layers(_per_layer_params(CONFIG), CONFIG)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, nn.meta.unbox(boxed))
    assert jax.tree_util.tree_map(lambda x: x.shape, stacked) == shapes


def test_stack_and_unstack_are_exact_inverses():
    params = _per_layer_params(CONFIG)
    back = layout.unstack_layers(layout.stack_layers(params, CONFIG), CONFIG)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    leaves = zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(back), strict=True)
    for a, b in leaves:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    stacked = layout.stack_layers(params, CONFIG)
    second = stacked["decoder"]["layers"]["cross_attention"]["query"]["kernel"][1]
    np.testing.assert_array_equal(second, params["decoder_1"]["cross_attention"]["query"]["kernel"])


@pytest.mark.parametrize(
    ("norm_position", "norm_type", "qk_norm"),
    [
        ("post", "layer", False),
        ("pre", "layer", False),
        ("pre", "scale", False),
        ("pre", "layer", True),  # QKNorm's gains stack like ScaleNorm's scalars
    ],
)
def test_scanned_logits_and_gradients_equal_the_per_layer_model(norm_position, norm_type, qk_norm):
    per_layer, scanned = _configs(norm_position, norm_type, qk_norm)
    params = _per_layer_params(per_layer)
    stacked = layout.stack_layers(params, per_layer)
    weights = jax.random.normal(jax.random.PRNGKey(3), (2, 5, CONFIG.vocab_size))

    def loss(p, config):
        return jnp.sum(Transformer(config).apply({"params": p}, SRC, TGT) * weights)

    want_loss, want_grads = jax.value_and_grad(loss)(params, per_layer)
    got_loss, got_grads = jax.value_and_grad(loss)(stacked, scanned)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    restacked = layout.stack_layers(want_grads, per_layer)
    flat_want = jax.tree_util.tree_leaves_with_path(restacked)
    flat_got = dict(jax.tree_util.tree_leaves_with_path(got_grads))
    for path, want in flat_want:
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(
            flat_got[path], want, rtol=1e-4, atol=1e-5 * scale, err_msg=str(path)
        )


def test_stacks_of_different_depths_scan_to_the_same_function():
    # A 3-layer encoder under a 1-layer decoder: each stack scans over its own depth.
    per_layer = dataclasses.replace(CONFIG, num_encoder_layers=3, num_decoder_layers=1)
    scanned = dataclasses.replace(per_layer, scan_layers=True)
    params = _per_layer_params(per_layer)
    assert "encoder_2" in params and "decoder_0" in params and "decoder_1" not in params
    stacked = layout.stack_layers(params, per_layer)
    kernel = stacked["decoder"]["layers"]["ffn"]["wi"]["kernel"]
    assert kernel.shape == (1, CONFIG.d_model, CONFIG.d_ff)
    assert stacked["encoder"]["layers"]["ffn"]["wi"]["kernel"].shape[0] == 3
    want = Transformer(per_layer).apply({"params": params}, SRC, TGT)
    got = Transformer(scanned).apply({"params": stacked}, SRC, TGT)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    back = layout.unstack_layers(stacked, per_layer)
    assert sorted(back) == sorted(params)


def test_dropout_is_applied_inside_the_scanned_stack_and_follows_the_key():
    config = dataclasses.replace(CONFIG, scan_layers=True, dropout_rate=0.5)
    model = Transformer(config)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), SRC, TGT)["params"])

    def encode(key):
        bound = model.bind({"params": params}, rngs={"dropout": jax.random.PRNGKey(key)})
        return np.asarray(bound.encode(SRC, train=True))

    deterministic = model.apply({"params": params}, SRC, method=Transformer.encode)
    np.testing.assert_array_equal(encode(7), encode(7))
    assert not np.allclose(encode(7), encode(8))
    assert not np.allclose(encode(7), deterministic)


@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_a_scanned_checkpoint_equals_the_per_layer_model(beam):
    per_layer, scanned = _configs("pre")
    params = _per_layer_params(per_layer, seed=4)
    stacked = layout.stack_layers(params, per_layer)
    kwargs = dict(beam_size=beam, alpha=0.6, max_len_offset=4, max_positions=None)
    want = decode_batch([per_layer], [params], SRC, **kwargs)
    got = jax.jit(lambda p: decode_batch([scanned], [p], SRC, **kwargs))(stacked)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_attention_maps_of_a_scanned_model_are_named_per_layer():
    per_layer, scanned = _configs("post")
    params = _per_layer_params(per_layer)
    stacked = layout.stack_layers(params, per_layer)
    want = attention_maps(Transformer(per_layer), params, SRC, TGT)
    got = attention_maps(Transformer(scanned), stacked, SRC, TGT)
    assert sorted(got) == sorted(want) and "encoder_2/self_attention" in got
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7)


def test_incremental_decoding_on_the_stacked_layout_is_refused_with_the_fix():
    _, scanned = _configs("post")
    model = Transformer(scanned)
    params = layout.stack_layers(_per_layer_params(CONFIG), CONFIG)
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    with pytest.raises(ValueError, match="unstack_layers"):
        model.apply(
            {"params": params},
            encoded,
            SRC,
            TGT[:, :1],
            decode=True,
            max_decode_len=8,
            method=Transformer.decode,
            mutable=["cache"],
        )
