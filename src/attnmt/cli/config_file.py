"""Loading `--config path.py[:arg]` and applying `--config.a.b=value` overrides."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from attnmt.errors import ConfigError
from attnmt.overrides import apply_overrides, split_overrides
from attnmt.storage import is_remote


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Runs get_config(arg) of a config file given as `path.py` or `path.py:arg`."""
    path_text, _, arg = spec.partition(":")
    if is_remote(spec):  # `gs://b/c.py` would split at its own colon
        raise ConfigError(f"config file {spec!r} must be a local file (it is imported as Python)")
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"config file {path_text!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"attnmt_config_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"config file {path_text!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as error:
        raise ConfigError(f"config file {path_text!r} failed to load: {error}") from error
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path_text!r} defines no get_config(arg)")
    config = module.get_config(arg or None)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config in {path_text!r} must return an ml_collections.ConfigDict")
    return config


def apply_command_line_overrides(
    config: ml_collections.ConfigDict, overrides: Sequence[str]
) -> ml_collections.ConfigDict:
    """Applies `--config.section.key=value` items (see attnmt.overrides). Values are read as
    the type the key already has."""
    rest, parsed = split_overrides(overrides)
    if rest:
        raise ConfigError(f"cannot read override {rest[0]!r}; write --config.section.key=value")
    apply_overrides(config, parsed)
    return config
