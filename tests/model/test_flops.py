"""The FLOP formula (attnmt.model.flops) against a count of every matmul JAX traces."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core

from attnmt.model.flops import forward_flops, padded_forward_flops, train_flops
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model


def _subjaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def _matmul_flops(jaxpr) -> int:
    """2 × (output elements) × (contracted size), summed over every dot_general."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
        for sub in _subjaxprs(eqn.params):
            total += _matmul_flops(sub)
    return total


@pytest.mark.parametrize(
    "sizes",
    [
        dict(d_k=8, d_v=8, num_heads=2),
        dict(d_k=5, d_v=7, num_heads=3),
        # a deep encoder under a shallow decoder: each stack counted at its own depth
        dict(d_k=8, d_v=8, num_heads=2, num_encoder_layers=3, num_decoder_layers=1),
        # a gated FFN: a third d_model × d_ff matrix per layer
        dict(d_k=8, d_v=8, num_heads=2, gated_ffn=True),
    ],
)
def test_padded_count_equals_every_traced_matmul(sizes):
    config = tiny_model(vocab_size=40, d_model=12, d_ff=20, **sizes)
    model = Transformer(config)
    rows, src_len, tgt_len = 3, 7, 5
    src = jnp.full((rows, src_len), 5, jnp.int32)
    tgt = jnp.full((rows, tgt_len), 6, jnp.int32)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), src, tgt)["params"]
    jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, src, tgt))(params)
    counted = _matmul_flops(jaxpr.jaxpr)
    assert counted == padded_forward_flops(config, rows, src_len, tgt_len)


def test_real_token_count_drops_padding_and_the_masked_half():
    config = tiny_model(
        vocab_size=40, d_model=12, d_ff=20, d_k=4, d_v=4, num_layers=1, dropout_rate=0.1
    )
    full = padded_forward_flops(config, 1, 6, 6)
    real = forward_flops(config, np.array([6]), np.array([6]))
    h, dk, dv = 2, 4, 4
    masked = (36 - 21) * 2 * h * (dk + dv)  # 15 future (query, key) pairs of 6 × 6
    assert full - real == masked
    assert train_flops(config, np.array([6]), np.array([6])) == 3 * real
    # Fewer real tokens, fewer FLOPs; an empty filler row costs nothing.
    assert forward_flops(config, np.array([3, 0]), np.array([4, 0])) < real
    assert forward_flops(config, np.array([0]), np.array([0])) == 0
