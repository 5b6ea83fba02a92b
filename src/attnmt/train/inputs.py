"""What a training run reads, prepared once in its workdir: the config and vocabulary
written (by process 0, the others waiting), the tokenized splits, the batch plan and the
bucket shapes that follow from it, the evaluation split, the BLEU sentences and a parsing
run's gold trees."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from attnmt.config.experiment import Experiment
from attnmt.data.batching import bucket_shapes
from attnmt.data.parsing import treebank_trees
from attnmt.data.pipeline import BatchIterator, FilterStats, TokenizedCorpus
from attnmt.data.prepare import (
    ensure_vocab,
    iter_split,
    iter_training_pairs,
    tokenized_split,
    vocab_path,
)
from attnmt.data.sources import multi30k_recorded_dir
from attnmt.data.subword_sampling import EpochCorpora
from attnmt.data.token_cache import Processes
from attnmt.data.tokenizer import Tokenizer
from attnmt.data.treebank import Tree
from attnmt.errors import ConfigError, DataError
from attnmt.parallel.batch_plan import BatchPlan, plan_batches
from attnmt.parallel.mesh import DATA, FSDP
from attnmt.storage import Path

log = logging.getLogger("attnmt.train")


@dataclasses.dataclass(frozen=True)
class TrainInputs:
    workdir: Path
    tokenizer: Tokenizer
    train_batches: BatchIterator  # this process's rows of every update's batch
    plan: BatchPlan  # update shapes, micro-batches per update, their shapes
    evaluation: tuple[TokenizedCorpus, list[tuple[int, int]]] | None  # split, its shapes
    bleu_pairs: list[tuple[str, str]]  # (source, reference); empty: no BLEU in training
    parse_gold: list[Tree] = dataclasses.field(default_factory=list)  # empty: no F1


def with_recorded_data_dir(experiment: Experiment) -> Experiment:
    """Multi30K found through $ATTNMT_MULTI30K_DIR is written into the run's config as an
    absolute data.data_dir, so evaluating the run later needs no variable."""
    if experiment.data.source != "multi30k":
        return experiment
    data = dataclasses.replace(
        experiment.data, data_dir=multi30k_recorded_dir(experiment.data.data_dir)
    )
    return dataclasses.replace(experiment, data=data)


def _run_files(experiment: Experiment, workdir: Path) -> Tokenizer:
    """config.json and the vocabulary in `workdir`: written by process 0, read by all."""
    workdir.mkdir(parents=True, exist_ok=True)
    data, vocab_size = experiment.data, experiment.model.vocab_size
    start = experiment.model.decoder_start_id
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(json.dumps(experiment.to_dict(), indent=2))
        ensure_vocab(data, vocab_size, workdir, start)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("attnmt vocabulary ready")
    tokenizer = ensure_vocab(data, vocab_size, workdir, start)
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(
            f"the vocabulary at {vocab_path(data, workdir)} has {tokenizer.vocab_size} "
            f"tokens but model.vocab_size is {vocab_size}"
        )
    return tokenizer


def _barrier(name: str) -> None:
    multihost_utils.sync_global_devices(name)


def prepare_inputs(experiment: Experiment, workdir: Path, mesh: Mesh) -> TrainInputs:
    tokenizer = _run_files(experiment, workdir)
    data, train = experiment.data, experiment.train
    vocab_file = vocab_path(data, workdir)
    # Every process tokenizes its shards of each split into the shared cache.
    processes = Processes(jax.process_index(), jax.process_count(), _barrier)
    corpus: TokenizedCorpus | EpochCorpora
    if data.subword_dropout:
        assert isinstance(tokenizer, Tokenizer)  # DataConfig allows only a sentencepiece one
        pairs = list(iter_training_pairs(data, data.train_split))
        corpus = EpochCorpora(
            pairs,
            tokenizer,
            data.max_length,
            data.subword_dropout,
            train.seed,
            target=data.subword_dropout_target,
        )
        stats = corpus.tokenize(0)[1]
        log.info(
            "BPE-dropout %.2f on the %s: each epoch's training split is segmented anew "
            "(epoch 0 below)",
            data.subword_dropout,
            "source and target" if data.subword_dropout_target else "source only",
        )
    else:
        corpus, stats = tokenized_split(
            data, vocab_file, tokenizer, data.train_split, workdir, processes
        )
    log.info("training pairs %s", _usable(experiment, data.train_split, stats))
    plan = batch_plan(experiment, mesh.shape[DATA] * mesh.shape[FSDP], jax.process_count())
    log.info("mesh %s over %d device(s); %s", dict(mesh.shape), mesh.size, plan.describe())
    log.info(
        "bucket shapes (batch, length): %s per update, %s per micro-batch",
        plan.update_shapes,
        plan.micro_shapes,
    )
    shard = {"shard_index": jax.process_index(), "shard_count": jax.process_count()}
    batches = BatchIterator(
        corpus, plan.update_shapes, seed=train.seed, **packing_options(experiment), **shard
    )
    _log_left_out(experiment, data.train_split, batches.corpus)
    evaluation = None
    if train.eval_every_steps and data.eval_split:
        eval_corpus, eval_stats = tokenized_split(
            data, vocab_file, tokenizer, data.eval_split, workdir, processes
        )
        log.info("evaluation pairs %s", _usable(experiment, data.eval_split, eval_stats))
        tokens = data.eval_tokens_per_batch or data.tokens_per_batch // plan.accumulation_steps
        evaluation = (eval_corpus, _shapes(experiment, tokens, plan.batch_shards))
        _log_left_out(experiment, data.eval_split, eval_corpus)
    bleu_pairs: list[tuple[str, str]] = []
    if train.bleu_every_steps and data.eval_split:
        pairs = iter_split(data, data.eval_split, as_trained=False)
        bleu_pairs = list(itertools.islice(pairs, train.bleu_max_sentences or None))
    return TrainInputs(
        workdir, tokenizer, batches, plan, evaluation, bleu_pairs, _parse_gold(experiment)
    )


def _parse_gold(experiment: Experiment) -> list[Tree]:
    """train.f1_every_steps's gold trees: the first f1_max_sentences of the eval split."""
    data, train = experiment.data, experiment.train
    if not train.f1_every_steps or not data.eval_split:  # Experiment checked the source
        return []
    gold = treebank_trees(data.eval_split, data.data_dir, data.treebank_splits)
    return gold[: train.f1_max_sentences or None]


