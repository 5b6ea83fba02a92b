"""Building blocks of the Transformer (the paper's §3.2-§3.5).

Every parameter carries logical axis names from `attnmt.common` and so do the main
activations; `attnmt.parallel.sharding` maps them to a device mesh.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnmt.common import PAD_ID, axes
from attnmt.config.model import ModelConfig

# A large finite negative: -inf would turn a fully masked row into NaN.
_MASKED = -1e9


def compute_dtype(config: ModelConfig) -> jnp.dtype:
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


def _partitioned(init: nn.initializers.Initializer, names: tuple[str, ...]):
    return nn.with_logical_partitioning(init, names)


def constrain(x: jax.Array, names: tuple[str, ...]) -> jax.Array:
    """Annotates an activation with logical axes (a no-op without sharding rules)."""
    return nn.with_logical_constraint(x, names)


class SharedEmbedding(nn.Module):
    """§3.4: one matrix embeds source and target tokens and projects to vocabulary logits."""

    config: ModelConfig

    def setup(self) -> None:
        d_model = self.config.d_model
        # std d_model^-0.5 makes the embedding × √d_model unit-variance, like the
        # sinusoids it is added to.
        self.embedding = self.param(
            "embedding",
            _partitioned(nn.initializers.normal(stddev=d_model**-0.5), (axes.VOCAB, axes.EMBED)),
            (self.config.vocab_size, d_model),
            jnp.float32,
        )

    def _table(self) -> jax.Array:
        if self.config.zero_pad_embedding:
            return self.embedding.at[PAD_ID].set(0.0)  # no gradient reaches that row
        return self.embedding

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[batch, length] int → [batch, length, embed], scaled by √d_model (§3.4)."""
        dtype = compute_dtype(self.config)
        embedded = jnp.take(self._table(), tokens, axis=0).astype(dtype)
        if not self.config.scale_embedding:
            return embedded
        return embedded * jnp.asarray(math.sqrt(self.config.d_model), dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """Pre-softmax linear layer with the shared matrix: [.., embed] → [.., vocab]."""
        dtype = compute_dtype(self.config)
        return jnp.einsum("ble,ve->blv", x.astype(dtype), self._table().astype(dtype))


def sinusoids(positions: jax.Array, d_model: int, layout: str = "interleaved") -> jax.Array:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    Computed for the requested positions only, so decoding can run to any length.
    positions [length] → [length, d_model] float32. `layout="halves"` puts every sine
    first and the cosines of the same frequencies after them (Marian's order).
    """
    two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
    angles = positions.astype(jnp.float32)[:, None] / jnp.power(10000.0, two_i / d_model)
    if layout == "halves":
        # An odd d_model has one more sine than cosine, as in Marian.
        return jnp.concatenate([jnp.sin(angles), jnp.cos(angles[:, : d_model // 2])], axis=-1)
    interleaved = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return interleaved.reshape(positions.shape[0], -1)[:, :d_model]


class PositionalEncoding(nn.Module):
    """Adds sinusoidal (§3.5) or learned (Table 3 row E) position encodings."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, x: jax.Array, offset: jax.Array | int = 0, positions: jax.Array | None = None
    ) -> jax.Array:
        """x: [batch, length, embed]; `offset` is the first position (incremental decoding);
        `positions` [batch, length], if given, is each token's own position (packed rows,
        where every example starts again from 0)."""
        batch, length, d_model = x.shape
        if self.config.positional == "learned":
            table = self.param(
                "position_embedding",
                _partitioned(nn.initializers.normal(stddev=d_model**-0.5), (None, axes.EMBED)),
                (self.config.max_length, d_model),
                jnp.float32,
            )
            if positions is not None:
                return x + jnp.take(table, positions, axis=0).astype(x.dtype)
            encoding = jax.lax.dynamic_slice_in_dim(table, offset, length, axis=0)
        elif positions is not None:
            flat = sinusoids(positions.reshape(-1), d_model, self.config.positional_layout)
            return x + flat.reshape(batch, length, d_model).astype(x.dtype)
        else:
            encoding = sinusoids(
                offset + jnp.arange(length), d_model, self.config.positional_layout
            )
        return x + encoding[None].astype(x.dtype)


def dot_product_attention_weights(
    query: jax.Array,
    key: jax.Array,
    mask: jax.Array | None,
    *,
    heads_major: bool = False,
    scale: jax.Array | float | None = None,
) -> jax.Array:
    """softmax(Q Kᵀ / √d_k) with illegal connections masked (§3.2.1).

    query [batch, q_len, heads, d_k], key [batch, kv_len, heads, d_k] (or, with
    `heads_major`, [batch, heads, kv_len, d_k] as the decode caches store it),
    mask broadcastable to [batch, heads, q_len, kv_len] (True = may attend). `scale`
    replaces 1/√d_k (QKNorm's learned gain). Returns float32 weights [batch, heads, q_len,
    kv_len].
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    equation = "bqhd,bhkd->bhqk" if heads_major else "bqhd,bkhd->bhqk"
    logits = jnp.einsum(equation, query, key).astype(jnp.float32) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, _MASKED)
    return jax.nn.softmax(logits, axis=-1)


class HeadProjection(nn.Module):
    """A bias-free projection with a multi-dimensional kernel, applied by einsum.

    The kernel is declared in its true shape (not flattened to 2-D first, as DenseGeneral
    does), so its logical axis names hold at every step and sharding constraints apply.
    Glorot-uniform over fan-in = product of `fan_in_axes`, fan-out = the rest.
    """

    kernel_shape: tuple[int, ...]
    names: tuple[str, ...]
    equation: str
    fan_in_axes: tuple[int, ...]
    dtype: jnp.dtype = jnp.float32
    use_bias: bool = False  # a bias over the output axes (model.attention_bias)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        fan_out_axes = tuple(i for i in range(len(self.kernel_shape)) if i not in self.fan_in_axes)
        init = nn.initializers.xavier_uniform(in_axis=self.fan_in_axes, out_axis=fan_out_axes)
        kernel = self.param(
            "kernel", _partitioned(init, self.names), self.kernel_shape, jnp.float32
        )
        y = jnp.einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype))
        if not self.use_bias:
            return y
        out_names = tuple(self.names[i] for i in fan_out_axes)
        bias = self.param(
            "bias",
            _partitioned(nn.initializers.zeros, out_names),
            tuple(self.kernel_shape[i] for i in fan_out_axes),
            jnp.float32,
        )
        return y + bias.astype(self.dtype)


class MultiHeadAttention(nn.Module):
    """§3.2.2 MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, with an optional decode cache.

    Modes: plain (training / full forward); `decode=True` self-attention that appends one
    position at a time to a key/value cache; `decode=True` with `static_kv=True` for
    encoder-decoder attention, whose projected keys/values are computed once per sentence
    and kept in the cache. Attention weights are sown into "intermediates" only when the
    caller makes that collection mutable.
    """

    config: ModelConfig
    static_kv: bool = False  # keys/values come from the encoder output

    def _project(self, x: jax.Array, size: int, name: str) -> jax.Array:
        """x W_i for every head at once: [batch, len, embed] → [batch, len, heads, size]."""
        cfg = self.config
        return HeadProjection(
            kernel_shape=(cfg.d_model, cfg.num_heads, size),
            names=(axes.EMBED, axes.HEADS, axes.KV),
            equation="ble,ehd->blhd",
            fan_in_axes=(0,),
            dtype=compute_dtype(cfg),
            use_bias=cfg.attention_bias,
            name=name,
        )(x)

    def _keys_values(self, inputs_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
        key = self._project(inputs_kv, self.config.d_k, "key")  # [batch, kv_len, heads, d_k]
        value = self._project(inputs_kv, self.config.d_v, "value")  # [batch, kv_len, heads, d_v]
        # Normalised before any cache stores them, so cached keys need nothing more.
        return self._unit_length(key), value

    def _unit_length(self, x: jax.Array) -> jax.Array:
        """Each head's query or key divided by its length, under model.qk_norm (QKNorm)."""
        if not self.config.qk_norm:
            return x
        x32 = x.astype(jnp.float32)  # the length in float32 even when computing in bfloat16
        length = jnp.linalg.norm(x32, axis=-1, keepdims=True)
        return (x32 / jnp.maximum(length, self.config.layer_norm_epsilon)).astype(x.dtype)

    def _logit_scale(self) -> jax.Array | None:
        """QKNorm's learned gain g (one scalar per attention layer), or None for 1/√d_k."""
        if not self.config.qk_norm:
            return None
        start = nn.initializers.constant(self.config.qk_norm_gain)
        return self.param("qk_gain", _partitioned(start, ()), (), jnp.float32)

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None,
        *,
        train: bool,
        decode: bool = False,
        max_decode_len: int = 0,
    ) -> jax.Array:
        cfg = self.config
        query = self._unit_length(self._project(inputs_q, cfg.d_k, "query"))
        query = constrain(query, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV))
        # Decode caches hold keys/values heads-major, [batch, heads, kv_len, d]: the layout
        # the attention matmuls read, so no step re-transposes a whole cache.
        if decode and self.static_kv:
            key, value = self._cached_encoder_kv(inputs_kv)
        elif decode:
            key, value, mask = self._append_to_cache(inputs_kv, max_decode_len)
        else:
            key, value = self._keys_values(inputs_kv)
        kv_names = (axes.BATCH, axes.HEADS, axes.KV_LENGTH, axes.KV)
        if not decode:
            kv_names = (axes.BATCH, axes.KV_LENGTH, axes.HEADS, axes.KV)
        key, value = constrain(key, kv_names), constrain(value, kv_names)

        weights = dot_product_attention_weights(
            query, key, mask, heads_major=decode, scale=self._logit_scale()
        )
        self.sow("intermediates", "attention_weights", weights)
        if train and cfg.attention_dropout_rate > 0:
            weights = nn.Dropout(rate=cfg.attention_dropout_rate)(weights, deterministic=False)
        mix = "bhqk,bhkd->bqhd" if decode else "bhqk,bkhd->bqhd"
        heads = jnp.einsum(mix, weights.astype(value.dtype), value)
        heads = constrain(heads, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV))
        output = HeadProjection(  # Concat(head_1..head_h) W^O
            kernel_shape=(cfg.num_heads, cfg.d_v, cfg.d_model),
            names=(axes.HEADS, axes.KV, axes.EMBED),
            equation="blhd,hde->ble",
            fan_in_axes=(0, 1),
            dtype=compute_dtype(cfg),
            use_bias=cfg.attention_bias,
            name="out",
        )(heads)
        return constrain(output, (axes.BATCH, axes.LENGTH, axes.EMBED))

    def _cached_encoder_kv(self, inputs_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
        # Projected once when the cache is created, then reused at every step.
        created = not self.has_variable("cache", "cached_key")
        if created:
            key, value = map(_heads_major, self._keys_values(inputs_kv))
        else:
            key = value = None
        cached_key = self.variable("cache", "cached_key", lambda: key)
        cached_value = self.variable("cache", "cached_value", lambda: value)
        return cached_key.value, cached_value.value

    def _append_to_cache(
        self, inputs_kv: jax.Array, max_decode_len: int
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cfg = self.config
        batch = inputs_kv.shape[0]
        dtype = compute_dtype(cfg)
        created = not self.has_variable("cache", "cached_key")
        if created and max_decode_len <= 0:
            raise ValueError("max_decode_len must be positive when creating a decode cache")
        cached_key = self.variable(
            "cache", "cached_key", jnp.zeros, (batch, cfg.num_heads, max_decode_len, cfg.d_k), dtype
        )
        cached_value = self.variable(
            "cache",
            "cached_value",
            jnp.zeros,
            (batch, cfg.num_heads, max_decode_len, cfg.d_v),
            dtype,
        )
        index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        key, value = map(_heads_major, self._keys_values(inputs_kv))  # [batch, heads, 1, d]
        if created:
            # Creating the cache only records shapes; nothing is decoded yet.
            return key, value, jnp.ones((1, 1, 1, 1), bool)
        i = index.value
        cached_key.value = jax.lax.dynamic_update_slice_in_dim(cached_key.value, key, i, axis=2)
        cached_value.value = jax.lax.dynamic_update_slice_in_dim(
            cached_value.value, value, i, axis=2
        )
        index.value = i + 1
        length = cached_key.value.shape[2]
        # Causal mask for the single query at position i: keys 0..i are visible.
        mask = (jnp.arange(length) <= i)[None, None, None, :]
        return cached_key.value, cached_value.value, mask


def _heads_major(x: jax.Array) -> jax.Array:
    """[batch, len, heads, d] → [batch, heads, len, d]."""
    return jnp.swapaxes(x, 1, 2)


_ACTIVATIONS = {
    "relu": nn.relu,
    "swish": nn.swish,  # x·σ(x), which Hugging Face also calls silu
    "gelu": lambda x: nn.gelu(x, approximate=False),
}


class FeedForward(nn.Module):
    """§3.3 FFN(x) = max(0, x W1 + b1) W2 + b2 (`model.activation` replaces the max; with
    `model.gated_ffn` the activation is multiplied by a second projection x V + c, "wg")."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        cfg = self.config
        dtype = compute_dtype(cfg)
        hidden = _ACTIVATIONS[cfg.activation](_to_hidden(cfg, "wi")(x))
        if cfg.gated_ffn:
            hidden = hidden * _to_hidden(cfg, "wg")(x)
        if train and cfg.activation_dropout_rate > 0:
            dropout = nn.Dropout(rate=cfg.activation_dropout_rate, name="activation_dropout")
            hidden = dropout(hidden, deterministic=False)
        hidden = constrain(hidden, (axes.BATCH, axes.LENGTH, axes.MLP))
        output = nn.Dense(
            cfg.d_model,
            dtype=dtype,
            param_dtype=jnp.float32,
            kernel_init=_partitioned(nn.initializers.xavier_uniform(), (axes.MLP, axes.EMBED)),
            bias_init=_partitioned(nn.initializers.zeros, (axes.EMBED,)),
            name="wo",
        )(hidden)
        return constrain(output, (axes.BATCH, axes.LENGTH, axes.EMBED))


def _to_hidden(config: ModelConfig, name: str) -> nn.Dense:
    """A d_model → d_ff projection of the FFN (W1, or the gate's V)."""
    return nn.Dense(
        config.d_ff,
        dtype=compute_dtype(config),
        param_dtype=jnp.float32,
        kernel_init=_partitioned(nn.initializers.xavier_uniform(), (axes.EMBED, axes.MLP)),
        bias_init=_partitioned(nn.initializers.zeros, (axes.MLP,)),
        name=name,
    )


class ScaleNorm(nn.Module):
    """g · x / ‖x‖ over the features, one learned scalar g started at √d_model (Nguyen &
    Salazar 2019): what LayerNorm does without centring and with one gain for all features."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        start = float(self.config.d_model) ** 0.5
        gain = self.param(
            "scale", _partitioned(nn.initializers.constant(start), ()), (), jnp.float32
        )
        # The norm is taken in float32 even when the model computes in bfloat16.
        x32 = x.astype(jnp.float32)
        norm = jnp.linalg.norm(x32, axis=-1, keepdims=True)
        scaled = x32 * (gain / jnp.maximum(norm, self.config.layer_norm_epsilon))
        return scaled.astype(compute_dtype(self.config))


def norm_layer(config: ModelConfig, name: str | None = None) -> nn.Module:
    """The normalisation `model.norm_type` names: §3.1's LayerNorm, or ScaleNorm."""
    if config.norm_type == "scale":
        return ScaleNorm(config, name=name)
    return nn.LayerNorm(
        epsilon=config.layer_norm_epsilon,
        dtype=compute_dtype(config),
        param_dtype=jnp.float32,
        scale_init=_partitioned(nn.initializers.ones, (axes.EMBED,)),
        bias_init=_partitioned(nn.initializers.zeros, (axes.EMBED,)),
        name=name,
    )
