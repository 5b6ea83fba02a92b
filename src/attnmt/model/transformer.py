"""The encoder-decoder Transformer (§3.1): stacks, masks, encode / decode / __call__."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnmt.common import BOS_ID, PAD_ID, axes
from attnmt.config.model import ModelConfig
from attnmt.model.blocks import DecoderLayer, DecoderStack, EncoderLayer, EncoderStack
from attnmt.model.layers import PositionalEncoding, SharedEmbedding, constrain, norm_layer


def padding_mask(query_tokens: jax.Array | None, key_tokens: jax.Array) -> jax.Array:
    """[batch, 1, 1|q_len, kv_len] True where the key is a real token."""
    del query_tokens  # outputs at padded query positions are ignored downstream
    return (key_tokens != PAD_ID)[:, None, None, :]


def causal_mask(length: int) -> jax.Array:
    """[1, 1, length, length] True where key position ≤ query position."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
    """[batch, 1, q_len, kv_len] True where query and key belong to the same example of a
    packed row (segment ids ≥ 1; 0 marks padding, which no query may see)."""
    same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
    return jnp.logical_and(same, (key_segments > 0)[:, None, None, :])


def shift_right(
    tgt_tokens: jax.Array, start_id: int = BOS_ID, tgt_positions: jax.Array | None = None
) -> jax.Array:
    """Decoder input: the start token (BOS) followed by the target without its last
    position. In a packed row every example starts with its own (where its position is 0)."""
    bos = jnp.full((tgt_tokens.shape[0], 1), start_id, dtype=tgt_tokens.dtype)
    shifted = jnp.concatenate([bos, tgt_tokens[:, :-1]], axis=1)
    if tgt_positions is None:
        return shifted
    return jnp.where(tgt_positions == 0, start_id, shifted).astype(tgt_tokens.dtype)


class DecodePosition(nn.Module):
    """Counts decoded positions in the cache so positional encodings line up."""

    @nn.compact
    def __call__(self) -> jax.Array:
        created = not self.has_variable("cache", "position")
        position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        current = position.value
        if not created:
            position.value = current + 1
        return current


