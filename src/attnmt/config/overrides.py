"""Dotted config keys, in one place: reading `--config.a.b=value` (or `--config.a.b value`)
off a command line, reading a value's text as the type its key has, and setting `a.b` in a
ConfigDict with a message that names an unknown key and the nearest known ones. The CLI,
config files (their `:arg` suffix and variants), bench and the launchers all use it, so a
key and a value's text mean the same everywhere."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from attnmt.errors import ConfigError

OVERRIDE_PREFIX = "--config."
Overrides = Mapping[str, Any] | Sequence[str]  # {"a.b": value} or ["--config.a.b=value", …]


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


def as_mapping(overrides: Overrides) -> Mapping[str, Any]:
    """Overrides as dotted key → value, from a mapping or from `--config.a.b=v` items."""
    if isinstance(overrides, Mapping):
        return overrides
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides must be a list of --config.key=value items, got {overrides!r}"
        )
    rest, parsed = split_overrides(overrides)
    if rest:
        raise ConfigError(f"cannot read override {rest[0]!r}; write --config.section.key=value")
    return parsed


def apply_overrides(config: ml_collections.ConfigDict, overrides: Overrides) -> None:
    """Sets each dotted key, refusing keys the config does not have. Text is read as the
    type the key already has (`parse_text`); any other value is set as it is (and checked
    when the config becomes an Experiment)."""
    for dotted, value in as_mapping(overrides).items():
        parent, leaf = resolve(config, dotted)
        parent[leaf] = (
            parse_text(parent[leaf], value, f"config key {dotted}")
            if isinstance(value, str)
            else value
        )


def only_section(command: str, overrides: Mapping[str, Any], section: str | None) -> None:
    """Refuses overrides a command would otherwise ignore (all of them, for section None),
    naming the key."""
    for key in overrides:
        if section is None or not key.startswith(f"{section}."):
            what = f"only --config.{section}.* overrides" if section else "no --config overrides"
            raise ConfigError(
                f"attnmt {command} takes {what}, got --config.{key} (the rest of the "
                "config is the trained run's own)"
            )


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


def parse_text(example: Any, raw: str, what: str) -> Any:
    """`raw` read as the type of `example`: a bool from true/false/yes/no/1/0, an int, a
    float, or the text itself. The one reader of values typed on a command line; `what`
    names the value in the error ("config key model.d_ff")."""
    try:
        if isinstance(example, bool):
            lowered = raw.strip().lower()
            if lowered in ("true", "yes", "1"):
                return True
            if lowered in ("false", "no", "0"):
                return False
            raise ValueError
        if isinstance(example, int):
            return int(raw)
        if isinstance(example, float):
            return float(raw)
    except ValueError:
        kind = "true/false" if isinstance(example, bool) else type(example).__name__
        raise ConfigError(f"{what} expects {kind}, got {raw!r}") from None
    return raw


def _unknown(key: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown config key {key!r}{hint}"
