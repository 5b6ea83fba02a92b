"""Attention maps collected for notebooks are proper, masked distributions."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attnmt.common import EOS_ID, PAD_ID
from attnmt.inspection.capture import attention_maps
from attnmt.model.transformer import Transformer
from tests.helpers import tiny_model


def test_maps_cover_every_attention_and_respect_masks():
    config = tiny_model(vocab_size=20)
    model = Transformer(config)
    src = jnp.array([[5, 6, 7, EOS_ID, PAD_ID], [8, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    tgt = jnp.array([[9, 10, EOS_ID, PAD_ID], [11, 12, 13, EOS_ID]])
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), src, tgt)["params"])
    maps = attention_maps(model, params, src, tgt)
    assert sorted(maps) == [
        "decoder_0/cross_attention",
        "decoder_0/self_attention",
        "decoder_1/cross_attention",
        "decoder_1/self_attention",
        "encoder_0/self_attention",
        "encoder_1/self_attention",
    ]
    encoder = maps["encoder_1/self_attention"]
    assert encoder.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(encoder.sum(-1), 1.0, rtol=1e-5)
    assert np.all(encoder[1, :, :, 2:] < 1e-6)  # padded source keys get no weight
    decoder = maps["decoder_0/self_attention"]
    assert np.all(np.triu(np.ones((4, 4)), k=1)[None, None] * decoder < 1e-6)  # causal
    cross = maps["decoder_1/cross_attention"]
    assert cross.shape == (2, 2, 4, 5) and np.all(cross[0, :, :, 4] < 1e-6)
