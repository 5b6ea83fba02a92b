"""A Hugging Face MarianConfig (config.json) as attnmt model options, and back.

Every key that changes what a Marian model computes is either translated into a
`model.*` option or refused with its name: attnmt never imports a checkpoint it would
compute differently.
"""

from __future__ import annotations

from typing import Any

from attnmt.config.model import ModelConfig
from attnmt.errors import ConfigError

# Keys (with the value attnmt supports) that Hugging Face's MarianMTModel ignores, kept by
# older conversions from other BART-like models: a checkpoint setting another value was
# trained as a different architecture than the one Hugging Face (and attnmt) computes.
_IGNORED_BY_HF = {
    "normalize_before": False,  # pre-norm; MarianMTModel is post-norm whatever this says
    "normalize_embedding": False,  # a LayerNorm on the embeddings (layernorm_embedding)
    "add_final_layer_norm": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,  # learned positions otherwise
    "layernorm_embedding": False,
}
_TRAINING_ONLY_ZERO = ("encoder_layerdrop", "decoder_layerdrop")
_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
HF_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which MarianMTModel uses


def _refuse(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"config.json: {key}={value!r} is not supported: {why}")


# Integer keys read from config.json: sizes (positive; the first five are required) and
# token ids (≥ 0), so that a malformed value is named rather than failing deep inside.
_REQUIRED_SIZES = ("vocab_size", "d_model", "encoder_layers", "encoder_attention_heads")
_REQUIRED_SIZES += ("encoder_ffn_dim",)
_OPTIONAL_SIZES = ("decoder_layers", "decoder_attention_heads", "decoder_ffn_dim")
_OPTIONAL_SIZES += ("max_position_embeddings",)
_TOKEN_IDS = ("pad_token_id", "decoder_start_token_id", "forced_eos_token_id")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_types(hf: dict[str, Any]) -> None:
    for key in _REQUIRED_SIZES:
        if key not in hf:
            raise ConfigError(f"config.json: {key} is missing (every MarianConfig has it)")
    for key in (*_REQUIRED_SIZES, *_OPTIONAL_SIZES):
        value = hf.get(key)
        if key in hf and not (_is_int(value) and value > 0):
            raise _refuse(key, value, "a positive integer is expected")
    if not _is_int(hf.get("eos_token_id", 0)):
        raise _refuse("eos_token_id", hf["eos_token_id"], "one end-of-sentence token only")
    for key in (*_TOKEN_IDS, "eos_token_id"):
        value = hf.get(key)
        if value is not None and not (_is_int(value) and 0 <= value < hf["vocab_size"]):
            raise _refuse(key, value, f"a token id below vocab_size={hf['vocab_size']} expected")


def _decoder_depth(hf: dict[str, Any]) -> int:
    """model.num_decoder_layers: 0 (= num_layers) where both stacks are equally deep."""
    depth = hf.get("decoder_layers", hf["encoder_layers"])
    return 0 if depth == hf["encoder_layers"] else depth


def check_importable(hf: dict[str, Any]) -> None:
    """Refuses, naming the key, a config.json whose model attnmt would not compute alike
    (or cannot read): called before anything else of the checkpoint is read."""
    _check_types(hf)
    _check_supported(hf)


def _check_supported(hf: dict[str, Any]) -> None:
    if hf.get("model_type") != "marian":
        raise _refuse("model_type", hf.get("model_type"), "only Marian (opus-mt) models import")
    for key, wanted in _IGNORED_BY_HF.items():
        if key in hf and hf[key] != wanted:
            raise _refuse(key, hf[key], "Hugging Face's MarianMTModel does not compute it")
    for key in _TRAINING_ONLY_ZERO:
        if hf.get(key, 0) not in (0, 0.0):
            raise _refuse(key, hf[key], "attnmt has no layer drop")
    pairs = (
        ("decoder_attention_heads", "encoder_attention_heads", "different head counts"),
        ("decoder_ffn_dim", "encoder_ffn_dim", "different feed-forward widths"),
    )
    for key, other, why in pairs:
        if hf.get(key, hf.get(other)) != hf.get(other):
            raise _refuse(key, hf[key], f"{why} ({other}={hf.get(other)!r})")
    vocab = hf["vocab_size"]
    if hf.get("decoder_vocab_size") not in (None, vocab):
        raise _refuse("decoder_vocab_size", hf["decoder_vocab_size"], "separate target vocab")
    for key in ("share_encoder_decoder_embeddings", "tie_word_embeddings"):
        if not hf.get(key, True):
            raise _refuse(key, hf[key], "attnmt ties source, target and output embeddings")
    if hf.get("activation_function", "gelu") not in _ACTIVATIONS:
        raise _refuse("activation_function", hf["activation_function"], "unknown activation")
    if hf["d_model"] % hf["encoder_attention_heads"]:
        raise _refuse("d_model", hf["d_model"], "not a multiple of encoder_attention_heads")
    if hf.get("forced_eos_token_id") not in (None, hf.get("eos_token_id", 0)):
        raise _refuse("forced_eos_token_id", hf["forced_eos_token_id"], "it is not eos")


