"""Encoder and decoder layers (§3.1), and each stack as one scanned layer.

The sub-layers of a layer are created by a function, so the per-layer modules and the
nn.scan bodies hold the very same parameter names and code.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from attnmt.common import axes
from attnmt.config.model import ModelConfig
from attnmt.model.layers import FeedForward, MultiHeadAttention, norm_layer


class Residual(nn.Module):
    """One sub-layer's normalisation, dropout and residual connection (§3.1, §5.4).

    post-norm (the paper): `LayerNorm(x + Dropout(Sublayer(x)))`, `sublayer_input` is x;
    pre-norm: `x + Dropout(Sublayer(LayerNorm(x)))`, `sublayer_input` is LayerNorm(x).
    """

    config: ModelConfig

    def setup(self) -> None:
        self.norm = norm_layer(self.config)
        self.dropout = nn.Dropout(rate=self.config.dropout_rate)

    def sublayer_input(self, x: jax.Array) -> jax.Array:
        return self.norm(x) if self.config.norm_position == "pre" else x

    def __call__(self, x: jax.Array, sublayer_output: jax.Array, *, train: bool) -> jax.Array:
        dropped = self.dropout(sublayer_output, deterministic=not train)
        if self.config.norm_position == "pre":
            return x + dropped
        return self.norm(x + dropped)


def _encoder_sublayers(cfg: ModelConfig, x: jax.Array, mask: jax.Array, train: bool) -> jax.Array:
    """One encoder layer's sub-modules, created under whichever module calls this."""
    residual = Residual(cfg, name="self_attention_residual")
    h = residual.sublayer_input(x)
    attended = MultiHeadAttention(cfg, name="self_attention")(h, h, mask, train=train)
    x = residual(x, attended, train=train)
    residual = Residual(cfg, name="ffn_residual")
    fed = FeedForward(cfg, name="ffn")(residual.sublayer_input(x), train=train)
    return residual(x, fed, train=train)


def _decoder_sublayers(
    cfg: ModelConfig,
    x: jax.Array,
    encoded: jax.Array,
    self_mask: jax.Array | None,
    cross_mask: jax.Array,
    train: bool,
    decode: bool,
    max_decode_len: int,
) -> jax.Array:
    """One decoder layer's sub-modules, created under whichever module calls this."""
    residual = Residual(cfg, name="self_attention_residual")
    h = residual.sublayer_input(x)
    attended = MultiHeadAttention(cfg, name="self_attention")(
        h, h, self_mask, train=train, decode=decode, max_decode_len=max_decode_len
    )
    x = residual(x, attended, train=train)
    residual = Residual(cfg, name="cross_attention_residual")
    attended = MultiHeadAttention(cfg, static_kv=True, name="cross_attention")(
        residual.sublayer_input(x), encoded, cross_mask, train=train, decode=decode
    )
    x = residual(x, attended, train=train)
    residual = Residual(cfg, name="ffn_residual")
    fed = FeedForward(cfg, name="ffn")(residual.sublayer_input(x), train=train)
    return residual(x, fed, train=train)


class EncoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, *, train: bool) -> jax.Array:
        return _encoder_sublayers(self.config, x, mask, train)


class DecoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        encoded: jax.Array,
        self_mask: jax.Array | None,
        cross_mask: jax.Array,
        *,
        train: bool,
        decode: bool,
        max_decode_len: int,
    ) -> jax.Array:
        return _decoder_sublayers(
            self.config, x, encoded, self_mask, cross_mask, train, decode, max_decode_len
        )


class _ScanEncoderLayer(nn.Module):
    """EncoderLayer in nn.scan's `(carry, *xs) -> (carry, ys)` form; flags as attributes."""

    config: ModelConfig
    train: bool

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, None]:
        return _encoder_sublayers(self.config, x, mask, self.train), None


class _ScanDecoderLayer(nn.Module):
    config: ModelConfig
    train: bool

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        encoded: jax.Array,
        self_mask: jax.Array | None,
        cross_mask: jax.Array,
    ) -> tuple[jax.Array, None]:
        x = _decoder_sublayers(self.config, x, encoded, self_mask, cross_mask, self.train, False, 0)
        return x, None


def _scanned(layer: type[nn.Module], num_broadcast: int, num_layers: int) -> type[nn.Module]:
    # Parameters (and sown attention weights) gain a leading "layers" axis; the step
    # function is traced and compiled once instead of num_layers times.
    return nn.scan(
        layer,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * num_broadcast,
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: axes.LAYERS},
        check_constancy_invariants=False,  # the broadcast inputs are constants by design
    )


class EncoderStack(nn.Module):
    """All encoder layers as one scanned layer: params["encoder"]["layers"][...] stacked."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, *, train: bool) -> jax.Array:
        stack = _scanned(_ScanEncoderLayer, 1, self.config.encoder_layers)
        x, _ = stack(self.config, train=train, name="layers")(x, mask)
        return x


class DecoderStack(nn.Module):
    """All decoder layers as one scanned layer (teacher forcing only: decoding converts
    the parameters to the per-layer layout with `attnmt.model.layout.unstack_layers`)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        encoded: jax.Array,
        self_mask: jax.Array,
        cross_mask: jax.Array,
        *,
        train: bool,
    ) -> jax.Array:
        stack = _scanned(_ScanDecoderLayer, 3, self.config.decoder_layers)
        x, _ = stack(self.config, train=train, name="layers")(x, encoded, self_mask, cross_mask)
        return x
