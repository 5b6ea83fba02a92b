"""Typed, validated model configuration (the paper's §3, "Model Architecture")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from attnmt.common import BOS_ID, NUM_SPECIAL_TOKENS
from attnmt.config.typed import check_types, from_mapping
from attnmt.errors import ConfigError

Positional = Literal["sinusoidal", "learned"]
DType = Literal["float32", "bfloat16"]
NormPosition = Literal["post", "pre"]
NormType = Literal["layer", "scale"]
PositionalLayout = Literal["interleaved", "halves"]
Activation = Literal["relu", "swish", "gelu"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and switches of the encoder-decoder Transformer.

    `d_k` and `d_v` are independent of `d_model / num_heads`: Table 3 row (B) changes d_k
    alone, so nothing here derives one from the others.
    """

    vocab_size: int = 37_000
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int = 64
    d_v: int = 64
    num_layers: int = 6  # N, in both the encoder and the decoder stack
    # >0: this stack's own depth instead of num_layers (not in the paper: a deep encoder
    # with a shallow decoder, Kasai et al. 2021, decodes faster at similar quality; fairseq's
    # and Marian's encoder_layers / decoder_layers). 0 = num_layers.
    num_encoder_layers: int = 0
    num_decoder_layers: int = 0
    dropout_rate: float = 0.1  # §5.4 residual dropout P_drop
    attention_dropout_rate: float = 0.0  # on attention weights; §6.3 tunes it
    # Dropout on the FFN's hidden activations, between W1's activation and W2 (not in the
    # paper: tensor2tensor's relu_dropout, fairseq's and Marian's activation_dropout).
    # 0 = off, and then the model is exactly the paper's.
    activation_dropout_rate: float = 0.0
    # Word dropout (not in the paper; Sennrich & Zhang 2019 for small data): in training,
    # each source and decoder-input token's whole embedding is zeroed with this probability
    # (the rest scaled by 1/(1-p)) before the positions are added, so the model must do
    # without some words. 0 = off, and then the model is exactly the paper's.
    word_dropout_rate: float = 0.0
    positional: Positional = "sinusoidal"  # "learned" is Table 3 row (E)
    max_length: int = 256  # longest position a learned embedding covers
    share_embeddings: bool = True  # §3.4: one matrix for source, target and pre-softmax
    dtype: DType = "float32"  # compute dtype; parameters always stay float32
    # "post" is §3.1's LayerNorm(x + Sublayer(x)); "pre" is x + Sublayer(LayerNorm(x)) with a
    # final LayerNorm per stack (tensor2tensor's later default): same parameters plus two
    # norms, and it trains faster early on, which matters when compute is scarce.
    norm_position: NormPosition = "post"
    # "layer" is §3.1's LayerNorm (a gain and a bias per feature). "scale" is ScaleNorm
    # (Nguyen & Salazar 2019, "Transformers without Tears"; not in the paper):
    # g · x / ‖x‖ with one learned scalar g per norm, started at √d_model, reported to help
    # pre-norm models on small corpora. The choice holds for every norm in the model.
    norm_type: NormType = "layer"
    # QKNorm (Henry et al. 2020, "Query-Key Normalization for Transformers"; not in the
    # paper): every head's query and key are scaled to unit length and their dot product is
    # multiplied by one learned scalar g per attention layer instead of divided by √d_k, so
    # no logit can exceed g and the softmax cannot saturate by growth of q and k alone.
    # False = §3.2.1's scaled dot product.
    qk_norm: bool = False
    # QKNorm's g at initialisation. Henry et al. start it at log2(L² − L), L the 97.5th
    # percentile of the training sequences' lengths in tokens: Multi30K's, with EOS and 6,000
    # joint BPE pieces, are 27 (English) and 34 (French), giving 9.5 and 10.1; L = 90 gives 13.
    qk_norm_gain: float = 10.0
    # Run each stack as one nn.scan over stacked layer parameters: the train step is traced
    # and compiled once per stack instead of once per layer. Same function and parameter
    # count; decoding converts to the per-layer layout (attnmt.model.layout).
    scan_layers: bool = False
    # Options that let an imported Marian (Hugging Face opus-mt) model compute exactly what it
    # computed there (attnmt.interop); the defaults are the paper's model.
    # "interleaved": §3.5's sin/cos alternate by dimension; "halves": all sines, then all
    # cosines of the same frequencies (Marian's layout).
    positional_layout: PositionalLayout = "interleaved"
    activation: Activation = "relu"  # the FFN's non-linearity: §3.3 ReLU; opus-mt uses swish
    # A gated FFN (Shazeer 2020, "GLU Variants Improve Transformer"; not in the paper):
    # FFN(x) = (act(x W1 + b1) ⊙ (x V + c)) W2 + b2 with a third d_model × d_ff matrix V, so
    # relu / swish / gelu give ReGLU / SwiGLU / GEGLU. At equal parameters and FLOPs d_ff
    # shrinks to 2/3. False = §3.3's FFN.
    gated_ffn: bool = False
    scale_embedding: bool = True  # §3.4 multiplies embeddings by √d_model
    attention_bias: bool = False  # biases on the Q, K, V and output projections
    final_logits_bias: bool = False  # a fixed (never trained) bias added to the logits
    layer_norm_epsilon: float = 1e-6
    # The decoder's first input. When it equals the pad id (0), as in Marian, the decoder's
    # self-attention masks by causality alone, since its first key is then a pad token.
    decoder_start_id: int = BOS_ID
    # Hold the pad token's embedding row at zero (never trained): Marian's padding_idx, whose
    # zero row starts its decoder; CTranslate2 relies on that row being zero.
    zero_pad_embedding: bool = False

    def __post_init__(self) -> None:
        check_types(self, "model")
        for name in (
            "vocab_size",
            "d_model",
            "d_ff",
            "num_heads",
            "d_k",
            "d_v",
            "num_layers",
            "max_length",
        ):
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"model.{name} must be ≥ 0 (0 = model.num_layers), got {getattr(self, name)!r}"
                )
        rates = ("dropout_rate", "attention_dropout_rate", "activation_dropout_rate")
        for name in (*rates, "word_dropout_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {value!r}")
        if self.vocab_size <= NUM_SPECIAL_TOKENS:
            raise ConfigError(
                f"model.vocab_size={self.vocab_size} leaves no room beyond the "
                f"{NUM_SPECIAL_TOKENS} special tokens (pad, eos, bos, unk)"
            )
        if not self.qk_norm_gain > 0:
            raise ConfigError(f"model.qk_norm_gain must be positive, got {self.qk_norm_gain!r}")
        self._check_interop_options()
        if not self.share_embeddings:
            raise ConfigError(
                "model.share_embeddings=False is not supported: the paper ties source, target "
                "and output embeddings over one shared vocabulary"
            )

    @property
    def encoder_layers(self) -> int:
        """The encoder's depth: model.num_encoder_layers, or N."""
        return self.num_encoder_layers or self.num_layers

    @property
    def decoder_layers(self) -> int:
        """The decoder's depth: model.num_decoder_layers, or N."""
        return self.num_decoder_layers or self.num_layers

    def depth_settings(self) -> str:
        """The depth as the keys that set it, for messages: "model.num_layers=6", or with
        ", model.num_decoder_layers=1" (and the like) where a stack has its own."""
        keys = ["num_layers", "num_encoder_layers", "num_decoder_layers"]
        return ", ".join(f"model.{k}={getattr(self, k)}" for k in keys if getattr(self, k))

    def stack_depth(self, stack: str) -> int:
        """The depth of "encoder" or "decoder"."""
        return {"encoder": self.encoder_layers, "decoder": self.decoder_layers}[stack]

    def _check_interop_options(self) -> None:
        if self.layer_norm_epsilon <= 0:
            raise ConfigError(
                f"model.layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}"
            )
        start = self.decoder_start_id
        if not 0 <= start < self.vocab_size:
            raise ConfigError(
                f"model.decoder_start_id must be an id below model.vocab_size, got {start!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a (ConfigDict) mapping, naming any unknown or mistyped key."""
        return from_mapping(cls, values, "model")
