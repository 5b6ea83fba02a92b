"""What config files build on: the full default ConfigDict, the `:a=1,b=x` argument of a
config file, the paper's variants, and the "runlocal" shrink for a CPU.

Defaults come from the typed dataclasses, so there is one source of truth for each key.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from attnmt.config.experiment import section_types
from attnmt.config.overrides import apply_overrides, parse_text
from attnmt.config.typed import defaults_of
from attnmt.config.variants import variant_overrides
from attnmt.errors import ConfigError


def base_config() -> ml_collections.ConfigDict:
    """Every key with its default (the base model of the paper, trained on WMT'14 En-De)."""
    config = ml_collections.ConfigDict()
    for section, cls in section_types().items():
        config[section] = ml_collections.ConfigDict(defaults_of(cls))
    return config


def apply_variant(config: ml_collections.ConfigDict, variant: str, language_pair: str) -> None:
    """The overrides of `variant` (base, big, A1..E of Table 3; attnmt/config/variants.py)."""
    try:
        overrides = variant_overrides(variant, language_pair)
    except KeyError as error:
        raise ConfigError(str(error.args[0])) from None
    apply_overrides(config, overrides)


def parse_config_arg(arg: str | None, **defaults: Any) -> dict[str, Any]:
    """Parses the `:a=1,b=x` suffix of `--config file.py:a=1,b=x` into typed values.

    The types are those of `defaults` (read as `--config.*` values are); an unknown name is
    refused. `file.py:big` alone means variant=big where `variant` is an argument.
    """
    values = dict(defaults)
    if not arg:
        return values
    items = arg.split(",")
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep and "variant" in defaults and len(items) == 1:
            name, raw = "variant", item
        if name not in defaults:
            raise ConfigError(f"unknown config argument {name!r}; known: {', '.join(defaults)}")
        values[name] = parse_text(defaults[name], raw.strip(), f"config argument {name}")
    return values


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
