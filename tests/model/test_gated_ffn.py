"""The gated FFN (model.gated_ffn, Shazeer 2020): (act(x W1 + b1) ⊙ (x V + c)) W2 + b2,
checked against its parameters in NumPy float64 for each activation, and refused by the
export (tests/model/test_transformer.py decodes a gated model step by step)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnmt.errors import ConfigError
from attnmt.interop.marian_config import check_exportable
from attnmt.model.layers import FeedForward
from tests.helpers import tiny_model

U = np.finfo(np.float32).eps / 2  # float32's unit roundoff


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


# The activations written from their definitions, in float64.
REFERENCE = {
    "relu": lambda z: np.maximum(z, 0.0),
    "swish": lambda z: z / (1.0 + np.exp(-z)),
    "gelu": lambda z: 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0))),
}


def _gamma_bound(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """|float32 a @ b + bias − exact| ≤ γ_n (|a| @ |b| + |bias|), n = inner size + 1."""
    n = a.shape[-1] + 1
    return n * U / (1 - n * U) * (np.abs(a) @ np.abs(b) + np.abs(bias))


@pytest.mark.parametrize("activation", sorted(REFERENCE))
def test_the_gated_ffn_against_float64(activation):
    config = tiny_model(gated_ffn=True, activation=activation, d_ff=24)
    x = np.random.default_rng(0).normal(size=(4, 9, config.d_model)).astype(np.float32)
    ffn = FeedForward(config)
    params = nn.meta.unbox(ffn.init(jax.random.PRNGKey(1), jnp.asarray(x))["params"])
    # Biases start at zero; random ones make the test see each of them.
    rng = np.random.default_rng(2)
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: (
            jnp.asarray(rng.normal(size=p.shape) * 0.3, jnp.float32)
            if path[-1].key == "bias"
            else p
        ),
        params,
    )
    assert set(params) == {"wi", "wg", "wo"}
    w = {
        name: tuple(np.asarray(params[name][part], np.float64) for part in ("kernel", "bias"))
        for name in params
    }
    out = np.asarray(ffn.apply({"params": params}, jnp.asarray(x)), np.float64)

    x64 = x.astype(np.float64)
    pre, gate = x64 @ w["wi"][0] + w["wi"][1], x64 @ w["wg"][0] + w["wg"][1]
    hidden = REFERENCE[activation](pre) * gate
    expected = hidden @ w["wo"][0] + w["wo"][1]
    # Each of the three float32 products is within its γ bound; the activations have slope
    # ≤ 1.13 and float32 evaluation errors of a few u, which the bound's factor 4 and the
    # absolute 1e-5 (≈ 100 u on values of order 1) cover.
    first = _gamma_bound(x64, *w["wi"]) + _gamma_bound(x64, *w["wg"])
    hidden_error = (1.13 * np.abs(gate) + np.abs(pre) + 1) * first + 8 * U * np.abs(hidden)
    bound = 4 * (hidden_error @ np.abs(w["wo"][0]) + _gamma_bound(hidden, *w["wo"])) + 1e-5
    assert np.all(np.abs(out - expected) <= bound)
    # Not the ungated FFN: the gate changes the output by far more than the bound.
    ungated = REFERENCE[activation](pre) @ w["wo"][0] + w["wo"][1]
    assert np.abs(out - ungated).max() > 100 * bound.max()


def test_parameters_are_three_matrices_and_two_hidden_biases():
    d, d_ff = 16, 24
    x = jnp.zeros((1, 3, d))
    counts = {
        flag: sum(
            p.size
            for p in jax.tree_util.tree_leaves(
                nn.meta.unbox(
                    FeedForward(tiny_model(gated_ffn=flag, d_ff=d_ff)).init(
                        jax.random.PRNGKey(0), x
                    )
                )
            )
        )
        for flag in (False, True)
    }
    assert counts[False] == 2 * d * d_ff + d_ff + d
    assert counts[True] == 3 * d * d_ff + 2 * d_ff + d


def test_export_refuses_a_gated_ffn_by_key():
    config = tiny_model(
        gated_ffn=True, norm_position="post", positional_layout="halves", layer_norm_epsilon=1e-5
    )
    with pytest.raises(ConfigError, match=r"model\.gated_ffn=True"):
        check_exportable(config)
    check_exportable(
        tiny_model(norm_position="post", positional_layout="halves", layer_norm_epsilon=1e-5)
    )
