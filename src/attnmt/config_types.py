"""Turning a ConfigDict section into a typed, frozen dataclass, naming any bad key."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from attnmt.errors import ConfigError

T = TypeVar("T")


def _accepts(expected: Any, value: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin is typing.Literal:
        return value in typing.get_args(expected)
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    return True


def from_mapping(cls: type[T], values: Mapping[str, Any], section: str) -> T:
    """Builds `cls` from `values`; unknown keys and wrong types raise ConfigError naming
    `section.key`. Range checks live in each dataclass's __post_init__."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        listed = ", ".join(f"{section}.{key}" for key in unknown)
        raise ConfigError(f"unknown config key(s) {listed}; known: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if not _accepts(hints[key], value):
            raise ConfigError(
                f"config key {section}.{key} must be {_describe(hints[key])}, got {value!r}"
            )
    return cls(**dict(values))


def _describe(expected: Any) -> str:
    if typing.get_origin(expected) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(expected))
    return getattr(expected, "__name__", str(expected))


def defaults_of(cls: type) -> dict[str, Any]:
    """The dataclass's default values, for building ConfigDicts from one source of truth."""
    return {f.name: f.default for f in dataclasses.fields(cls)}
