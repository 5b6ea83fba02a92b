"""Turning a mapping into a typed, frozen section dataclass, naming any bad key.

Types (including `Literal` choices) are read from each dataclass's type hints and checked
once, by `check_types` at the start of its `__post_init__`, whether the section was built
from a config file or in Python; range and consistency rules follow it there.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from attnmt.errors import ConfigError

T = TypeVar("T")


def from_mapping(cls: type[T], values: Mapping[str, Any], section: str) -> T:
    """Builds `cls` from `values`; an unknown key raises ConfigError naming `section.key`
    (types and ranges are checked by the dataclass itself)."""
    known = _hints(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        listed = ", ".join(f"{section}.{key}" for key in unknown)
        raise ConfigError(f"unknown config key(s) {listed}; known: {', '.join(sorted(known))}")
    return cls(**dict(values))


def check_types(instance: Any, section: str) -> None:
    """Raises ConfigError naming `section.key` for the first field whose value does not
    have the type its hint says (one of the choices, for a `Literal`)."""
    for key, expected in _hints(type(instance)).items():
        value = getattr(instance, key)
        if not _accepts(expected, value):
            raise ConfigError(
                f"config key {section}.{key} must be {_describe(expected)}, got {value!r}"
            )


def defaults_of(cls: type) -> dict[str, Any]:
    """The dataclass's default values, for building ConfigDicts from one source of truth."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _accepts(expected: Any, value: Any) -> bool:
    if typing.get_origin(expected) is typing.Literal:
        return any(
            _same_kind(value, choice) and value == choice for choice in typing.get_args(expected)
        )
    if isinstance(value, bool) or expected is bool:
        return expected is bool and isinstance(value, bool)
    if expected is int:
        return isinstance(value, numbers.Integral)
    if expected is float:
        return isinstance(value, numbers.Real)
    if expected is str:
        return isinstance(value, str)
    return True


def _same_kind(value: Any, choice: Any) -> bool:
    """True == 1 and 1.0 == 1 in Python; a choice of -1…3 must still refuse them."""
    return type(value) is type(choice) or (
        isinstance(choice, int)
        and isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
    )


def _describe(expected: Any) -> str:
    if typing.get_origin(expected) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(expected))
    return getattr(expected, "__name__", str(expected))
