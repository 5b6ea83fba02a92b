"""Helpers for config files: the full default ConfigDict and the paper's variants.

Defaults come from the typed dataclasses, so there is one source of truth for each key.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from attnmt.config_types import defaults_of
from attnmt.errors import ConfigError
from attnmt.experiment import section_types
from attnmt.overrides import set_value
from attnmt.variants import variant_overrides


def base_config() -> ml_collections.ConfigDict:
    """Every key with its default (the base model of the paper, trained on WMT'14 En-De)."""
    config = ml_collections.ConfigDict()
    for section, cls in section_types().items():
        config[section] = ml_collections.ConfigDict(defaults_of(cls))
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> None:
    """Sets typed values by dotted key (attnmt.overrides), refusing unknown keys."""
    for dotted, value in overrides.items():
        set_value(config, dotted, value)


def apply_variant(config: ml_collections.ConfigDict, variant: str, language_pair: str) -> None:
    try:
        overrides = variant_overrides(variant, language_pair)
    except KeyError as error:
        raise ConfigError(str(error.args[0])) from None
    apply_overrides(config, overrides)


def parse_config_arg(arg: str | None, **defaults: Any) -> dict[str, Any]:
    """Parses the `:a=1,b=x` suffix of `--config file.py:a=1,b=x` into typed values.

    The types are those of `defaults`; an unknown name is refused.
    """
    values = dict(defaults)
    if not arg:
        return values
    for item in arg.split(","):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep and "variant" in defaults and len(arg.split(",")) == 1:
            name, raw = "variant", item  # `file.py:big` means variant=big
        if name not in defaults:
            raise ConfigError(f"unknown config argument {name!r}; known: {', '.join(defaults)}")
        values[name] = _parse_like(defaults[name], raw.strip(), name)
    return values


def _parse_like(example: Any, raw: str, name: str) -> Any:
    if isinstance(example, bool):
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise ConfigError(f"config argument {name} must be true/false, got {raw!r}")
    if isinstance(example, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"config argument {name} must be an integer, got {raw!r}") from None
    return raw


def shrink_for_cpu(config: ml_collections.ConfigDict) -> None:
    """The "runlocal" switch: any config becomes a model and batch a laptop CPU trains."""
    apply_overrides(
        config,
        {
            "model.d_model": 64,
            "model.d_ff": 128,
            "model.num_heads": 4,
            "model.d_k": 16,
            "model.d_v": 16,
            "model.num_layers": 2,
            "model.vocab_size": 2000,
            "data.tokens_per_batch": 1024,
            "data.max_length": 64,
            "data.vocab_max_sentences": 50_000,
            "optim.warmup_steps": 100,
            "train.num_steps": 200,
            "train.log_every_steps": 10,
            "train.eval_every_steps": 100,
            "train.checkpoint_every_steps": 100,
        },
    )


WMT14 = {
    # pair: (TFDS name, target language, vocabulary size, sentencepiece model) — §5.1
    "en-de": ("wmt14_translate/de-en", "de", 37_000, "bpe"),  # shared BPE
    "en-fr": ("wmt14_translate/fr-en", "fr", 32_000, "unigram"),  # word pieces
}


def wmt14_config(pair: str, arg: str | None) -> ml_collections.ConfigDict:
    """WMT 2014 English→German or English→French with the paper's variants (§5.1, Table 3).

    `arg`: variant = base | big | A1..E, runlocal = true (shrink for a CPU smoke run).
    """
    args = parse_config_arg(arg, variant="base", runlocal=False)
    name, target, vocab_size, model_type = WMT14[pair]
    config = base_config()
    config.data.source = "tfds"
    config.data.tfds_name = name
    config.data.src_lang = "en"
    config.data.tgt_lang = target
    config.data.train_split = "train"
    config.data.eval_split = "validation"  # newstest2013, the Table 3 dev set
    config.data.test_split = "test"  # newstest2014
    config.model.vocab_size = vocab_size
    config.data.vocab_model_type = model_type
    # The paper's ≈25k-token update at any device count: accumulated when the devices hold
    # fewer than 4,096 tokens per side each at once (8 devices hold it in one step, as the
    # paper's 8 P100s did). Batch sizes in multiples of 16 keep the data order the same on
    # 1 to 16 devices.
    config.data.batch_multiple = 16
    config.train.max_tokens_per_device = 4096
    apply_variant(config, args["variant"], pair)
    if args["runlocal"]:
        shrink_for_cpu(config)
    return config
