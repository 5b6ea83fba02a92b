"""Dotted config keys, in one place: reading `--config.a.b=value` (or `--config.a.b value`)
off a command line, and setting `a.b` in a ConfigDict with a message that names an unknown
key and the nearest known ones. The CLI, config files (variants) and the launchers all use
it, so a key means the same everywhere."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from attnmt.errors import ConfigError

OVERRIDE_PREFIX = "--config."


def split_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Separates the overrides (dotted key → raw text, the last one winning) from the other
    arguments. They are taken out before argparse sees them, which would treat them as
    unknown options (or, in the two-word form, as a stray positional)."""
    rest: list[str] = []
    overrides: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith(OVERRIDE_PREFIX):
            rest.append(item)
            i += 1
            continue
        key, sep, value = item[len(OVERRIDE_PREFIX) :].partition("=")
        if not sep:
            if i + 1 >= len(items):
                raise ConfigError(f"{item} needs a value: {item}=VALUE")
            i += 1
            value = items[i]
        if not key:
            raise ConfigError(f"cannot read override {item!r}; write --config.section.key=value")
        overrides[key] = value
        i += 1
    return rest, overrides


def resolve(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    """(the ConfigDict holding `dotted`'s last part, that part); ConfigError if unknown."""
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


def set_value(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
    """config["a.b"] = value (already typed), refusing keys the config does not have."""
    parent, leaf = resolve(config, dotted)
    parent[leaf] = value


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, str]) -> None:
    """Sets each dotted key from its command-line text, read as the type the key has."""
    for dotted, raw in overrides.items():
        parent, leaf = resolve(config, dotted)
        parent[leaf] = _parse_value(parent[leaf], raw, dotted)


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
