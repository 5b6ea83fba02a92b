"""Whole-model properties: causality, padding invariance, positions, shared embedding,
incremental decoding, compute dtype (the paper's §3)."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.common import EOS_ID, PAD_ID
from attnmt.model.layers import PositionalEncoding, SharedEmbedding
from attnmt.model.transformer import Transformer, shift_right
from tests.helpers import tiny_model

CONFIG = tiny_model(d_v=6, max_length=64)


def _init(config=CONFIG, length=7):
    model = Transformer(config)
    tokens = jnp.ones((2, length), jnp.int32)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, tokens)["params"])
    return model, params


def _tokens(rng, batch, length, vocab=24):
    return jnp.asarray(rng.integers(4, vocab, size=(batch, length)), jnp.int32)


def test_changing_future_targets_changes_no_earlier_logits():
    model, params = _init()
    rng = np.random.default_rng(0)
    src, tgt = _tokens(rng, 2, 6), _tokens(rng, 2, 7)
    base = model.apply({"params": params}, src, tgt)
    for t in range(1, 7):
        changed = tgt.at[:, t:].set(_tokens(rng, 2, 7 - t))
        logits = model.apply({"params": params}, src, changed)
        # Logits at position p depend on targets < p only (the decoder input is shifted).
        np.testing.assert_array_equal(np.asarray(logits[:, : t + 1]), np.asarray(base[:, : t + 1]))
        assert (
            not np.allclose(np.asarray(logits[:, t + 1 :]), np.asarray(base[:, t + 1 :])) or t == 6
        )


def test_appending_padding_changes_no_real_outputs():
    model, params = _init()
    rng = np.random.default_rng(1)
    src, tgt = _tokens(rng, 2, 5), _tokens(rng, 2, 6)
    src = src.at[:, -1].set(EOS_ID)
    tgt = tgt.at[:, -1].set(EOS_ID)
    base = model.apply({"params": params}, src, tgt)
    padded_src = jnp.pad(src, ((0, 0), (0, 4)), constant_values=PAD_ID)
    padded_tgt = jnp.pad(tgt, ((0, 0), (0, 3)), constant_values=PAD_ID)
    logits = model.apply({"params": params}, padded_src, padded_tgt)
    np.testing.assert_allclose(np.asarray(logits[:, :6]), np.asarray(base), atol=1e-5)


@pytest.mark.parametrize("offset", [0, 17])
def test_sinusoids_match_the_formula(offset):
    d_model, length = 10, 30
    config = dataclasses.replace(CONFIG, d_model=d_model)
    zeros = jnp.zeros((1, length, d_model))
    table = np.asarray(PositionalEncoding(config).apply({}, zeros, offset))[0]
    for row in range(length):
        pos = row + offset
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[row, 2 * i] == pytest.approx(math.sin(angle), abs=2e-6)
            assert table[row, 2 * i + 1] == pytest.approx(math.cos(angle), abs=2e-6)


def test_embedding_is_scaled_by_sqrt_d_model():
    module = SharedEmbedding(CONFIG)
    tokens = jnp.array([[5, 7, 9]])
    variables = module.init(jax.random.PRNGKey(0), tokens)
    matrix = np.asarray(nn.meta.unbox(variables["params"])["embedding"])
    got = module.apply(variables, tokens)
    np.testing.assert_allclose(np.asarray(got)[0], matrix[[5, 7, 9]] * math.sqrt(16), rtol=1e-6)


def test_one_embedding_matrix_serves_source_target_and_output():
    model, params = _init()
    vocab_shaped = [
        path
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if CONFIG.vocab_size in leaf.shape
    ]
    assert len(vocab_shaped) == 1
    src = jnp.array([[10, 11, EOS_ID]])  # 10, 11 only in the source
    tgt = jnp.array([[12, 13, EOS_ID]])  # 12 only in the decoder input; 20 appears nowhere

    def loss(embedding):
        p = dict(params, embed={"embedding": embedding})
        logits = model.apply({"params": p}, src, tgt)
        return jnp.sum(jax.nn.log_softmax(logits)[0, :, 20])

    grad = np.asarray(jax.grad(loss)(params["embed"]["embedding"]))
    assert np.abs(grad[10]).sum() > 0  # via the encoder embedding
    assert np.abs(grad[12]).sum() > 0  # via the decoder embedding (and the output layer)
    assert np.abs(grad[20]).sum() > 0  # via the pre-softmax projection only
    assert np.abs(grad[13]).sum() > 0


@pytest.mark.parametrize(
    "positional,norm_position,gated,norm_type,qk_norm",
    [
        ("sinusoidal", "post", False, "layer", False),
        ("learned", "post", False, "layer", False),
        ("sinusoidal", "pre", False, "layer", False),
        ("sinusoidal", "pre", True, "layer", False),  # SwiGLU (model.gated_ffn)
        ("sinusoidal", "pre", True, "scale", False),  # ScaleNorm (model.norm_type)
        ("sinusoidal", "pre", False, "layer", True),  # QKNorm: the caches hold unit keys
    ],
)
@pytest.mark.parametrize("length", [1, 4, 9])
def test_incremental_decoding_equals_teacher_forcing(
    positional, norm_position, gated, norm_type, qk_norm, length
):
    config = dataclasses.replace(
        CONFIG,
        positional=positional,
        norm_position=norm_position,
        gated_ffn=gated,
        norm_type=norm_type,
        qk_norm=qk_norm,
        activation="swish" if gated else CONFIG.activation,
    )
    model, params = _init(config)
    rng = np.random.default_rng(length)
    src = _tokens(rng, 3, 5).at[1, 3:].set(PAD_ID)
    tgt = _tokens(rng, 3, length)
    full = model.apply({"params": params}, src, tgt)
    encoded = model.apply({"params": params}, src, method=Transformer.encode)
    decoder_input = shift_right(tgt)
    _, variables = model.apply(
        {"params": params},
        encoded,
        src,
        decoder_input[:, :1],
        decode=True,
        max_decode_len=length,
        method=Transformer.decode,
        mutable=["cache"],
    )
    cache = variables["cache"]
    for t in range(length):
        logits, variables = model.apply(
            {"params": params, "cache": cache},
            encoded,
            src,
            decoder_input[:, t : t + 1],
            decode=True,
            method=Transformer.decode,
            mutable=["cache"],
        )
        cache = variables["cache"]
        np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(full[:, t]), atol=2e-5)


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, ...]]:
    """Operand dtypes of every dot_general in a jaxpr, nested jaxprs (jit, custom_jvp) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(tuple(str(var.aval.dtype) for var in eqn.invars))
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(sub, "eqns"):
                    found += _dot_operand_dtypes(sub)
    return found


