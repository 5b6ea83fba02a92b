"""Loading `--config path.py[:arg]` and applying `--config.a.b=value` overrides."""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections

from attnmt.errors import ConfigError

OVERRIDE_PREFIX = "--config."


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Runs get_config(arg) of a config file given as `path.py` or `path.py:arg`."""
    path_text, _, arg = spec.partition(":")
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
    """Applies `--config.section.key=value` (or `--config.section.key value` pairs already
    joined by the caller). Values are parsed as the type the key already has."""
    for item in overrides:
        if not item.startswith(OVERRIDE_PREFIX) or "=" not in item:
            raise ConfigError(f"cannot read override {item!r}; write --config.section.key=value")
        dotted, _, raw = item[len(OVERRIDE_PREFIX) :].partition("=")
        parent, leaf = _resolve(config, dotted)
        parent[leaf] = _parse_value(parent[leaf], raw, dotted)
    return config


def _resolve(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    *sections, leaf = dotted.split(".")
    node = config
    walked = []
    for name in sections:
        walked.append(name)
        if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
            raise ConfigError(_unknown(".".join(walked), list(node.keys())))
        node = node[name]
    if leaf not in node:
        raise ConfigError(_unknown(dotted, [f"{'.'.join(sections)}.{k}" for k in node]))
    return node, leaf


def _unknown(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown config key {key!r}{hint}"


def _parse_value(current: Any, raw: str, key: str) -> Any:
    try:
        if isinstance(current, bool):
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            return lowered in ("true", "1")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
    except ValueError:
        kind = type(current).__name__
        raise ConfigError(f"config key {key} expects {kind}, got {raw!r}") from None
    return raw
