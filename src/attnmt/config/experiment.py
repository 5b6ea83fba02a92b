"""One typed bundle of every section of a config, validated before anything compiles.

Each section checks its own keys (attnmt/config/typed.py, then its __post_init__); the rules
that span two sections live here."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from attnmt.config.data import DataConfig
from attnmt.config.decode import DecodeConfig
from attnmt.config.model import ModelConfig
from attnmt.config.parallel import ParallelConfig
from attnmt.config.train import OptimConfig, TrainConfig
from attnmt.config.typed import from_mapping
from attnmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Experiment:
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    decode: DecodeConfig
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> Experiment:
        """Validates a ConfigDict (or nested dict): unknown sections/keys, types, ranges."""
        config = _to_dict(config)
        sections = section_types()
        unknown = sorted(set(config) - set(sections))
        if unknown:
            raise ConfigError(
                f"unknown config section(s) {', '.join(unknown)}; known: {', '.join(sections)}"
            )
        parts = {
            name: from_mapping(cls, config.get(name, {}), name) for name, cls in sections.items()
        }
        experiment = cls(**parts)
        experiment._check_consistency()
        return experiment

    def _check_consistency(self) -> None:
        if self.model.positional == "learned" and self.model.max_length < self.data.max_length:
            raise ConfigError(
                f"model.max_length={self.model.max_length} is shorter than "
                f"data.max_length={self.data.max_length}: learned positions would run out"
            )
        if self.data.tokens_per_batch < self.data.batch_multiple * self.data.min_bucket_length:
            raise ConfigError(
                f"data.tokens_per_batch={self.data.tokens_per_batch} cannot hold even "
                f"data.batch_multiple={self.data.batch_multiple} sentences of the shortest bucket"
            )

        if self.optim.cooldown_steps > self.train.num_steps:
            raise ConfigError(
                f"optim.cooldown_steps={self.optim.cooldown_steps} is longer than the run "
                f"(train.num_steps={self.train.num_steps})"
            )
        self._check_word_classes()
        if self.train.f1_every_steps and self.data.source != "treebank":
            raise ConfigError(
                f"train.f1_every_steps={self.train.f1_every_steps} scores parses: it needs a "
                f"parsing run (data.source='treebank', now {self.data.source!r}); a "
                "translation run has train.bleu_every_steps"
            )

    def _check_word_classes(self) -> None:
        """Words are one class only where the target's leaves are the input's words."""
        data = self.data
        if self.train.word_leaves_as_one_class and (
            data.source != "treebank" or data.treebank_leaves != "words"
        ):
            raise ConfigError(
                "train.word_leaves_as_one_class needs a parsing target whose leaves are the "
                'input\'s words: data.source="treebank" and data.treebank_leaves="words" '
                f"(now {data.source!r} and {data.treebank_leaves!r})"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)}


def section_types() -> dict[str, type]:
    """Section name → its typed dataclass, in Experiment's order: the one sections table."""
    hints = typing.get_type_hints(Experiment)
    return {field.name: hints[field.name] for field in dataclasses.fields(Experiment)}


def _to_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