def packing_options(experiment: Experiment) -> dict[str, Any]:
    """BatchIterator's packing arguments for the experiment's data section."""
    data = experiment.data
    return {"pack": data.packed, "pack_source_length": data.pack_source_length}


def _log_left_out(experiment: Experiment, split: str, corpus: TokenizedCorpus) -> None:
    """Says how many pairs of a packed split have a source longer than
    data.pack_source_length: every epoch leaves them out (their targets fit, as
    data.pack_length ≥ data.max_length)."""
    data = experiment.data
    if not data.pack_source_length:
        return
    left_out = int((corpus.src_lengths > data.pack_source_length).sum())
    if left_out:
        log.warning(
            "%s: %d of %d pairs have a source longer than data.pack_source_length=%d tokens "
            "and are left out",
            split,
            left_out,
            len(corpus),
            data.pack_source_length,
        )


def batch_plan(experiment: Experiment, batch_shards: int, processes: int) -> BatchPlan:
    """The update shapes (from the token budget and data.batch_multiple, with batch sizes
    a multiple of the devices: no filler rows without accumulation) and their split into
    micro-batches under train.max_tokens_per_device / train.grad_accum_steps."""
    train = experiment.train
    return plan_batches(
        _shapes(experiment, experiment.data.tokens_per_batch, batch_shards),
        batch_shards,
        processes,
        train.max_tokens_per_device,
        train.grad_accum_steps,
    )


def _shapes(experiment: Experiment, tokens: int, batch_shards: int) -> list[tuple[int, int]]:
    """Length buckets, or the one packed shape, of `tokens` per side."""
    data = experiment.data
    # Every device (and every process) gets the same number of rows.
    multiple = math.lcm(data.batch_multiple, batch_shards)
    if data.packed:
        rows = tokens // data.pack_length // multiple * multiple
        if rows == 0:
            raise ConfigError(
                f"data.tokens_per_batch={tokens} holds no batch of {multiple} rows of "
                f"data.pack_length={data.pack_length} tokens"
            )
        return [(rows, data.pack_length)]
    try:
        return bucket_shapes(
            data.max_length,
            tokens,
            min_length=data.min_bucket_length,
            batch_multiple=multiple,
        )
    except ValueError as error:
        raise ConfigError(f"data.tokens_per_batch / data.max_length: {error}") from None


def _usable(experiment: Experiment, split: str, stats: FilterStats) -> str:
    """A log line for what filtering kept; DataError if it kept nothing."""
    what = (
        f"{split!r}: kept {stats.kept} of {stats.total} pairs ({stats.too_long} longer than "
        f"data.max_length={experiment.data.max_length} tokens, {stats.empty} with an empty side)"
    )
    if stats.kept == 0:
        raise DataError(f"no usable sentence pairs in split {what}")
    return what
