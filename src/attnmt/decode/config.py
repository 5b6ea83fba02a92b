"""Typed configuration of decoding (the `decode` section of a config file)."""

from __future__ import annotations

import dataclasses

from attnmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 4  # §6.1
    alpha: float = 0.6  # GNMT length penalty ((5 + |Y|) / 6)^α
    max_len_offset: int = 50  # maximum output length = input length + offset (§6.1)
    batch_sentences: int = 64

    def __post_init__(self) -> None:
        for name in ("beam_size", "batch_sentences"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"decode.{name} must be positive, got {getattr(self, name)}")
        if self.alpha < 0 or self.max_len_offset < 0:
            raise ConfigError("decode.alpha and decode.max_len_offset must be ≥ 0")
