"""Shared fixtures: a small synthetic parallel corpus and a vocabulary trained on it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from attnmt.data.tokenizer import Tokenizer, train_vocab


def _words(text: str) -> list[str]:
    return text.split()


EN_WORDS = _words("a man woman dog cat runs sits on the red blue big small street park ball")
DE_WORDS = _words("ein mann frau hund katze läuft sitzt auf der rote blaue große kleine straße")


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Deterministic pseudo-sentences; words are single-spaced so text survives normalisation."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        k = rng.randint(1, 12)
        en = " ".join(rng.choice(EN_WORDS) for _ in range(k))
        de = " ".join(rng.choice(DE_WORDS) for _ in range(k + rng.randint(-1, 2) or 1))
        pairs.append((en, de))
    return pairs


def interleave(pairs: list[tuple[str, str]]) -> list[str]:
    return [s for pair in pairs for s in pair]


def repo_data_root() -> Path:
    """Where the real (shared) data lives: $ATTNMT_DATA_DIR or <repo>/../shared/data."""
    default = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return Path(os.environ.get("ATTNMT_DATA_DIR", default))


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