def model_options(hf: dict[str, Any], decoder_start_id: int) -> dict[str, Any]:
    """`model.*` values reproducing the MarianMTModel of `hf` (config.json as a dict), once
    its vocabulary is in attnmt's order (`decoder_start_id` in that order)."""
    check_importable(hf)
    heads = hf["encoder_attention_heads"]
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["d_model"],
        "d_ff": hf["encoder_ffn_dim"],
        "num_heads": heads,
        "d_k": hf["d_model"] // heads,
        "d_v": hf["d_model"] // heads,
        "num_layers": hf["encoder_layers"],
        "num_decoder_layers": _decoder_depth(hf),
        "dropout_rate": float(hf.get("dropout", 0.1)),
        "attention_dropout_rate": float(hf.get("attention_dropout", 0.0)),
        "activation_dropout_rate": float(hf.get("activation_dropout", 0.0)),
        "positional": "sinusoidal",
        "positional_layout": "halves",
        "max_length": hf.get("max_position_embeddings", 1024),
        "norm_position": "post",
        "activation": _ACTIVATIONS[hf.get("activation_function", "gelu")],
        "scale_embedding": bool(hf.get("scale_embedding", False)),
        "attention_bias": True,
        "final_logits_bias": True,
        "layer_norm_epsilon": HF_LAYER_NORM_EPSILON,
        "decoder_start_id": decoder_start_id,
    }


def check_exportable(model: ModelConfig) -> None:
    """Refuses, naming the key, a model MarianMTModel cannot compute."""
    required = (
        ("positional", "sinusoidal", "MarianMTModel has sinusoidal positions only"),
        ("positional_layout", "halves", "MarianMTModel's sinusoids are sines then cosines"),
        ("norm_position", "post", "MarianMTModel is post-norm"),
        ("norm_type", "layer", "MarianMTModel normalises with LayerNorm"),
        ("layer_norm_epsilon", HF_LAYER_NORM_EPSILON, "MarianMTModel's LayerNorm uses 1e-5"),
        ("gated_ffn", False, "MarianMTModel's FFN has no gate"),
        ("qk_norm", False, "MarianMTModel's attention divides by √d_k, without QKNorm"),
    )
    for key, wanted, why in required:
        if getattr(model, key) != wanted:
            raise ConfigError(
                f"cannot export: model.{key}={getattr(model, key)!r} ({why}; needs {wanted!r})"
            )
    problem = head_size_problem(model)
    if problem:
        raise ConfigError(f"cannot export: {problem}")


def head_size_problem(model: ModelConfig) -> str | None:
    """Why MarianMTModel cannot hold `model`'s attention heads (it requires
    d_k = d_v = d_model / num_heads), or None when it can."""
    head_dim = model.d_model // model.num_heads
    if model.d_model % model.num_heads or (model.d_k, model.d_v) != (head_dim, head_dim):
        return (
            f"model.d_k={model.d_k}, model.d_v={model.d_v} must both be "
            f"model.d_model / model.num_heads = {model.d_model / model.num_heads:g}"
        )
    return None


def marian_kwargs(
    model: ModelConfig,
    *,
    pad_id: int,
    eos_id: int,
    decoder_start_id: int,
    forced_eos_id: int | None,
    max_positions: int | None = None,
) -> dict[str, Any]:
    """MarianConfig keyword arguments (config.json keys) of the MarianMTModel with `model`'s
    sizes, activation, dropout and embedding scale, one embedding matrix shared by encoder,
    decoder and output. The token ids are the caller's: export writes Marian's vocabulary
    layout, the benchmark peer keeps attnmt's. `max_positions` defaults to model.max_length.
    Checks nothing: check_exportable says whether the Marian model computes alike."""
    return {
        "vocab_size": model.vocab_size,
        "decoder_vocab_size": model.vocab_size,
        "d_model": model.d_model,
        "encoder_layers": model.encoder_layers,
        "decoder_layers": model.decoder_layers,
        "encoder_attention_heads": model.num_heads,
        "decoder_attention_heads": model.num_heads,
        "encoder_ffn_dim": model.d_ff,
        "decoder_ffn_dim": model.d_ff,
        "activation_function": model.activation,
        "dropout": model.dropout_rate,
        "attention_dropout": model.attention_dropout_rate,
        "activation_dropout": model.activation_dropout_rate,
        "max_position_embeddings": model.max_length if max_positions is None else max_positions,
        "scale_embedding": model.scale_embedding,
        "pad_token_id": pad_id,
        "eos_token_id": eos_id,
        "forced_eos_token_id": forced_eos_id,
        "decoder_start_token_id": decoder_start_id,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
    }


def hf_config(model: ModelConfig, marian_start: int) -> dict[str, Any]:
    """config.json of the MarianMTModel computing `model` (vocabulary in Marian's layout:
    eos 0, pad last; `marian_start` the decoder start's id there)."""
    pad = model.vocab_size - 1
    mapping = marian_kwargs(
        model, pad_id=pad, eos_id=0, decoder_start_id=marian_start, forced_eos_id=0
    )
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        **mapping,
        "is_encoder_decoder": True,
    }