def test_bfloat16_compute_keeps_float32_params_and_close_logits():
    config16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    model32, params = _init()
    model16 = Transformer(config16)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(params))
    rng = np.random.default_rng(3)
    src, tgt = _tokens(rng, 2, 6), _tokens(rng, 2, 6)

    # Every matrix product runs on bfloat16 operands, and the same products run in float32
    # without the setting: the setting reaches all of them.
    def dots(model):
        apply = jax.make_jaxpr(lambda p: model.apply({"params": p}, src, tgt))
        return _dot_operand_dtypes(apply(params).jaxpr)

    dots16, dots32 = dots(model16), dots(model32)
    assert dots16 and len(dots16) == len(dots32)
    assert all(dtype == "bfloat16" for operands in dots16 for dtype in operands), dots16
    assert all(dtype == "float32" for operands in dots32 for dtype in operands), dots32

    full = model32.apply({"params": params}, src, tgt)
    half = model16.apply({"params": params}, src, tgt)
    assert half.dtype == jnp.float32  # logits go to the loss in float32
    error = np.abs(np.asarray(half, np.float64) - np.asarray(full, np.float64))
    # Scale of logit v: |x·E_v| ≤ ‖x‖‖E_v‖, x the decoder's last LayerNorm output, whose norm
    # is at most √d_model·max|scale| + ‖bias‖ (zero mean, unit variance before the affine).
    norm = params["decoder_1"]["ffn_residual"]["norm"]
    x_norm = math.sqrt(CONFIG.d_model) * np.abs(norm["scale"]).max() + np.linalg.norm(norm["bias"])
    scale = x_norm * np.linalg.norm(np.asarray(params["embed"]["embedding"], np.float64), axis=1)
    # First-order rounding analysis: each rounding to a format of unit roundoff u moves a
    # value by ≤ u relative, and the LayerNorm after every sublayer renormalises, so the
    # errors of the roundings on the longest path add up. That path (source embedding,
    # both encoder layers, decoder layer 0's cross-attention keys, decoder layer 1, output
    # projection) holds 82 roundings: 3 in the embedding (token, sinusoid, sum), 9 per
    # attention sublayer (kernel and product of the query/key projection, scores, weights,
    # mix, kernel and product of W^O, residual sum, LayerNorm output) × 5, 8 per
    # feed-forward sublayer (2 kernels, 2 products, 2 bias sums, residual sum, LayerNorm)
    # × 4, 2 in the output projection (embedding, product).
    roundings = 3 + 9 * 5 + 8 * 4 + 2
    bound = roundings * 2.0**-8 * scale  # bfloat16: 8 significant bits, u = 2^-8
    assert np.all(error <= bound), (error / scale).max()
    # ...and more than the same roundings in float32 (u = 2^-24) could explain: something
    # on the way was rounded coarser than float32 (if the setting were ignored, error == 0).
    assert np.max(error / scale) > roundings * 2.0**-24, (error / scale).max()


def test_dropout_is_active_only_in_training():
    config = dataclasses.replace(CONFIG, dropout_rate=0.3, attention_dropout_rate=0.2)
    model, params = _init(config)
    src = jnp.array([[5, 6, 7, EOS_ID]])
    tgt = jnp.array([[8, 9, EOS_ID, PAD_ID]])
    a = model.apply({"params": params}, src, tgt)
    b = model.apply({"params": params}, src, tgt)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    c = model.apply(
        {"params": params}, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(1)}
    )
    d = model.apply(
        {"params": params}, src, tgt, train=True, rngs={"dropout": jax.random.PRNGKey(2)}
    )
    assert not np.allclose(np.asarray(c), np.asarray(d))
