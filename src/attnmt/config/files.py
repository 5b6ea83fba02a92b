"""Config files: running `get_config(arg)` of `path.py[:arg]`, and the one loader from a
config file plus overrides to a validated Experiment."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections

from attnmt.config.experiment import Experiment
from attnmt.config.overrides import Overrides, apply_overrides
from attnmt.errors import ConfigError
from attnmt.storage import is_remote


def load_experiment(spec: str, overrides: Overrides = ()) -> Experiment:
    """`spec` = `path.py` or `path.py:arg` → its ConfigDict, with `overrides` applied
    (`{"model.d_ff": 1024}` or `["--config.model.d_ff=1024"]`), validated."""
    config = load_config_file(spec)
    apply_overrides(config, overrides)
    return Experiment.from_mapping(config)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Runs get_config(arg) of a config file given as `path.py` or `path.py:arg`."""
    path_text, _, arg = spec.partition(":")
    if is_remote(spec):  # `gs://b/c.py` would split at its own colon
        raise ConfigError(f"config file {spec!r} must be a local file (it is imported as Python)")
    module = load_config_module(path_text)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path_text!r} defines no get_config(arg)")
    config = module.get_config(arg or None)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config in {path_text!r} must return an ml_collections.ConfigDict")
    return config


def load_config_module(path_text: str | Path) -> types.ModuleType:
    """Imports a config file as a module (also how one recipe builds on a sibling file)."""
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"config file {str(path_text)!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"attnmt_config_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"config file {str(path_text)!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as error:
        raise ConfigError(f"config file {str(path_text)!r} failed to load: {error}") from error
    return module
