"""Shared fixtures: a small synthetic parallel corpus (tests/helpers.py makes it) and a
vocabulary trained on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnmt.data.tokenizer import Tokenizer, train_vocab
from tests.helpers import interleave, make_pairs


@pytest.fixture(scope="session")
def corpus_pairs() -> list[tuple[str, str]]:
    return make_pairs(400, seed=1)


@pytest.fixture(scope="session")
def vocab_path(tmp_path_factory: pytest.TempPathFactory, corpus_pairs) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "sub" / "vocab.model"
    return train_vocab(interleave(corpus_pairs), path, vocab_size=120)


@pytest.fixture(scope="session")
def tokenizer(vocab_path: Path) -> Tokenizer:
    return Tokenizer.load(vocab_path)