class Transformer(nn.Module):
    """Encoder-decoder Transformer with a shared source/target/output embedding.

    `__call__(src_tokens, tgt_tokens)` returns float32 logits [batch, tgt_len, vocab] for
    teacher forcing: position t predicts tgt_tokens[:, t] from tgt_tokens[:, :t]. Packed
    rows (attnmt.common) also pass segment ids and positions: each example then sees
    only itself, exactly as if it had a row of its own.
    Incremental decoding: `encode` once, build the cache with `decode(..., decode=True,
    max_decode_len=L)` under `mutable=["cache"]`, then call `decode` one token at a time.
    """

    config: ModelConfig

    def setup(self) -> None:
        cfg = self.config
        self.embed = SharedEmbedding(cfg)
        self.encoder_positions = PositionalEncoding(cfg)
        self.decoder_positions = PositionalEncoding(cfg)
        if cfg.scan_layers:
            self.encoder_stack = EncoderStack(cfg, name="encoder")
            self.decoder_stack = DecoderStack(cfg, name="decoder")
        else:
            self.encoder_layers = [
                EncoderLayer(cfg, name=f"encoder_{i}") for i in range(cfg.encoder_layers)
            ]
            self.decoder_layers = [
                DecoderLayer(cfg, name=f"decoder_{i}") for i in range(cfg.decoder_layers)
            ]
        self.embedding_dropout = nn.Dropout(rate=cfg.dropout_rate)
        # One mask value per token, shared by its features: a dropped word's embedding is 0.
        self.word_dropout = nn.Dropout(rate=cfg.word_dropout_rate, broadcast_dims=(-1,))
        if cfg.norm_position == "pre":
            # Pre-norm leaves each stack's output un-normalised; one norm closes it.
            self.encoder_norm = norm_layer(cfg)
            self.decoder_norm = norm_layer(cfg)
        self.decode_position = DecodePosition()
        if cfg.final_logits_bias:
            self.logits_bias = self.param(
                "final_logits_bias",
                nn.with_logical_partitioning(nn.initializers.zeros, (axes.VOCAB,)),
                (cfg.vocab_size,),
                jnp.float32,
            )

    def _embed(
        self,
        tokens: jax.Array,
        encoding: PositionalEncoding,
        offset: jax.Array | int,
        train: bool,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        embedded = self.embed(tokens)
        if train and self.config.word_dropout_rate > 0:
            embedded = self.word_dropout(embedded, deterministic=False)
        x = encoding(embedded, offset, positions)
        # §5.4: dropout on the sums of the embeddings and the positional encodings.
        x = self.embedding_dropout(x, deterministic=not train)
        return constrain(x, (axes.BATCH, axes.LENGTH, axes.EMBED))

    def encode(
        self,
        src_tokens: jax.Array,
        *,
        train: bool = False,
        src_segments: jax.Array | None = None,
        src_positions: jax.Array | None = None,
    ) -> jax.Array:
        """[batch, src_len] → encoded [batch, src_len, embed]."""
        x = self._embed(src_tokens, self.encoder_positions, 0, train, src_positions)
        if src_segments is None:
            mask = padding_mask(src_tokens, src_tokens)
        else:
            mask = segment_mask(src_segments, src_segments)
        if self.config.scan_layers:
            x = self.encoder_stack(x, mask, train=train)
        else:
            for layer in self.encoder_layers:
                x = layer(x, mask, train=train)
        if self.config.norm_position == "pre":
            x = self.encoder_norm(x)
        return x

    def decode(
        self,
        encoded: jax.Array,
        src_tokens: jax.Array,
        decoder_input: jax.Array,
        *,
        train: bool = False,
        decode: bool = False,
        max_decode_len: int = 0,
        src_segments: jax.Array | None = None,
        tgt_segments: jax.Array | None = None,
        tgt_positions: jax.Array | None = None,
    ) -> jax.Array:
        """Decoder stack + shared output projection → float32 logits [batch, len, vocab].

        Teacher forcing: `decoder_input` is `shift_right(tgt_tokens)`. Incremental
        (`decode=True`): `decoder_input` is the last emitted token [batch, 1].
        """
        packed = src_segments is not None and tgt_segments is not None
        if packed:
            cross_mask = segment_mask(tgt_segments, src_segments)
        else:
            cross_mask = padding_mask(None, src_tokens)
        if decode and self.config.scan_layers:
            raise ValueError(
                "incremental decoding needs the per-layer parameter layout: convert with "
                "attnmt.model.layout.unstack_layers (model.scan_layers=True stacks them)"
            )
        if decode:
            offset = self.decode_position()
            self_mask = None  # the cache builds the causal mask for its one query
        else:
            offset = 0
            self_mask = self._teacher_forcing_mask(decoder_input, tgt_segments if packed else None)
        x = self._embed(decoder_input, self.decoder_positions, offset, train, tgt_positions)
        x = self._run_decoder(x, encoded, (self_mask, cross_mask), train, decode, max_decode_len)
        return self._output_logits(x)

    # The helpers below only split `decode` up: nowrap keeps them out of Flax's method
    # wrapping, so traces (named scopes, call records) are exactly those of `decode` itself.

    @nn.nowrap
    def _teacher_forcing_mask(
        self, decoder_input: jax.Array, tgt_segments: jax.Array | None
    ) -> jax.Array:
        """Decoder self-attention mask over a whole target: causal, and within each example
        of a packed row (``tgt_segments`` given) or, unless the start token is PAD, over
        real tokens only."""
        length = decoder_input.shape[1]
        self_mask = causal_mask(length)
        if tgt_segments is not None:
            self_mask = jnp.logical_and(self_mask, segment_mask(tgt_segments, tgt_segments))
        elif self.config.decoder_start_id != PAD_ID:
            # (A pad start token, Marian's, must stay visible; the causal mask alone
            # hides the padding after a target from every real position anyway.)
            self_mask = jnp.logical_and(self_mask, padding_mask(None, decoder_input))
        return self_mask

    @nn.nowrap
    def _run_decoder(
        self,
        x: jax.Array,
        encoded: jax.Array,
        masks: tuple[jax.Array | None, jax.Array],
        train: bool,
        decode: bool,
        max_decode_len: int,
    ) -> jax.Array:
        """The decoder layers over embedded targets; ``masks`` = (self, cross)."""
        self_mask, cross_mask = masks
        if self.config.scan_layers:
            return self.decoder_stack(x, encoded, self_mask, cross_mask, train=train)
        for layer in self.decoder_layers:
            x = layer(
                x,
                encoded,
                self_mask,
                cross_mask,
                train=train,
                decode=decode,
                max_decode_len=max_decode_len,
            )
        return x

    @nn.nowrap
    def _output_logits(self, x: jax.Array) -> jax.Array:
        """Decoder states → float32 logits through the shared embedding (§3.4)."""
        if self.config.norm_position == "pre":
            x = self.decoder_norm(x)
        logits = self.embed.attend(x).astype(jnp.float32)
        if self.config.final_logits_bias:
            # Fixed, as in Marian (a buffer there): fine-tuning leaves it as imported.
            logits = logits + jax.lax.stop_gradient(self.logits_bias)
        return constrain(logits, (axes.BATCH, axes.LENGTH, axes.VOCAB))

    def __call__(
        self,
        src_tokens: jax.Array,
        tgt_tokens: jax.Array,
        *,
        train: bool = False,
        src_segments: jax.Array | None = None,
        tgt_segments: jax.Array | None = None,
        src_positions: jax.Array | None = None,
        tgt_positions: jax.Array | None = None,
    ) -> jax.Array:
        if (src_segments is None) != (tgt_segments is None):
            raise ValueError("a packed batch needs segment ids on both sides")
        encoded = self.encode(
            src_tokens, train=train, src_segments=src_segments, src_positions=src_positions
        )
        decoder_input = shift_right(tgt_tokens, self.config.decoder_start_id, tgt_positions)
        return self.decode(
            encoded,
            src_tokens,
            decoder_input,
            train=train,
            src_segments=src_segments,
            tgt_segments=tgt_segments,
            tgt_positions=tgt_positions,
        )
