"""From a DataConfig to a vocabulary and tokenized, cached corpora (no jax here)."""

from __future__ import annotations

import hashlib
import json
import logging

from attnmt.config.data import DataConfig
from attnmt.data import sources
from attnmt.data.pair_tokenizer import VOCAB_FILE, PairTokenizer
from attnmt.data.pipeline import FilterStats, TokenizedCorpus
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.storage import Path, as_path

log = logging.getLogger(__name__)


def load_split(config: DataConfig, split: str) -> list[tuple[str, str]]:
    """Reads one split's (source, target) sentence pairs from the configured source."""
    config.require_source_keys()
    options: dict[str, str] = {}
    if config.source == "multi30k":
        options = {"data_dir": config.data_dir or None, "download_url": config.download_url or None}
    elif config.source == "tfds":
        options = {"name": config.tfds_name, "data_dir": config.data_dir or None}
    elif config.source == "files":
        options = {"src_path": config.src_path, "tgt_path": config.tgt_path}
    elif config.source == "treebank":
        options = {
            "data_dir": config.data_dir,
            "splits": config.treebank_splits,
            "pos": config.treebank_pos,
            "leaves": config.treebank_leaves,
        }
    return list(
        sources.load_pairs(config.source, split, config.src_lang, config.tgt_lang, **options)
    )


def vocab_path(config: DataConfig, workdir: Path) -> Path:
    if config.vocab_path:
        return as_path(config.vocab_path, "data.vocab_path")
    name = VOCAB_FILE if config.vocab_kind == "pair" else "vocab.model"
    return workdir / name


def tree_symbols(pairs: list[tuple[str, str]], leaves: str = "pos") -> list[str]:
    """Every bracket of the linearized trees, and with POS leaves every POS token, each to be
    one piece: a constrained decoder (attnmt.decode.tree_grammar) steps through trees token
    by token. Copied words stay ordinary text, split into pieces as the source's are."""
    tokens = {token for _, tree in pairs for token in tree.split()}
    if leaves == "words":
        tokens = {token for token in tokens if token.startswith(("(", ")"))}
    return sorted(tokens)


def ensure_vocab(
    config: DataConfig, vocab_size: int, workdir: Path, decoder_start_id: int = 0
) -> Tokenizer | PairTokenizer:
    """Loads the shared vocabulary, training it on the training split first if absent (a
    `pair` vocabulary, whose decoder starts on `decoder_start_id`, is only ever loaded)."""
    path = vocab_path(config, workdir)
    if config.vocab_kind == "pair":
        return PairTokenizer(path.parent, decoder_start_id)
    if not path.exists():
        log.info(
            "training a %d-token %s vocabulary at %s", vocab_size, config.vocab_model_type, path
        )
        pairs = load_split(config, config.train_split)
        texts = (text for pair in pairs for text in pair)
        train_vocab(
            texts,
            path,
            vocab_size=vocab_size,
            model_type=config.vocab_model_type,
            max_sentences=config.vocab_max_sentences,
            whole_words=(
                tree_symbols(pairs, config.treebank_leaves) if config.source == "treebank" else ()
            ),
        )
    return Tokenizer.load(path)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def tokenized_split(
    config: DataConfig,
    tokenizer_path: Path,
    tokenizer: Tokenizer,
    split: str,
    workdir: Path,
) -> tuple[TokenizedCorpus, FilterStats]:
    """Tokenizes a split once and caches it in <workdir>/data/, keyed by everything that
    changes the result (source, split, languages, treebank options, vocabulary bytes, max
    length)."""
    key = json.dumps(
        [
            config.source,
            config.tfds_name,
            config.data_dir,
            config.src_path,
            config.tgt_path,
            config.src_lang,
            config.tgt_lang,
            config.treebank_splits,
            config.treebank_pos,
            config.treebank_leaves,
            split,
            config.max_length,
            *map(_file_digest, getattr(tokenizer, "files", (tokenizer_path,))),
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = workdir / "data" / f"{split}-{digest}.npz"
    stats_file = cache.with_suffix(".stats.json")
    if cache.exists() and stats_file.exists():
        stats = FilterStats(**json.loads(stats_file.read_text()))
        return TokenizedCorpus.load(cache), stats
    corpus, stats = TokenizedCorpus.from_pairs(
        load_split(config, split), tokenizer, config.max_length
    )
    corpus.save(cache)
    # Written after the corpus and whole (one object upload, or one small local write): a
    # cache is used only when both are there.
    stats_file.write_text(json.dumps(stats.__dict__))
    return corpus, stats
