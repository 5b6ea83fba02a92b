"""From a DataConfig to a vocabulary and tokenized, cached corpora (no jax here)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator

from attnmt.config.data import DataConfig
from attnmt.data import sources, token_cache
from attnmt.data.pair_tokenizer import VOCAB_FILE, PairTokenizer
from attnmt.data.pipeline import FilterStats, TokenizedCorpus
from attnmt.data.text_form import TextForm
from attnmt.data.token_cache import ONE_PROCESS, Layout, Processes
from attnmt.data.tokenizer import Tokenizer, train_vocab
from attnmt.storage import Path, as_path

log = logging.getLogger(__name__)


def _source_options(config: DataConfig) -> dict[str, str | None]:
    if config.source == "multi30k":
        return {"data_dir": config.data_dir or None, "download_url": config.download_url or None}
    if config.source == "tfds":
        return {"name": config.tfds_name, "data_dir": config.data_dir or None}
    if config.source == "files":
        return {"src_path": config.src_path, "tgt_path": config.tgt_path}
    return {  # treebank
        "data_dir": config.data_dir,
        "splits": config.treebank_splits,
        "pos": config.treebank_pos,
        "leaves": config.treebank_leaves,
    }


def iter_split(
    config: DataConfig, split: str, *, as_trained: bool = True
) -> Iterator[tuple[str, str]]:
    """One split's (source, target) sentence pairs, streamed where the source allows it
    (attnmt.data.sources.iter_pairs); problems opening it raise here. `as_trained`: in the
    run's data.text_form (what the vocabulary and the token caches see); False: as read
    (what translation takes and scores are computed against)."""
    config.require_source_keys()
    options = _source_options(config)
    pairs = sources.iter_pairs(config.source, split, config.src_lang, config.tgt_lang, **options)
    return TextForm.of(config).pairs(pairs) if as_trained else pairs


def iter_training_pairs(config: DataConfig, split: str) -> Iterator[tuple[str, str]]:
    """`split` as trained on: with data.train_both_directions the training split's pairs,
    then each of them reversed (target, source); any other split as iter_split gives it."""
    pairs = iter_split(config, split)
    if not _both_directions(config, split):
        return pairs
    reversed_pairs = ((tgt, src) for src, tgt in iter_split(config, split))
    return itertools.chain(pairs, reversed_pairs)


def load_split(config: DataConfig, split: str, *, as_trained: bool = True) -> list[tuple[str, str]]:
    """Reads one split's (source, target) sentence pairs from the configured source."""
    return list(iter_split(config, split, as_trained=as_trained))


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
        # Streamed: the sample is drawn as the pairs go by (only treebank corpora, small,
        # are read whole, for their tree symbols).
        pairs: Iterable[tuple[str, str]] = iter_split(config, config.train_split)
        whole_words: list[str] = []
        if config.source == "treebank":
            pairs = list(pairs)
            whole_words = tree_symbols(pairs, config.treebank_leaves)
        train_vocab(
            (text for pair in pairs for text in pair),
            path,
            vocab_size=vocab_size,
            model_type=config.vocab_model_type,
            max_sentences=config.vocab_max_sentences,
            whole_words=whole_words,
        )
    return Tokenizer.load(path)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _both_directions(config: DataConfig, split: str) -> bool:
    return config.train_both_directions and split == config.train_split


def cache_folder(
    config: DataConfig, tokenizer_path: Path, tokenizer: Tokenizer, split: str, workdir: Path
) -> Path:
    """Where a split's token cache lives: under data.cache_dir ("" = <workdir>/data), in a
    folder named by a digest of everything that changes the tokens (source, split,
    languages, treebank options, the text's form, both directions, the vocabulary's bytes,
    max_length, the cache format)."""
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
            *([config.text_form] if config.text_form != "raw" else []),
            split,
            *(["both directions"] if _both_directions(config, split) else []),
            config.max_length,
            token_cache.FORMAT,
            *map(_file_digest, getattr(tokenizer, "files", (tokenizer_path,))),
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = as_path(config.cache_dir, "data.cache_dir") if config.cache_dir else workdir / "data"
    return root / f"{split}-{digest}"


def tokenized_split(
    config: DataConfig,
    tokenizer_path: Path,
    tokenizer: Tokenizer,
    split: str,
    workdir: Path,
    processes: Processes = ONE_PROCESS,
    layout: Layout | None = None,
) -> tuple[TokenizedCorpus, FilterStats]:
    """A split tokenized once into a shared, sharded cache (attnmt.data.token_cache) and
    memory-mapped; every process of the job calls this together, each tokenizing its
    shards. A complete cache of the same key (another run's too) is read, not rewritten.
    `layout` (tests, benchmarks): None cuts shards of data.cache_shard_pairs pairs."""
    folder = cache_folder(config, tokenizer_path, tokenizer, split, workdir)
    return token_cache.load_or_write(
        folder,
        lambda: iter_training_pairs(config, split),
        tokenizer,
        config.max_length,
        key=f"{config.source} {split!r} max_length={config.max_length}",
        processes=processes,
        layout=layout or Layout(pairs_per_shard=config.cache_shard_pairs),
    )
